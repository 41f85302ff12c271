"""docker/entrypoint.sh in the XPU image: a render node the server's user cannot open stops
the start in one line (node, GID, the process's groups) before vLLM runs.

The script runs under bash as a non-root user, as in the image (UID 1000): as root the
kernel would open any node. When the tests run as root, `setpriv` drops to UID 1000; the
stand-in /dev/dri then lives in a folder that user can reach (pytest's own are 0700)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import ROOT

ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
UID = 1000  # the image's user (docker/Dockerfile, runtime stage)
RENDER_GID = 4242  # a group the test user is not in unless it is given


@dataclass
class Image:
    """A stand-in for the XPU image: stub python3/arcvllm on PATH, one render node."""

    base: Path

    @property
    def node(self) -> Path:
        return self.base / "dri" / "renderD128"

    def node_access(self, mode: int) -> None:
        if os.geteuid() == 0:
            os.chown(self.node, 0, RENDER_GID)
        self.node.chmod(mode)

    def run(self, *args: str, groups: tuple[int, ...] = (), **env: str):
        as_user: list[str] = []
        if os.geteuid() == 0:
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                pytest.fail("no setpriv (util-linux): the entrypoint must run as a non-root user")
            group_flag = f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups"
            as_user = [setpriv, f"--reuid={UID}", f"--regid={UID}", group_flag]
        return subprocess.run(
            [*as_user, "bash", str(ENTRYPOINT), *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={
                "PATH": f"{self.base / 'bin'}:/usr/bin:/bin",
                "HOME": str(self.base),
                "TMPDIR": str(self.base / "tmp"),
                "HF_HOME": str(self.base / "hf"),
                "VLLM_CACHE_ROOT": str(self.base / "vllm"),
                "TORCHINDUCTOR_CACHE_DIR": str(self.base / "inductor"),
                "TRITON_CACHE_DIR": str(self.base / "triton"),
                "ARCVLLM_DRI_DIR": str(self.base / "dri"),
                **env,
            },
        )


@pytest.fixture
def image() -> Iterator[Image]:
    scratch = ROOT / "build"
    scratch.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch, prefix="entrypoint-") as name:
        base = Path(name)
        (base / "bin").mkdir()
        (base / "presets").mkdir()
        (base / "presets" / "qwen-1xb70.yaml").write_text("name: qwen-1xb70\n")
        (base / "bin" / "python3").write_text(
            f'#!/bin/sh\nif [ "$1" = -c ]; then echo {base}/presets; else echo "python3 $*"; fi\n'
        )
        (base / "bin" / "arcvllm").write_text('#!/bin/sh\necho "arcvllm $*"\n')
        (base / "dri").mkdir()
        (base / "dri" / "renderD128").write_text("")
        for path in (base, *base.rglob("*")):
            path.chmod(0o755)
        if os.geteuid() == 0 and not os.access(ENTRYPOINT, os.R_OK, effective_ids=False):
            pytest.fail(f"{ENTRYPOINT} is not readable by UID {UID}")
        yield Image(base)


def expected_groups(groups: tuple[int, ...] = ()) -> str:
    if os.geteuid() == 0:
        return " ".join(map(str, (UID, *groups)))
    return subprocess.run(["id", "-G"], capture_output=True, text=True).stdout.strip()


def test_an_xpu_start_with_a_node_it_cannot_open_is_one_line_and_no_vllm(image):
    image.node_access(0o000)
    gid = image.node.stat().st_gid
    for args in (("--model", "/models/m"), ("qwen-1xb70",)):  # vLLM's args, or a preset
        done = image.run(*args, VLLM_TARGET_DEVICE="xpu")
        assert done.returncode == 3, done.stderr
        assert done.stdout == "" and done.stderr.count("\n") == 1
        assert done.stderr.startswith(f"arcvllm: cannot open {image.node} (GID {gid}) ")
        assert f"with groups {expected_groups()}:" in done.stderr
        assert f"give the container GID {gid} (compose: RENDER_GID={gid};" in done.stderr


def test_an_xpu_start_in_the_nodes_group_serves(image):
    image.node_access(0o660 if os.geteuid() == 0 else 0o600)
    done = image.run("--model", "/models/m", groups=(RENDER_GID,), VLLM_TARGET_DEVICE="xpu")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "python3 -m vllm.entrypoints.openai.api_server --model /models/m"


def test_the_cpu_image_and_other_commands_do_not_need_the_node(image):
    """The CPU flavour serves without a GPU; `arcvllm doctor` must run to diagnose it."""
    image.node_access(0o000)
    assert image.run("--model", "/models/m").returncode == 0
    done = image.run("arcvllm", "doctor", VLLM_TARGET_DEVICE="xpu")
    assert done.returncode == 0 and done.stdout.strip() == "arcvllm doctor"


def test_an_xpu_host_without_render_nodes_is_left_to_vllm_and_doctor(image):
    image.node.unlink()
    done = image.run("--model", "/models/m", VLLM_TARGET_DEVICE="xpu")
    assert done.returncode == 0, done.stderr
