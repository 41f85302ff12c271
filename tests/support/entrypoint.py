"""docker/entrypoint.sh run on the host, with stand-ins for python3 and arcvllm."""

from __future__ import annotations

import subprocess

import pytest

from support import ROOT

ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"


@pytest.fixture
def fake_image(tmp_path):
    """A PATH where python3 and arcvllm only print how they were called."""
    bin_dir, presets = tmp_path / "bin", tmp_path / "presets"
    bin_dir.mkdir()
    presets.mkdir()
    (presets / "tiny-hybrid-cpu.yaml").write_text("name: tiny-hybrid-cpu\n")
    (bin_dir / "python3").write_text(
        f'#!/bin/sh\nif [ "$1" = -c ]; then echo {presets}; else echo "python3 $*"; fi\n'
    )
    (bin_dir / "arcvllm").write_text('#!/bin/sh\necho "arcvllm $*"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)

    def run(*args: str, **env: str) -> str:
        result = subprocess.run(
            ["bash", str(ENTRYPOINT), *args],
            capture_output=True,
            text=True,
            env={
                "PATH": f"{bin_dir}:/usr/bin:/bin",
                "HOME": str(tmp_path),
                "TMPDIR": str(tmp_path / "tmp"),
                "HF_HOME": str(tmp_path / "hf"),
                "VLLM_CACHE_ROOT": str(tmp_path / "vllm"),
                "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
                "TRITON_CACHE_DIR": str(tmp_path / "triton"),
                **env,
            },
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    return run
