"""How compose is run: the one compose command and the argv of a project.

A project is its name, the settings file (compose's `--env-file`, and the containers'
environment through `ENV_FILE`, which compose resolves against docker/: hence always an
absolute path), its compose files, its profiles and what compose interpolates beyond the
caller's environment (IMAGE, PORT, ...). `make up`'s single server, the smoke test's own
project and `arcvllm scale`'s replicas are each one; the argv is built here only, as a pure
function, and run here only. Runs on the operator's host, next to the checkout (the
compose files are not part of the wheel).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from arcvllm.docker import docker_binary
from arcvllm.errors import Unavailable
from arcvllm.paths import checkout_root

# The single server's service of each flavour: compose.yaml's `vllm` (XPU) or the `cpu`
# profile's `vllm-cpu`; the gateway goes beside either.
SERVICES = {"xpu": "vllm", "cpu": "vllm-cpu"}
GATEWAY = "gateway"


def compose_command() -> list[str]:
    """Compose v2, the docker CLI's plugin (`docker compose`); $COMPOSE overrides it.

    (docker-compose 1.x is past end of life and fails to recreate containers on current
    engines: docker/compose#11742.)"""
    if override := os.environ.get("COMPOSE"):
        return shlex.split(override)
    return [docker_binary(), "compose"]


def docker_dir(needs: str = "compose.yaml") -> Path:
    """The checkout's docker/, holding NEEDS (compose files are not part of the wheel)."""
    here = checkout_root() / "docker"
    if not (here / needs).is_file():
        raise Unavailable(f"no {here / needs}: run this from a checkout of arcvllm")
    return here


def gpus_file() -> Path:
    """Where `arcvllm gpus --compose` writes the B70s of this host for compose.yaml's `vllm`
    by default (the checkout's build/gpus.yaml)."""
    return checkout_root() / "build" / "gpus.yaml"


@dataclass(frozen=True)
class Project:
    """One compose project: name, settings file, compose files, profiles, and ENV, what
    compose interpolates over the caller's environment."""

    name: str
    env_file: Path
    files: tuple[Path, ...]
    profiles: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    def argv(self, *args: str, profiles: Sequence[str] = ()) -> list[str]:
        """The compose command line of ARGS (`up -d vllm gateway`), PROFILES added."""
        cmd = [*compose_command(), "-p", self.name, "--env-file", str(self.env_file)]
        for path in self.files:
            cmd += ["-f", str(path)]
        for profile in (*self.profiles, *profiles):
            cmd += ["--profile", profile]
        return [*cmd, *args]

    def variables(self) -> dict[str, str]:
        """What this project sets in compose's environment: ENV_FILE first."""
        return {"ENV_FILE": str(self.env_file), **self.env}

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment compose runs with: BASE (the caller's), this project's over it."""
        return {**(os.environ if base is None else base), **self.variables()}

    def shell(self, *args: str, profiles: Sequence[str] = ()) -> str:
        """The command as one shell line, its variables in front: what `--dry-run` prints
        and what runs a compose command through a shell (the field report, a log command)."""
        assigned = [f"{k}={shlex.quote(v)}" for k, v in self.variables().items()]
        return " ".join([*assigned, shlex.join(self.argv(*args, profiles=profiles))])

    def run(
        self,
        *args: str,
        profiles: Sequence[str] = (),
        timeout: float | None = 600,
        capture: bool = True,
    ) -> subprocess.CompletedProcess:
        """Run compose ARGS; CAPTURE=False passes its output through (up, logs -f)."""
        command = self.argv(*args, profiles=profiles)
        try:
            return subprocess.run(
                command,
                capture_output=capture,
                text=True,
                timeout=timeout,
                env=self.environ(),
            )
        except FileNotFoundError:
            raise Unavailable(f"no compose tool: {command[0]} not found (make tools)") from None

    def check(self, *args: str, profiles: Sequence[str] = (), timeout: float | None = 1800):
        """Run compose ARGS, or one line naming compose's last word on why it failed."""
        result = self.run(*args, profiles=profiles, timeout=timeout)
        if result.returncode != 0:
            lines = result.stderr.strip().splitlines() or ["(no output)"]
            raise Unavailable(f"compose {args[0]} failed: {lines[-1]}")
        return result

    def up(self, *services: str, profiles: Sequence[str] = ()) -> None:
        """`compose up -d SERVICES`, waiting for nothing (the callers wait on health)."""
        self.check("up", "-d", *services, profiles=profiles)

    def down(self, volumes: bool = False, profiles: Sequence[str] = ()):
        """Stop and remove the containers; the named volumes too only with VOLUMES.

        No `-t`: each service's stop_grace_period (longer than its server's drain) holds.
        """
        flags = ("-v",) if volumes else ()
        return self.run("down", *flags, "--remove-orphans", profiles=profiles)

    def stop(self, *services: str, profiles: Sequence[str] = ()) -> None:
        """`compose stop SERVICE...`: they stay stopped (restart: unless-stopped)."""
        self.check("stop", *services, profiles=profiles, timeout=600)

    def logs(self, service: str) -> str:
        """SERVICE's whole log, stdout and stderr as compose prints them."""
        done = self.run("logs", "--no-color", service, timeout=120)
        return done.stdout + done.stderr


def server(
    name: str,
    env_file: Path,
    flavor: str,
    env: Mapping[str, str],
    gpus: Path | None = None,
) -> Project:
    """The single server of compose.yaml: the `cpu` profile, or the XPU service with the
    file of this host's B70s after compose.yaml (GPUS, by default gpus_file())."""
    files = (docker_dir() / "compose.yaml",)
    if flavor == "cpu":
        return Project(name, env_file, files, ("cpu",), env)
    return Project(name, env_file, (*files, gpus or gpus_file()), (), env)
