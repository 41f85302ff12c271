"""Disk room during a build: what was free before, the lowest while it ran, and after.

Runs on the build host. A hosted runner guarantees 14 GB free and one XPU image peaks near
25 GB, so the release builds one image per job and says, for every build, how much of the
disk it took at its worst (the build cache and the layers come and go: only a watch while
it runs sees the peak), on the file system of the engine's data root.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

GB = 1e9


@dataclass
class Room:
    """Free bytes on one file system: before a build, the lowest seen while it ran, after."""

    path: Path
    before: int
    lowest: int
    after: int = 0
    samples: int = field(default=0)

    @property
    def peak_used(self) -> int:
        """The most the build held at once (bytes): before, less the lowest."""
        return max(0, self.before - self.lowest)

    def line(self, what: str) -> str:
        return (
            f"disk ({self.path}): {self.before / GB:.1f} GB free before {what}, "
            f"{self.lowest / GB:.1f} GB at the lowest (peak use {self.peak_used / GB:.1f} GB), "
            f"{self.after / GB:.1f} GB after"
        )


def free(path: Path) -> int:
    """Free bytes on the file system that holds PATH (its nearest existing parent)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


@contextmanager
def watch(path: Path, every: float = 2.0) -> Iterator[Room]:
    """Sample the free space of PATH's file system every EVERY seconds while the block runs;
    the Room is complete (after, lowest) when the block ends, also when it fails."""
    start = free(path)
    room = Room(path, before=start, lowest=start)
    done = threading.Event()

    def sample() -> None:
        while not done.wait(every):
            room.lowest = min(room.lowest, free(path))
            room.samples += 1

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield room
    finally:
        done.set()
        sampler.join()
        room.after = free(path)
        room.lowest = min(room.lowest, room.after)
