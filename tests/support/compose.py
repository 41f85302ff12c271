"""The compose tool the project uses, and `compose config` of docker/compose.yaml."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from support import ROOT

COMPOSE_FILE = ROOT / "docker" / "compose.yaml"


ENV_FILE = ROOT / "docker" / "arcvllm.env"


def compose_binary() -> list[str]:
    """The compose the project uses (arcvllm.operate.compose: the v2 plugin); a failure when it does
    not answer (scripts/ci/engine.sh up installs it)."""
    from arcvllm.operate.compose import compose_command

    command = compose_command()
    if subprocess.run([*command, "version"], capture_output=True).returncode != 0:
        pytest.fail("no compose v2 plugin: scripts/ci/engine.sh up installs it")
    return command


def config(
    compose_file: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    env_file: Path = ENV_FILE,
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*compose_binary(), "--env-file", str(env_file), "-f", str(compose_file), *extra, "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", **(env or {})},
    )
