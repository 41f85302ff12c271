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


def patched_files(patch: Path) -> list[str]:
    """The files a unified diff changes, relative to its -p1 root (vllm/...)."""
    return [
        line.removeprefix("+++ b/").split("\t")[0]
        for line in patch.read_text().splitlines()
        if line.startswith("+++ b/")
    ]


def make_overlay(python: Path, dest: Path, patches: list[Path]) -> Path:
    """A private vllm package (hard links of the venv's), with PATCHES applied.

    GNU patch writes a new file and renames it over the link, so the venv's files keep
    their content; this checks that too, for every file a patch changes.
    """
    src = site_packages(python)
    dest.mkdir(parents=True)
    subprocess.run(["cp", "-al", str(src / "vllm"), str(dest / "vllm")], check=True)
    targets = sorted({name for patch in patches for name in patched_files(patch)})
    before = {name: (src / name).read_bytes() for name in targets}
    for name in targets:
        path = dest / name
        for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
            pyc.unlink()
    for patch in patches:
        subprocess.run(
            ["patch", "-p1", "--fuzz=0", "--no-backup-if-mismatch", "-i", str(patch)],
            cwd=dest,
            check=True,
            capture_output=True,
        )
    for name in targets:
        assert (src / name).read_bytes() == before[name], name
        assert (dest / name).stat().st_ino != (src / name).stat().st_ino, name
    return dest
