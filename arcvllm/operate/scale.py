"""N replicas behind vLLM's router, started so that a failure is one line and stops what started.

`arcvllm scale up` runs docker/compose.scale.yaml's profiles with XPU replicas of K Arc Pro
B70s each (--gpus-per-replica, 1 by default; any N; each container gets only its own GPUs:
arcvllm/operate/replicas.py), refuses more GPUs than the host's B70s, a K that leaves some
over or a preset whose tensor-parallel-size is not K before anything starts, waits for
every replica's own healthcheck and then for the router's /readiness. A replica that
never gets healthy while another does is stopped alone and named: the router serves the
healthy ones (degraded, exit 4). Any other failure is named in one line and the project is
taken down again. `arcvllm scale down` stops it: each server drains its requests (the
preset's shutdown_timeout). Named volumes (compile caches, Prometheus history) stay unless
--purge. It takes over from the single deployment of the same settings (`make up`'s), which
must be stopped first (the same published port), and serves that deployment's gateway
certificate (its volume, kept by --purge too): the CA its clients hold stays valid, here
and again after `scale down` and `make up`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from arcvllm.client.api import Client, WaitTimeout, wait_until
from arcvllm.docker import docker_binary
from arcvllm.errors import Degraded, Unavailable, UsageError
from arcvllm.operate import compose, replicas, single
from arcvllm.operate.host import (
    DEFAULT_PORT,
    Host,
    api_key_file,
    check_api_key_file,
    effective,
)
from arcvllm.operate.settings import load as load_settings
from arcvllm.presets import DEFAULT_XPU_PRESET, get_preset

PROJECT = "arcvllm-scale"
DEGRADED = Degraded.exit_code  # exit status: serving, with fewer replicas than asked
EXIT_ROWS = "  4  degraded: serving with fewer replicas than asked (the others stopped, named)"


def docker_dir() -> Path:
    """The checkout's docker/ with compose.scale.yaml."""
    return compose.docker_dir("compose.scale.yaml")


@dataclass(frozen=True)
class Layout:
    """What `up` starts: compose profiles, the replicas (services) and the host name each
    answers to on the compose network, the router, and the services that go beside."""

    profiles: tuple[str, ...]
    replicas: tuple[str, ...]
    workers: tuple[str, ...]  # the router's name of each replica, in the same order
    router: str
    extras: tuple[str, ...]  # Prometheus and Alertmanager with --monitoring

    def worker_urls(self, serving: tuple[str, ...] | list[str]) -> str:
        """The router's --worker-urls for the replicas in SERVING."""
        return " ".join(
            f"http://{w}:8000"
            for r, w in zip(self.replicas, self.workers, strict=True)
            if r in serving
        )


def layout(count: int, cpu: bool, monitoring: bool) -> Layout:
    if cpu and count != 2:
        raise UsageError("the CPU scale-out profile has 2 replicas (cpu-scale)")
    if count < 1:
        raise UsageError(f"--replicas must be 1 or more, not {count}")
    workers = tuple(replicas.name(i) for i in range(count))
    profiles: tuple[str, ...]
    names: tuple[str, ...]
    if cpu:  # the CPU replicas answer as vllm-0 and vllm-1 too (network aliases)
        profiles, router, names = ("cpu-scale",), "router-cpu", ("vllm-cpu-0", "vllm-cpu-1")
    else:
        profiles, router, names = ("scale",), "router", workers
    extras: tuple[str, ...] = ()
    if monitoring:
        profiles, extras = (*profiles, "monitoring"), ("prometheus", "alertmanager")
    return Layout(profiles, names, workers, router, extras)


def state_dir(project: str) -> Path:
    """Where a deployment's made files live (the replicas' compose file, their by-path
    folders, Prometheus's targets): ARCVLLM_STATE_DIR/PROJECT, by default under the
    checkout's build/scale/."""
    base = os.environ.get("ARCVLLM_STATE_DIR") or docker_dir().parent / "build" / "scale"
    return Path(base) / project


