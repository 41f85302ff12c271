"""The Docker client every command runs: one choice, made here."""

from __future__ import annotations

import os
from pathlib import Path


def docker_binary() -> str:
    """$DOCKER, else Debian's client (buildx and compose plugins), else `docker` on PATH."""
    if env := os.environ.get("DOCKER"):
        return env
    return "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"
