"""arcvllm/operate/gpus.py: the single server gets the host's Arc Pro B70s and nothing else, and
each GPU's Level Zero index is named.

The fake hosts are test_replicas.py's (sysfs, /dev/dri and its by-path links); the file is
validated, merged over docker/compose.yaml, by the compose tool itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from support import ROOT
from support.compose import compose_binary
from support.hosts import B70, IGPU, fake_host

from arcvllm.operate import gpus, replicas

COMPOSE = ROOT / "docker" / "compose.yaml"
IGPU_FIRST = [
    ("0000:00:02.0", IGPU, "renderD128"),
    ("0000:03:00.0", B70, "renderD129"),
    ("0000:04:00.0", B70, "renderD130"),
]


def server_config(*files, env=None) -> dict:
    args = [*compose_binary(), "--env-file", str(ROOT / "docker" / "arcvllm.env")]
    for f in (COMPOSE, *files):
        args += ["-f", str(f)]
    done = subprocess.run(
        [*args, "config"], capture_output=True, text=True, timeout=120,
        env={"PATH": os.environ["PATH"], "RENDER_GID": "992", **(env or {})},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)["services"]["vllm"]


def devices(service: dict) -> list[str]:
    return [
        d if isinstance(d, str) else f"{d['source']}:{d['target']}"
        for d in service.get("devices", [])
    ]


def mounts(service: dict) -> dict[str, str]:
    out = {}
    for v in service.get("volumes", []):
        source, target = (v.split(":")[:2]) if isinstance(v, str) else (v["source"], v["target"])
        out[target] = source
    return out


@pytest.mark.compose
def test_compose_alone_gives_the_server_no_gpu_but_a_placeholder_naming_the_command():
    """Never all of /dev/dri (an iGPU would be Level Zero device 0): without the GPU file
    the engine refuses the placeholder device, whose name says what writes the file."""
    service = server_config()
    assert devices(service) == [f"{replicas.PLACEHOLDER}:{replicas.PLACEHOLDER}"]
    assert "arcvllm-gpus-compose" in replicas.PLACEHOLDER
    assert not os.path.exists(replicas.PLACEHOLDER)
    assert "/dev/dri/by-path" not in mounts(service)


@pytest.mark.compose
def test_the_gpu_file_gives_the_server_every_b70_and_not_the_igpu(tmp_path):
    host = fake_host(tmp_path, IGPU_FIRST)
    out = tmp_path / "state" / "gpus.yaml"
    cards = gpus.compose(host, 1, out)
    assert [c.path for c in cards] == ["/dev/dri/renderD129", "/dev/dri/renderD130"]
    service = server_config(out)
    assert devices(service) == [f"/dev/dri/renderD{n}:/dev/dri/renderD{n}" for n in (129, 130)]
    folder = mounts(service)["/dev/dri/by-path"]
    assert folder == str(tmp_path / "state" / "by-path" / "vllm")
    assert sorted(
        (p.name, os.readlink(p)) for p in (tmp_path / "state/by-path/vllm").iterdir()
    ) == [
        ("pci-0000:03:00.0-render", "../renderD129"),
        ("pci-0000:04:00.0-render", "../renderD130"),
    ]
    assert [str(g) for g in service["group_add"]] == ["992"]
    assert service["labels"]["org.arcvllm.gpu.slots"] == "0000:03:00.0 0000:04:00.0"


@pytest.mark.compose
def test_a_gpu_file_without_override_would_keep_the_placeholder(tmp_path):
    """The sibling: compose appends a later file's devices, so the file must replace them."""
    out = tmp_path / "gpus.yaml"
    gpus.compose(fake_host(tmp_path, IGPU_FIRST), 1, out)
    out.write_text(out.read_text().replace("devices: !override", "devices:"))
    assert devices(server_config(out))[0].startswith(replicas.PLACEHOLDER)


def run_gpus(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "arcvllm", "gpus", *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip


def test_the_table_names_each_gpus_level_zero_index_and_its_index_in_the_server(tmp_path):
    host = fake_host(tmp_path, IGPU_FIRST)
    done = run_gpus("--root", str(host.root), "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["gpus"]
    assert [(r["level_zero"], r["slot"], r["name"], r["server"]) for r in rows] == [
        (0, "0000:00:02.0", "Intel GPU", None),
        (1, "0000:03:00.0", "Arc Pro B70", 0),
        (2, "0000:04:00.0", "Arc Pro B70", 1),
    ]
    text = run_gpus("--root", str(host.root)).stdout.splitlines()
    assert text[0].split() == ["LEVEL", "ZERO", "SLOT", "GPU", "RENDER", "GID", "SERVER"]
    assert text[1].split()[:2] == ["0", "0000:00:02.0"] and text[1].split()[-1] == "-"


def test_compose_refuses_a_host_with_fewer_b70s_than_the_preset_in_one_line(tmp_path):
    host = fake_host(tmp_path, IGPU_FIRST[:2])
    out = tmp_path / "gpus.yaml"
    done = run_gpus(
        "--root", str(host.root), "--compose", str(out), "--preset", "qwen3.6-35b-a3b-w4a16-2xb70"
    )
    assert done.returncode == 3
    assert done.stderr.strip() == (
        "arcvllm: the preset needs 2 Arc Pro B70(s); this host has 1 with a render node "
        "(`arcvllm doctor` says more)"
    )
    assert not out.exists()
    done = run_gpus("--root", str(host.root), "--compose", str(out))
    assert done.returncode == 0, done.stderr
    assert "/dev/dri/renderD129:/dev/dri/renderD129" in out.read_text()
    assert "renderD128" not in out.read_text()
