"""N replicas behind vLLM's router, started so that a failure is one line and leaves nothing.

`arcvllm scale up` runs docker/compose.scale.yaml's profiles: refuses more replicas than
the host has B70 render nodes before anything starts, waits for every replica's own
healthcheck and then for the router's /readiness, and on any failure names it in one line
and takes the whole project down again. `arcvllm scale down` stops it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from arcvllm import cli
from arcvllm.client import Client, WaitTimeout, wait_until
from arcvllm.errors import ArcvllmError
from arcvllm.settings import load as load_settings
from arcvllm.settings import render_node_gids

PROJECT = "arcvllm-scale"
REPLICA_COUNTS = (2, 4)  # the profiles compose.scale.yaml has: scale, scale + scale-4


class NotEnoughGpus(ArcvllmError):
    exit_code = 3


class BadScale(ArcvllmError):
    """A replica count compose.scale.yaml has no profile for: the command was used wrongly."""

    exit_code = 2


def docker_dir() -> Path:
    """The checkout's docker/ (compose files are not part of the wheel)."""
    here = Path(__file__).resolve().parent.parent / "docker"
    if not (here / "compose.scale.yaml").is_file():
        raise ArcvllmError(
            f"no {here / 'compose.scale.yaml'}: run arcvllm scale from a checkout", 3
        )
    return here


@dataclass(frozen=True)
class Layout:
    """What `up` starts: compose profiles, the services to name, the replicas to wait for."""

    profiles: tuple[str, ...]
    services: tuple[str, ...]
    replicas: tuple[str, ...]

    def settings(self) -> dict[str, str]:
        """What the router and Prometheus must be told for N = 4 (compose's defaults are 2)."""
        if len(self.replicas) != 4:
            return {}
        return {
            "ROUTER_WORKER_URLS": " ".join(f"http://{r}:8000" for r in self.replicas),
            "PROMETHEUS_TARGETS": "replicas-4.yml",
        }


def layout(replicas: int, cpu: bool, monitoring: bool) -> Layout:
    if cpu and replicas != 2:
        raise BadScale("the CPU scale-out profile has 2 replicas (cpu-scale)")
    if replicas not in REPLICA_COUNTS:
        raise BadScale(f"--replicas must be one of {REPLICA_COUNTS} (compose.scale.yaml)")
    if cpu:
        profiles, services = ("cpu-scale",), ("router-cpu",)
        names = ("vllm-cpu-0", "vllm-cpu-1")
    else:
        profiles = ("scale",) if replicas == 2 else ("scale", "scale-4")
        names = tuple(f"vllm-{i}" for i in range(replicas))
        services = ("router", *names[2:])
    if monitoring:
        profiles, services = (*profiles, "monitoring"), (*services, "prometheus", "alertmanager")
    return Layout(profiles, services, names)


def render_nodes(dev_root: Path = Path("/")) -> list[Path]:
    return sorted((dev_root / "dev" / "dri").glob("renderD*"))


def check_gpus(replicas: int, dev_root: Path = Path("/")) -> None:
    """One B70 per replica: refuse before anything starts."""
    nodes = render_nodes(dev_root)
    if replicas > len(nodes):
        raise NotEnoughGpus(
            f"{replicas} replicas need {replicas} GPUs; this host has {len(nodes)} "
            f"render node{'s' * (len(nodes) != 1)} ({dev_root / 'dev/dri/renderD*'})"
        )


def compose_command() -> list[str]:
    """`docker compose` when the plugin answers, docker-compose (1.29) otherwise."""
    if override := os.environ.get("COMPOSE"):
        return shlex.split(override)
    docker = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"
    try:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return [docker, "compose"]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return ["docker-compose"]


