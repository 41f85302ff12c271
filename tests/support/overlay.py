"""A private copy of a test venv's vllm package (hard links) with patches applied."""

from __future__ import annotations

import subprocess
from pathlib import Path


def site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def make_overlay(python: Path, dest: Path, patches: list[Path]) -> Path:
    """A private vllm package (hard links of the venv's), with PATCHES applied.

    GNU patch writes a new file and renames it over the link, so the venv's files keep
    their content; the test checks that too.
    """
    src = site_packages(python) / "vllm"
    dest.mkdir(parents=True)
    subprocess.run(["cp", "-al", str(src), str(dest / "vllm")], check=True)
    target = dest / "vllm" / "v1" / "worker" / "mamba_utils.py"
    for pyc in (target.parent / "__pycache__").glob("mamba_utils.*.pyc"):
        pyc.unlink()
    before = (src / "v1" / "worker" / "mamba_utils.py").read_bytes()
    for patch in patches:
        subprocess.run(
            ["patch", "-p1", "--fuzz=0", "--no-backup-if-mismatch", "-i", str(patch)],
            cwd=dest,
            check=True,
            capture_output=True,
        )
    assert (src / "v1" / "worker" / "mamba_utils.py").read_bytes() == before
    assert target.stat().st_ino != (src / "v1" / "worker" / "mamba_utils.py").stat().st_ino
    return dest