@dataclass
class Deployment:
    """One compose project of compose.yaml + compose.scale.yaml (+ the XPU replicas' file
    `arcvllm scale up` made for it, while it is there)."""

    env_file: Path
    project: str = PROJECT
    # What `scale` decides (e.g. the router's workers), over the caller's environment and
    # the settings file when compose runs: never written to the settings file.
    overrides: dict[str, str] = field(default_factory=dict)

    @property
    def replicas_file(self) -> Path:
        return state_dir(self.project) / "replicas.yaml"

    def xpu_replicas(self) -> tuple[str, ...]:
        """The XPU replicas the replicas' file names (none without one)."""
        if not self.replicas_file.is_file():
            return ()
        doc = yaml.safe_load(self.replicas_file.read_text()) or {}
        return tuple(s for s in doc.get("services", {}) if s.startswith("vllm-"))

    def compose(self) -> compose.Project:
        """compose.yaml + compose.scale.yaml (+ the replicas' file while it is there), with
        the OVERRIDES over the caller's environment."""
        files = docker_dir()
        made = (self.replicas_file,) if self.replicas_file.is_file() else ()
        paths = (files / "compose.yaml", files / "compose.scale.yaml", *made)
        return compose.Project(self.project, self.env_file, paths, env=dict(self.overrides))

    def command(self, profiles: tuple[str, ...] = ()) -> list[str]:
        return self.compose().argv(profiles=profiles)

    def env(self) -> dict[str, str]:
        return self.compose().environ()

    def run(self, *args: str, profiles: tuple[str, ...] = (), timeout: float = 600):
        return self.compose().run(*args, profiles=profiles, timeout=timeout)

    def down(self, profiles: tuple[str, ...], purge: bool = False) -> subprocess.CompletedProcess:
        """Stop and remove the containers; the named volumes too only with PURGE."""
        return self.compose().down(volumes=purge, profiles=profiles)

    def stop(self, services: tuple[str, ...], profiles: tuple[str, ...]) -> None:
        """`compose stop SERVICE...`: they stay stopped (restart: unless-stopped)."""
        self.compose().stop(*services, profiles=profiles)

    def state(self, service: str, profiles: tuple[str, ...]) -> dict:
        """Docker's State of SERVICE's container ({} when it has none)."""
        cid = self.run("ps", "-a", "-q", service, profiles=profiles, timeout=60).stdout.strip()
        if not cid:
            return {}
        out = subprocess.run(
            [docker_binary(), "inspect", "--format", "{{json .State}}", cid],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return json.loads(out.stdout) if out.returncode == 0 else {}


Health = Callable[[str], str]  # replica -> "healthy", "starting" or why it is not serving
Status = Callable[[str], int | None]  # URL -> the HTTP status it answers (None: no answer)


def docker_health(dep: Deployment, profiles: tuple[str, ...]) -> Health:
    """A replica's state by its own healthcheck, as Docker reports it."""

    def health(name: str) -> str:
        state = dep.state(name, profiles)
        if (state.get("Health") or {}).get("Status") == "healthy":
            return "healthy"
        if state and (state.get("Restarting") or not state.get("Running", False)):
            # (restart: unless-stopped brings an exited replica back: a restart is an exit)
            return f"it exited (code {state.get('ExitCode')}); see `docker logs` of it"
        return "starting"

    return health


def wait_replicas(
    replicas: tuple[str, ...], health: Health, timeout: float, interval: float = 3.0
) -> dict[str, str]:
    """Wait until every replica is healthy or has failed (or TIMEOUT); the failed ones,
    each with why, in order. A replica that exits is not waited for any longer."""
    healthy: set[str] = set()
    failed: dict[str, str] = {}

    def settled() -> bool:
        for name in replicas:
            if name in healthy or name in failed:
                continue
            answer = health(name)
            if answer == "healthy":
                healthy.add(name)
            elif answer != "starting":
                failed[name] = f"never became healthy: {answer}"
        return len(healthy) + len(failed) == len(replicas)

    try:
        wait_until(settled, timeout, interval, "every replica healthy or failed")
    except WaitTimeout:
        for name in replicas:
            if name not in healthy and name not in failed:
                failed[name] = f"never became healthy within {timeout:.0f} s"
    return {name: failed[name] for name in replicas if name in failed}


def http_status(url: str) -> int | None:
    """The HTTP status URL answers a GET with (None: no answer)."""
    import httpx

    try:
        return Client(url, timeout=5).get("").status_code
    except httpx.HTTPError:
        return None


def status_inside(dep: Deployment, service: str, profiles: tuple[str, ...]):
    """A status function like http_status, asked in SERVICE's container by its health probe
    (docker/healthcheck.py: the router publishes no port, and the gateway in front serves
    none of its paths)."""

    def status(url: str) -> int | None:
        probe = ("exec", "-T", service, "arcvllm-healthcheck", "--status", url)
        done = dep.run(*probe, profiles=profiles)
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
        raise Unavailable(
            f"the router at {url} has no healthy worker after {timeout:.0f} s (/readiness: {last})"
        ) from exc


def check_alert_receiver(env_file: Path) -> None:
    """--monitoring starts Alertmanager, which refuses to start without a receiver: say so
    before anything starts (compose reads ALERT_WEBHOOK_URL from the shell or the file)."""
    if os.environ.get("ALERT_WEBHOOK_URL") or load_settings(env_file).get("ALERT_WEBHOOK_URL"):
        return
    raise Unavailable(
        "--monitoring: ALERT_WEBHOOK_URL is not set (the webhook Alertmanager sends alerts to;"
        f" export it or put it in {env_file})"
    )


@dataclass(frozen=True)
class Start:
    """What `scale up` is asked to start."""

    env_file: Path  # the settings file
    project: str
    replicas: int  # K B70s each (XPU), or the CPU profile's 2
    cpu: bool
    monitoring: bool  # Prometheus and Alertmanager too
    timeout: float  # seconds for every replica's health
    router_timeout: float  # seconds for the router's readiness
    dev_root: Path = Path("/")  # the host's /sys and /dev under it
    gpus_per_replica: int = 1  # K: the preset's tensor-parallel-size
    # The single deployment (`make up`'s project) this one takes over from: it must be
    # stopped (the same port), and its gateway's certificate is the one served.
    single_project: str = single.PROJECT


@dataclass(frozen=True)
class Started:
    """What `scale up` started: the replicas serving behind the router, those down (each
    with why: degraded), the gateway's published port and the compose profiles."""

    project: str
    replicas: tuple[str, ...]  # all that were started
    failed: dict[str, str]  # replica: why it is down
    port: str
    profiles: tuple[str, ...]

    @property
    def serving(self) -> tuple[str, ...]:
        return tuple(r for r in self.replicas if r not in self.failed)


def check_single_stopped(project: str, port: str, env_file: Path) -> None:
    """The single deployment PROJECT publishes the same port: its gateway must be gone
    before this one's starts (its certificate volume stays, and is served again)."""
    try:
        ps = subprocess.run(
            [docker_binary(), "ps", "-q", "--filter", f"label=com.docker.compose.project={project}",
             "--filter", "label=com.docker.compose.service=gateway"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return  # no engine to ask: compose says so at its first call
    if ps.returncode == 0 and ps.stdout.strip():
        named = "" if project == single.PROJECT else f" PROJECT={project}"
        raise UsageError(
            f"the single deployment (project {project}) still serves the gateway's port {port}:"
            f" stop it first (make down ENV_FILE={env_file}{named}; its certificate is kept)"
        )


def check_model(start: Start, preset: str) -> None:
    """The XPU replicas' model, checked as `make up` checks the single server's."""
    names = single.Names(start.env_file, project=start.single_project, flavor="xpu", preset=preset)
    single.check_model(single.resolve(names))


def checked(start: Start) -> dict[str, str]:
    """Before anything starts: the key file the replicas and the gateway get (the compose
    secret `api-key`), Alertmanager's receiver (--monitoring), the single deployment
    stopped, and for XPU the preset and its model, and the replicas' compose file for this
    host's B70s written. The settings file's settings."""
    env_file = start.env_file.resolve()
    values = load_settings(env_file)
    check_api_key_file(api_key_file(values, docker_dir(), os.environ))
    port = effective("PORT", values, os.environ, DEFAULT_PORT)
    check_single_stopped(start.single_project, port, start.env_file)
    if start.monitoring:
        check_alert_receiver(env_file)
    if start.cpu:
        if start.gpus_per_replica != 1:
            raise UsageError("--gpus-per-replica is for XPU replicas; the CPU ones have none")
        return values
    groups = replicas.pick(Host(root=start.dev_root), start.replicas, start.gpus_per_replica)
    # The replicas serve the preset compose gives them (compose.scale.yaml's command).
    name = effective("ARCVLLM_PRESET", values, os.environ, DEFAULT_XPU_PRESET)
    replicas.check_preset(get_preset(name), start.gpus_per_replica)
    check_model(start, name)
    replicas.write(groups, docker_dir() / "compose.scale.yaml", state_dir(start.project))
    return values


def serve(
    dep: Deployment, p: Layout, start: Start, health: Health, status: Status | None
) -> dict[str, str]:
    """The replicas first, with compose.yaml's gateway (https, the key: the published
    port); the router last, told only the replicas that became healthy: at its start it
    waits for every worker it is given, and gives up on them all after
    ROUTER_WORKER_STARTUP_TIMEOUT_SECS (vllm-router's wait_for_healthy_workers). The
    replicas down (stopped, each with why); Unavailable when none is healthy."""
    compose_up(dep, p.profiles, *p.replicas, *p.extras, "gateway")
    failed = wait_replicas(p.replicas, health, start.timeout)
    if len(failed) == len(p.replicas):
        first, *others = failed
        rest = f"; nor did {', '.join(others)}" if others else ""
        raise Unavailable(f"replica {first} {failed[first]}{rest}")
    if failed:
        dep.stop(tuple(failed), p.profiles)  # stopped: restart: unless-stopped holds it
    serving = [r for r in p.replicas if r not in failed]
    dep.overrides["ROUTER_WORKER_URLS"] = p.worker_urls(serving)
    compose_up(dep, p.profiles, "--no-deps", p.router)
    status = status or status_inside(dep, p.router, p.profiles)
    wait_router("http://127.0.0.1:8000", start.router_timeout, status=status)
    return failed


def up(start: Start, health: Health | None = None, status: Status | None = None) -> Started:
    """START's replicas, the gateway and the router, waited for until they serve; on any
    failure everything started is taken down again (the volumes kept). HEALTH (a replica's
    state) and STATUS (the router's answer) default to asking Docker and the router's
    container; tests pass their own."""
    p = layout(start.replicas, start.cpu, start.monitoring)
    values = checked(start)
    dep = Deployment(start.env_file.resolve(), project=start.project)
    # The single deployment's certificate: the CA its clients hold stays valid.
    tls = single.gateway_tls_volume(values, os.environ, start.single_project)
    dep.overrides["GATEWAY_TLS_VOLUME"] = tls
    port = effective("PORT", values, os.environ, DEFAULT_PORT)
    try:
        failed = serve(dep, p, start, health or docker_health(dep, p.profiles), status)
    except BaseException:
        # Nothing left half-started; the volumes (compile caches) are kept.
        dep.down(p.profiles)
        shutil.rmtree(state_dir(start.project), ignore_errors=True)
        raise
    return Started(start.project, p.replicas, failed, port, p.profiles)


def compose_up(dep: Deployment, profiles: tuple[str, ...], *services: str) -> None:
    """`compose up -d SERVICES`, or one line naming compose's last word on why not."""
    dep.compose().up(*services, profiles=profiles)


def write_replicas_file(
    count: int, out: Path, dev_root: Path = Path("/"), per_replica: int = 1
) -> list[replicas.Replica]:
    """`scale render`: the replicas' file of COUNT replicas of PER_REPLICA B70s of the host
    (its /sys and /dev under DEV_ROOT) at OUT, their by-path folders beside it: each
    replica's B70s, in the replicas' order."""
    groups = replicas.pick(Host(root=dev_root), count, per_replica)
    out = out.resolve()
    made = replicas.write(groups, docker_dir() / "compose.scale.yaml", out.parent)
    if made != out:
        made.replace(out)
    return groups


ALL_PROFILES = ("scale", "cpu-scale", "monitoring")
CPU_REPLICAS = ("vllm-cpu-0", "vllm-cpu-1")


def down(env_file: Path, project: str = PROJECT, purge: bool = False) -> None:
    """Stop and remove PROJECT; its named volumes too with PURGE."""
    dep = Deployment(env_file.resolve(), project=project)
    # The vLLM servers first, so that the router and the gateway carry the streams they
    # drain to the end (compose down alone stops the router before them).
    dep.stop((*dep.xpu_replicas(), *CPU_REPLICAS), ALL_PROFILES)
    result = dep.down(ALL_PROFILES, purge=purge)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines() or ["(no output)"]
        raise Unavailable(f"compose down failed: {lines[-1]}")
    shutil.rmtree(state_dir(project), ignore_errors=True)


# The scale-out's monitoring: compose.scale.yaml's Prometheus of every replica.
SCALE_MONITORING = ("prometheus", single.ALERTMANAGER, "canary")


def monitoring_commands(
    named: single.Single, environ: Mapping[str, str] = os.environ
) -> list[tuple[compose.Project, tuple[str, ...]]]:
    """The twin of single.monitoring_commands beside `arcvllm scale up`'s replicas, in its
    project (NAMED's: the settings file, the flavour, --project): its compose files (the replicas'
    file while it is there), the canary in the replicas' image (compose.scale.yaml's: IMAGE
    for XPU, CPU_IMAGE for the CPU replicas), `--no-deps` (the gateway left as it is)."""
    files = Deployment(named.env_file, named.project).compose().files
    image = named.image
    if named.flavor == "cpu":
        image = effective("CPU_IMAGE", named.settings, environ, f"arcvllm:{named.stack}")
    env = {"IMAGE": image, "GATEWAY_TLS_VOLUME": single.gateway_tls_volume(named.settings, environ)}
    project = compose.Project(named.project, named.env_file, files, (), env)
    return [(project, ("--profile", "monitoring", "up", "-d", "--no-deps", *SCALE_MONITORING))]


def monitoring(named: single.Single) -> None:
    """`make scale-monitoring`: monitoring_commands' services beside the replicas, checked
    as single.monitoring checks its own (the canary in the replicas' image)."""
    from dataclasses import replace

    commands = monitoring_commands(named)
    single.monitoring(
        replace(named, image=commands[0][0].env["IMAGE"]), commands, "arcvllm scale up"
    )
