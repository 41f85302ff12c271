"""The Docker engine the image tests run against, the CPU image of this tree, and CI's XPU
rehearsal images."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from arcvllm.docker import docker_binary
from support import ROOT

IMAGE = os.environ.get("ARCVLLM_TEST_IMAGE", "arcvllm:cpu")


ENGINE_SOCKET = "/run/arcvllm-docker/docker.sock"


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [docker_client(), *args], capture_output=True, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: {result.stderr.strip()}")
    return result


def docker_client() -> str:
    return docker_binary()


@pytest.fixture(scope="session")
def engine() -> None:
    if "DOCKER_HOST" not in os.environ and Path(ENGINE_SOCKET).exists():
        os.environ["DOCKER_HOST"] = f"unix://{ENGINE_SOCKET}"
    result = subprocess.run([docker_client(), "version"], capture_output=True, timeout=30)
    if result.returncode != 0:
        pytest.fail("no Docker engine answers: run scripts/ci/engine.sh up (or make test)")


@pytest.fixture(scope="session")
def cpu_image(engine) -> str:
    """The CPU image of this tree (make build: a cache hit when nothing changed)."""
    if os.environ.get("ARCVLLM_TEST_IMAGE"):
        return IMAGE
    result = subprocess.run(
        ["make", "-s", "build", "STACK=cpu", f"IMAGE={IMAGE}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return IMAGE


def xpu_ci_image(stack: str, part: str = "") -> str:
    """CI's rehearsal of the XPU build of STACK (make build-xpu-ci, run by .ci/run):
    arcvllm:STACK-ci is its `vllm` stage, arcvllm:STACK-ci-user its runtime's user."""
    image = f"arcvllm:{stack}-ci{part}"
    if docker("image", "inspect", image, check=False).returncode != 0:
        pytest.fail(f"{image} not built: make build-xpu-ci STACK={stack} (.ci/run does)")
    return image