@dataclass
class Deployment:
    """One compose project of compose.yaml + compose.scale.yaml."""

    env_file: Path
    project: str = PROJECT
    settings: dict[str, str] = field(default_factory=dict)  # the operator's values win

    def command(self, profiles: tuple[str, ...] = ()) -> list[str]:
        files = docker_dir()
        cmd = [*compose_command(), "-p", self.project, "--env-file", str(self.env_file)]
        cmd += ["-f", str(files / "compose.yaml"), "-f", str(files / "compose.scale.yaml")]
        for profile in profiles:
            cmd += ["--profile", profile]
        return cmd

    def env(self) -> dict[str, str]:
        return {**self.settings, **os.environ, "ENV_FILE": str(self.env_file)}

    def run(self, *args: str, profiles: tuple[str, ...] = (), timeout: float = 600):
        command = [*self.command(profiles), *args]
        try:
            return subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, env=self.env()
            )
        except FileNotFoundError:
            raise ArcvllmError(f"no compose tool: {command[0]} not found (make tools)", 3) from None

    def down(self, profiles: tuple[str, ...]) -> subprocess.CompletedProcess:
        return self.run("down", "-v", "--remove-orphans", "-t", "20", profiles=profiles)

    def state(self, service: str, profiles: tuple[str, ...]) -> dict:
        """Docker's State of SERVICE's container ({} when it has none)."""
        cid = self.run("ps", "-q", service, profiles=profiles, timeout=60).stdout.strip()
        if not cid:
            return {}
        out = subprocess.run(
            ["docker", "inspect", "--format", "{{json .State}}", cid],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return json.loads(out.stdout) if out.returncode == 0 else {}


def wait_replicas(dep: Deployment, p: Layout, timeout: float, interval: float = 3.0) -> None:
    """Every replica healthy by its own healthcheck, or the first one that is not, named."""
    waiting = list(p.replicas)

    def all_healthy() -> bool:
        for name in list(waiting):
            state = dep.state(name, p.profiles)
            health = (state.get("Health") or {}).get("Status")
            if health == "healthy":
                waiting.remove(name)
            elif state and (state.get("Restarting") or not state.get("Running", False)):
                # (restart: unless-stopped brings an exited replica back: a restart is an exit)
                raise ArcvllmError(
                    f"replica {name} never became healthy: it exited "
                    f"(code {state.get('ExitCode')}); see `docker logs` of it",
                    3,
                )
        return not waiting

    try:
        wait_until(all_healthy, timeout, interval, "every replica healthy")
    except WaitTimeout as exc:
        raise ArcvllmError(
            f"replica {waiting[0]} never became healthy within {timeout:.0f} s", 3
        ) from exc


def http_status(url: str) -> int | None:
    """The HTTP status URL answers a GET with (None: no answer)."""
    import httpx

    try:
        return Client(url, timeout=5).get("").status_code
    except httpx.HTTPError:
        return None


def status_inside(dep: Deployment, service: str, profiles: tuple[str, ...]):
    """A status function like http_status, run in SERVICE's container (the router publishes
    no port: the gateway in front serves none of its paths)."""
    code = (
        "import sys, urllib.request, urllib.error\n"
        "try:\n    print(urllib.request.urlopen(sys.argv[1], timeout=5).status)\n"
        "except urllib.error.HTTPError as e:\n    print(e.code)\n"
        "except Exception:\n    print(0)\n"
    )

    def status(url: str) -> int | None:
        done = dep.run("exec", "-T", service, "python3", "-c", code, url, profiles=profiles)
        answer = done.stdout.strip()
        return int(answer) if done.returncode == 0 and answer.isdigit() and answer != "0" else None

    return status


def wait_router(url: str, timeout: float, interval: float = 2.0, status=http_status) -> None:
    """The router's /readiness answers 200 once it has a healthy worker. STATUS asks it."""
    last = "no answer"

    def ready() -> bool:
        nonlocal last
        code = status(f"{url}/readiness")
        last = "no answer" if code is None else f"HTTP {code}"
        return code == 200

    try:
        wait_until(ready, timeout, interval, "a healthy worker behind the router")
    except WaitTimeout as exc:
        raise ArcvllmError(
            f"the router at {url} has no healthy worker after {timeout:.0f} s (/readiness: {last})",
            3,
        ) from exc


def check_alert_receiver(env_file: Path) -> None:
    """--monitoring starts Alertmanager, which refuses to start without a receiver: say so
    before anything starts (compose reads ALERT_WEBHOOK_URL from the shell or the file)."""
    if os.environ.get("ALERT_WEBHOOK_URL") or load_settings(env_file).get("ALERT_WEBHOOK_URL"):
        return
    raise ArcvllmError(
        "--monitoring: ALERT_WEBHOOK_URL is not set (the webhook Alertmanager sends alerts to;"
        f" export it or put it in {env_file})",
        3,
    )


def up(args: argparse.Namespace) -> int:
    p = layout(args.replicas, args.cpu, args.monitoring)
    if args.monitoring:
        check_alert_receiver(args.env_file.resolve())
    settings = p.settings()
    if not args.cpu:
        check_gpus(args.replicas, Path(args.dev_root))
        # The replicas join the render nodes' group, as `make up` passes it (compose.yaml
        # has no default GID); RENDER_GID in the environment still wins.
        gids = render_node_gids(Path(args.dev_root) / "dev" / "dri")
        settings["RENDER_GID"] = str(next(iter(gids.values())))
    dep = Deployment(args.env_file.resolve(), settings=settings)
    port = os.environ.get("PORT", "8443")
    # compose.yaml's gateway (https, the key) is the published port, in front of the router.
    result = dep.run("up", "-d", *p.services, "gateway", profiles=p.profiles, timeout=1800)
    try:
        if result.returncode != 0:
            lines = result.stderr.strip().splitlines() or ["(no output)"]
            raise ArcvllmError(f"compose up failed: {lines[-1]}", 3)
        wait_replicas(dep, p, args.timeout)
        router = p.services[0]
        status = status_inside(dep, router, p.profiles)
        wait_router("http://127.0.0.1:8000", args.router_timeout, status=status)
    except BaseException:
        dep.down(p.profiles)  # nothing left half-started
        raise
    if args.json:
        gateway = f"https://127.0.0.1:{port}"
        doc = {"project": PROJECT, "replicas": list(p.replicas), "gateway": gateway}
        print(json.dumps({**doc, "profiles": list(p.profiles)}, indent=2))
    else:
        print(f"{len(p.replicas)} replicas healthy behind the router, gateway on port {port}")
    return 0


def down(args: argparse.Namespace) -> int:
    dep = Deployment(args.env_file.resolve())
    result = dep.down(("scale", "scale-4", "cpu-scale", "monitoring"))
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines() or ["(no output)"]
        raise ArcvllmError(f"compose down failed: {lines[-1]}", 3)
    if args.json:
        print(json.dumps({"project": PROJECT, "down": True}))
    else:
        print(f"{PROJECT}: down")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "scale",
        help="N replicas behind vLLM's router (docker/compose.scale.yaml), started or stopped",
        description=__doc__.splitlines()[0],
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = sub.add_parser("up", help="start N replicas + the router; wait until they serve")
    start.add_argument("--replicas", type=int, default=2, help="2 or 4 (one B70 each)")
    start.add_argument("--cpu", action="store_true", help="two CPU replicas of the tiny model")
    start.add_argument(
        "--monitoring",
        action="store_true",
        help="Prometheus and Alertmanager too (ALERT_WEBHOOK_URL)",
    )
    start.add_argument("--timeout", type=float, default=1800.0, help="replica health, s (1800)")
    start.add_argument("--router-timeout", type=float, default=60.0, help="router ready, s (60)")
    start.add_argument("--dev-root", default="/", help=argparse.SUPPRESS)
    stop = sub.add_parser("down", help="stop and remove the scale-out project")
    for each in (start, stop):
        each.add_argument(
            "--env-file",
            type=cli.existing_file,
            default="docker/arcvllm.env",
            help="the settings file (docker/arcvllm.env)",
        )
        cli.add_json(each)
    start.set_defaults(func=up)
    stop.set_defaults(func=down)
