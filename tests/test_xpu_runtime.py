"""The XPU runtime's environment, read from the Dockerfile, the compose files, the Kubernetes
manifest and the pinned wheels: where the GPU compilers cache, where oneCCL finds
libfabric, and what the build may take from PyTorch's XPU index.

No Intel GPU here: each test proves what the files and the pinned wheels say (the image's
environment as `arcvllm stack audit` reads it, with each stack's own build args)."""

from __future__ import annotations

import os
import subprocess
from functools import cache
from pathlib import PurePosixPath

import pytest
import yaml
from conftest import ROOT

from arcvllm import audit, stack

XPU_STACKS = ["xpu-0.20", "xpu-0.23", "xpu-0.33"]
INSTALLER_STACKS = ["xpu-0.20", "xpu-0.23"]  # ONECCL: installer
DOCKERFILE = ROOT / "docker" / "Dockerfile"
COMPOSE = ROOT / "docker" / "compose.yaml"
SCALE = ROOT / "docker" / "compose.scale.yaml"
STATEFULSET = ROOT / "deploy" / "kubernetes" / "base" / "vllm-statefulset.yaml"


@cache
def image_env(name: str) -> dict[str, str]:
    """The XPU runtime image's environment for stack NAME (ENV of its stage chain)."""
    args = stack.get(name, flavor="xpu").build_args()
    facts = audit.our_facts(DOCKERFILE.read_text(), args, ROOT)
    return {k[4:]: v for k, v in facts.values.items() if k.startswith("env:")}


def under(path: str, mount: str) -> bool:
    return PurePosixPath(path).is_relative_to(PurePosixPath(mount))


# ---- the GPU compilers' caches (issue 20, item 12) ----------------------------------------

GPU_CACHES = {"NEO_CACHE_DIR": "NEO_CACHE_PERSISTENT", "SYCL_CACHE_DIR": "SYCL_CACHE_PERSISTENT"}


def compose_volumes(service: dict) -> dict[str, str]:
    """Target -> named volume of SERVICE's volumes (bind mounts left out)."""
    out = {}
    for volume in service.get("volumes") or []:
        source, _, rest = volume.partition(":")
        if source and not source.startswith(("/", ".", "$")):
            out[rest.split(":")[0]] = source
    return out


def xpu_servers() -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    """Every place the XPU server runs: its environment over the image's, and the target
    of each persistent volume it mounts -> the volume."""
    single = yaml.safe_load(COMPOSE.read_text())["services"]["vllm"]
    replica = yaml.safe_load(SCALE.read_text())["x-xpu-replica"]
    pod = yaml.safe_load(STATEFULSET.read_text())["spec"]
    container = next(c for c in pod["template"]["spec"]["containers"] if c["name"] == "vllm")
    claims = {t["metadata"]["name"] for t in pod["volumeClaimTemplates"]}
    return {
        "compose vllm": (single.get("environment") or {}, compose_volumes(single)),
        "compose.scale x-xpu-replica": (replica.get("environment") or {}, compose_volumes(replica)),
        "kubernetes vllm": (
            {e["name"]: e.get("value", "") for e in container.get("env") or []},
            {m["mountPath"]: m["name"] for m in container["volumeMounts"] if m["name"] in claims},
        ),
    }


@pytest.mark.parametrize("name", XPU_STACKS)
def test_the_gpu_compilers_caches_are_persistent_and_on_the_compile_cache_volume(name):
    """compute-runtime (NEO) and SYCL keep their compiled kernels on the volume every XPU
    server mounts: a restart, `make down && make up` or a new image recompiles nothing."""
    env = image_env(name)
    settings = (ROOT / "docker" / "arcvllm.env").read_text().splitlines()
    for where, (service_env, volumes) in xpu_servers().items():
        merged = {**env, **{k: str(v) for k, v in service_env.items()}}
        for directory, switch in GPU_CACHES.items():
            assert merged.get(switch) == "1", (where, switch)
            path = merged.get(directory, "")
            mounts = [t for t in volumes if path and under(path, t)]
            assert mounts, f"{where}: {directory}={path or 'unset'} is on no persistent volume"
            assert not any(line.startswith((f"{directory}=", f"{switch}=")) for line in settings)
    # Compose's compile cache, not the anonymous volume of the image's cache root.
    compose_volumes_of_vllm = xpu_servers()["compose vllm"][1]
    assert compose_volumes_of_vllm["/var/cache/arcvllm/compile"] == "compile-cache"
    assert all(under(env[d], "/var/cache/arcvllm/compile") for d in GPU_CACHES)


def test_the_entrypoint_makes_the_gpu_cache_folders_compute_runtime_needs(tmp_path):
    """compute-runtime turns its cache off when NEO_CACHE_DIR does not exist
    (default_cache_config.cpp: pathExists): a fresh volume or claim has no such folder."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "NEO_CACHE_DIR": str(tmp_path / "vol/neo"),
        "SYCL_CACHE_DIR": str(tmp_path / "vol/sycl"),
        "TMPDIR": str(tmp_path / "tmp"),
        "HF_HOME": str(tmp_path / "hf"),
    }
    done = subprocess.run(
        ["bash", str(ROOT / "docker" / "entrypoint.sh"), "true"], env=env, capture_output=True
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "vol/neo").is_dir() and (tmp_path / "vol/sycl").is_dir()
