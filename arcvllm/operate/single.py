"""compose.yaml's single server and its gateway, as `make up` runs them (`arcvllm deploy`).

A deployment is named (Names) by the settings file, the flavour, the stack, the preset,
the image, the gateway image, the port and a compose project; resolve gives each name
left out its default (Single). `up` checks the settings file, the key file and, for a
preset whose model is under /models, the model in MODELS_DIR before compose starts
anything. A Trial is the smoke test's or verify's project of its own on its own port,
with a throwaway key and self-signed certificate (made here, the one place), removed with
its volumes and the secrets, pass or fail. Runs on the operator's host, where `docker
compose` runs, next to the checkout.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import sys
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arcvllm import stack
from arcvllm.docker import docker_binary
from arcvllm.errors import ArcvllmError, CheckFailed, Unavailable, UsageError
from arcvllm.operate import compose, gpus, settings, weights
from arcvllm.operate.host import (
    DEFAULT_PORT,
    DRI_DIR,
    Host,
    api_key_file,
    check_api_key_file,
    default_flavor,
    effective,
    render_gid,
    render_node_gids,
)
from arcvllm.paths import checkout_root
from arcvllm.presets import get_preset
from arcvllm.serving.emulation import BANNER, ENV

PROJECT = "arcvllm"
SMOKE_PROJECT = "arcvllm-smoke"
SMOKE_PORT = "8001"
VERIFY_PROJECT = "arcvllm-verify"
VERIFY_PORT = "8002"
# Model load and warm-up before the first /health 200: the B70 preset's is the longer.
SMOKE_HEALTH_TIMEOUT = {"xpu": 900.0, "cpu": 600.0}
# The emulation's banner, as the server logs it at start (up to its first variable part).
EMULATION_BANNER = BANNER.split(" (")[0]


@dataclass(frozen=True)
class Single:
    """compose.yaml's single server as named: what compose runs and interpolates."""

    env_file: Path  # absolute: compose resolves a relative ENV_FILE against docker/
    settings: Mapping[str, str]
    flavor: str
    stack: str
    preset: str
    image: str
    port: str
    gateway_image: str
    project: str
    gpus_file: Path
    render_gid: str  # "" on a host without a render node
    # The host folder mounted at /models that holds the preset's model (MODELS_DIR; the CPU
    # service's CPU_MODELS_DIR, else MODELS_DIR); None for a model inside the image.
    models_dir: Path | None = None

    @property
    def service(self) -> str:
        return compose.SERVICES[self.flavor]

    def variables(self) -> dict[str, str]:
        """What compose interpolates for it beyond the settings file."""
        env = {"IMAGE": self.image, "PORT": self.port, "GATEWAY_IMAGE": self.gateway_image}
        env[PRESET_SETTING[self.flavor]] = self.preset  # the server's preset (compose.yaml)
        if self.flavor == "cpu" and self.models_dir is not None:
            env["CPU_MODELS_DIR"] = str(self.models_dir)  # its /models (compose.yaml)
        return env | ({"RENDER_GID": self.render_gid} if self.render_gid else {})

    def compose(self, env_file: Path | None = None, **extra: str) -> compose.Project:
        return compose.server(
            self.project,
            env_file or self.env_file,
            self.flavor,
            {**self.variables(), **extra},
            self.gpus_file,
        )


# The setting each flavour's server takes its preset from: compose.yaml interpolates it
# into the service's ARCVLLM_PRESET (the settings file's is the XPU server's).
PRESET_SETTING = {"xpu": "ARCVLLM_PRESET", "cpu": "CPU_PRESET"}


@dataclass(frozen=True)
class Names:
    """What names a deployment (`arcvllm deploy`'s options); None: resolve's default."""

    env_file: Path
    project: str = PROJECT
    flavor: str | None = None
    stack: str | None = None
    preset: str | None = None
    image: str | None = None
    gateway_image: str | None = None
    port: str | None = None
    gpus_file: Path | None = None


def resolve(
    names: Names,
    environ: Mapping[str, str] = os.environ,
    dri_dir: Path = DRI_DIR,
    strict: bool = True,
) -> Single:
    """The deployment NAMES name, with the defaults of the names left out. STRICT: the
    settings file must pass its check (anything that starts a server); else an unreadable
    one is compose's to report.

    The preset: the one named, else the shell's or the settings file's ARCVLLM_PRESET (XPU)
    or CPU_PRESET (CPU), else the stack's. A preset named alone chooses the flavour and, when
    the flavour's default stack is not one of its stacks, its first stack. A preset that
    is unknown, of the other flavour or not for the stack is a usage error."""
    env_file = names.env_file.resolve()
    try:
        values = settings.load(env_file)
    except ArcvllmError:
        if strict:
            raise
        values = {}
    stacks, defaults = stack.load()
    if names.stack is not None and names.stack not in stacks:
        raise UsageError(f"unknown stack {names.stack!r}; stacks: {', '.join(stacks)}")
    named = get_preset(names.preset) if names.preset else None
    flavor = (
        names.flavor
        or (stacks[names.stack].flavor if names.stack else None)
        or (named.flavor if named else None)
        or default_flavor(dri_dir)
    )
    chosen = named
    if chosen is None and (value := effective(PRESET_SETTING[flavor], values, environ, "")):
        chosen = get_preset(value)
    if chosen is not None and chosen.flavor != flavor:
        raise UsageError(f"preset {chosen.name} is {chosen.flavor}, not {flavor}")
    name = names.stack or defaults[flavor]
    if names.stack is None and chosen is not None and name not in chosen.stacks:
        name = next((s for s in chosen.stacks if s in stacks), name)
    if stacks[name].flavor != flavor:
        raise UsageError(f"stack {name} is {stacks[name].flavor}, not {flavor}")
    preset = chosen or get_preset(stacks[name].build_args()["PRESET"])
    if name not in preset.stacks:
        raise UsageError(
            f"preset {preset.name} does not run on stack {name} "
            f"(its stacks: {', '.join(preset.stacks)})"
        )
    gateway = stack.side_images()["gateway"].ref
    return Single(
        env_file=env_file,
        settings=values,
        flavor=flavor,
        stack=name,
        preset=preset.name,
        image=names.image or effective("IMAGE", values, environ, f"arcvllm:{name}"),
        port=str(names.port or effective("PORT", values, environ, DEFAULT_PORT)),
        gateway_image=names.gateway_image or effective("GATEWAY_IMAGE", values, environ, gateway),
        project=names.project,
        gpus_file=names.gpus_file.resolve() if names.gpus_file else compose.gpus_file(),
        render_gid=environ.get("RENDER_GID") or render_gid(dri_dir),
        models_dir=models_mount(preset, flavor, values, environ),
    )


def models_mount(preset, flavor: str, values: Mapping[str, str], environ: Mapping[str, str]):
    """The host folder compose mounts at /models for PRESET's server, when its model is
    there (None: inside the image): MODELS_DIR as compose resolves it; the CPU service's
    CPU_MODELS_DIR when set, else MODELS_DIR (absolute: what is checked is what is mounted)."""
    if weights.model_subdir(preset) is None:
        return None
    folder = weights.models_dir(values, environ)
    if flavor == "cpu":
        folder = Path(effective("CPU_MODELS_DIR", values, environ, str(folder))).absolute()
    return folder


def gateway_tls_volume(
    values: Mapping[str, str], environ: Mapping[str, str] = os.environ, project: str = PROJECT
) -> str:
    """The volume of the gateway's certificate of the single deployment PROJECT, whose CA
    clients hold (compose.yaml's gateway-tls: GATEWAY_TLS_VOLUME, else PROJECT_gateway-tls
    as compose names it). The scale-out's gateway mounts the same one."""
    return effective("GATEWAY_TLS_VOLUME", values, environ, f"{project}_gateway-tls")


def check_model(single: Single) -> None:
    """The preset's model folder under MODELS_DIR is there, finished and the preset's
    checkpoint, whatever the flavour (a model inside the image is not checked): else the
    server would restart in a loop."""
    if single.models_dir is None:
        return
    preset = get_preset(single.preset)
    folder = weights.host_dir(preset, single.models_dir)
    if why := weights.problem(folder) or weights.mismatch(folder, preset):
        raise Unavailable(
            f"the model of {preset.name} is not ready: {why} (MODELS_DIR): "
            f"arcvllm model fetch {preset.name} (make model)"
        )
    from arcvllm import model

    if line := model.problem(preset, folder, model.check(preset, folder)):
        raise CheckFailed(f"{line} (arcvllm model check {preset.name} {folder})")


def registry_reference(ref: str) -> bool:
    """REF names an image in a registry (a digest, or a first component that is a host:
    `registry.example.org/arcvllm:1`, `localhost:5000/x`, `user/x` on Docker Hub), not one
    this checkout builds under a local name."""
    name = ref.split("@", 1)[0]
    return "@" in ref or "/" in name


# The make target that builds each side image a single deployment runs.
SIDE_TARGETS = {
    "gateway": "make gateway-image",
    "prometheus": "make scale-images",
    "alertmanager": "make scale-images",
}


def image_source(ref: str, side: str | None, stack_name: str, stacks: Collection[str]) -> str:
    """The command that puts REF on the engine: `docker pull REF` for a registry reference,
    else the make target that builds it (SIDE's, or the server's of STACK_NAME, the
    deployment's stack, unless REF's tag is one of STACKS), its name passed when it is not
    the target's own default."""
    if registry_reference(ref):
        return f"docker pull {ref}"
    repository, _, tag = ref.partition(":")
    if side is not None:
        target, default = SIDE_TARGETS[side], stack.side_images()[side].ref
        if ref == default:
            return target
        if side == "gateway":
            return f"{target} GATEWAY_IMAGE={ref}"
        return f"{target} && docker tag {default} {ref}"
    if repository == "arcvllm" and tag in stacks:
        return f"make build STACK={tag}"
    return f"make build STACK={stack_name} IMAGE={ref}"


def image_present(ref: str) -> bool:
    """REF is an image on the Docker engine (`docker image inspect`): Unavailable when the
    engine does not answer."""
    argv = [docker_binary(), "image", "inspect", "--format", "{{.Id}}", ref]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise Unavailable(f"no Docker client: {argv[0]} not found") from None
    if done.returncode == 0:
        return True
    said = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
    if any("No such image" in line or "No such object" in line for line in said):
        return False
    raise Unavailable(f"docker image inspect {ref} failed: {said[-1]}")


def check_images(single: Single, sides: Mapping[str, str] | None = None) -> None:
    """The server's and the gateway's images (and SIDES', side name to reference) are on
    the engine, else one line naming the command that builds or pulls each missing one
    (compose would stop half-way, with the network and volumes made, or pull a name no
    registry has)."""
    stacks, _ = stack.load()
    wanted: dict[str, str | None] = {single.image: None, single.gateway_image: "gateway"}
    wanted |= {ref: side for side, ref in (sides or {}).items()}
    missing = [
        f"no image {ref} on the Docker engine: {image_source(ref, side, single.stack, stacks)}"
        for ref, side in wanted.items()
        if not image_present(ref)
    ]
    if missing:
        raise Unavailable("; ".join(missing))


def check(single: Single, environ: Mapping[str, str] = os.environ, dri_dir: Path = DRI_DIR):
    """Before compose starts the server: a RENDER_GID that is the render nodes' group, a
    key file compose can hand out (one line each; `arcvllm settings check`'s checks), the
    preset's model in MODELS_DIR, and the server's and the gateway's images on the engine."""
    source = str(single.env_file)
    settings.check_render_gid(settings.read(single.env_file), render_node_gids(dri_dir), source)
    check_api_key_file(api_key_file(single.settings, compose.docker_dir(), environ))
    check_model(single)
    check_images(single)


def write_gpus(single: Single) -> None:
    """XPU: the file of this host's B70s compose.yaml's `vllm` needs (`arcvllm gpus`)."""
    if single.flavor == "xpu":
        gpus.write_for(Host(settings=single.settings), single.gpus_file, single.preset)


def passed_through(project: compose.Project, *args: str) -> int:
    """Compose ARGS with their output passed through: compose's exit status."""
    return project.run(*args, timeout=None, capture=False).returncode


# ---- the smoke test's own project ----


def make_secrets(folder: Path) -> str:
    """FOLDER (0700) with a throwaway API key and a self-signed certificate for localhost,
    readable by the containers' UID 1000: the key."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, mode=0o700)
    key = secrets.token_hex(24)
    (folder / "api-key").write_text(f"{key}\n")
    argv = [
        *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"),
        *("-nodes", "-days", "2", "-subj", "/CN=localhost"),
        *("-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
        *("-keyout", str(folder / "key.pem"), "-out", str(folder / "cert.pem")),
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise Unavailable("no openssl: the smoke test's certificate is made with it") from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["(no output)"]
        raise Unavailable(f"openssl could not make the smoke test's certificate: {lines[-1]}")
    for name in ("api-key", "key.pem", "cert.pem"):
        (folder / name).chmod(0o644)
    return key


def emulated(env_file: Path, out: Path) -> Path:
    """OUT: the settings of ENV_FILE with the high-address emulation on (mamba copy
    pointers get bit 63 in the container, as on XPU)."""
    kept = [line for line in env_file.read_text().splitlines() if not line.startswith(f"{ENV}=")]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join([*kept, f"{ENV}=1"]) + "\n")
    return out


@dataclass(frozen=True)
class ComposeServer:
    """The smoke test's lifecycle (arcvllm.smoke.checks.Lifecycle) of a compose project:
    `up -d` the server and the gateway; at the end the server's whole log into LOG, then
    `down -v` (the project's volumes too)."""

    project: compose.Project
    service: str
    log: Path

    def start(self) -> None:
        self.project.up(self.service, compose.GATEWAY)

    def stop(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log.write_text(self.project.logs(self.service))
        self.project.down(volumes=True)

    @property
    def logs_shell(self) -> str:
        """The shell line that prints the server's log so far."""
        return self.project.shell("logs", "--no-color", self.service)

    def commands(self) -> list[str]:
        """What start and stop run, as shell lines (--dry-run)."""
        return [
            self.project.shell("up", "-d", self.service, compose.GATEWAY),
            f"{self.logs_shell} > {shlex.quote(str(self.log))}",
            self.project.shell("down", "-v"),
        ]


def smoke_report(single: Single, given: str | None, emulate: bool) -> Path:
    """The report's path: GIVEN, else reports/smoke-STACK[-emulated].json."""
    return Path(given or f"reports/smoke-{single.stack}{'-emulated' if emulate else ''}.json")


def smoke_project(single: Single, folder: Path, env_file: Path) -> compose.Project:
    """The smoke test's project: the gateway's diagnostic routes on (the test reads
    /tokenize and /metrics), the throwaway key and certificate of FOLDER, the preset."""
    extra = {
        "GATEWAY_DIAGNOSTIC_ROUTES": "1",
        "VLLM_API_KEY_FILE": str(folder / "api-key"),
        "GATEWAY_TLS_CERT": str(folder / "cert.pem"),
        "GATEWAY_TLS_KEY": str(folder / "key.pem"),
    }
    return single.compose(env_file, **extra)


@dataclass(frozen=True)
class Trial:
    """A test of the deployment (the smoke test, verify) in a compose project of its own
    on its own port: its server, whose log goes beside REPORT, and the throwaway key and
    certificate in SECRETS."""

    single: Single
    secrets: Path  # absolute
    report: Path
    server: ComposeServer

    @property
    def log(self) -> Path:
        return self.server.log

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.single.port}"  # the gateway

    @property
    def ca_cert(self) -> str:
        return str(self.secrets / "cert.pem")

    def options(self, key: str) -> dict[str, Any]:
        """What the checks are told of the server: its URL, preset, KEY, CA certificate
        and log."""
        from arcvllm.client.log import LogSource

        log = LogSource(cmd=self.server.logs_shell)
        return {"base_url": self.base_url, "preset": self.single.preset, "api_key": key,
                "ca_cert": self.ca_cert, "log": log}  # fmt: skip


def trial_of(single: Single, secrets: Path, report: Path, env_file: Path | None = None) -> Trial:
    """SINGLE's test project, with the settings of ENV_FILE (default: SINGLE's), the
    throwaway secrets in SECRETS, the server's log beside REPORT."""
    folder = secrets.resolve()
    project = smoke_project(single, folder, env_file or single.env_file)
    server = ComposeServer(project, single.service, report.with_suffix(".log"))
    return Trial(single, folder, report, server)


def smoke_trial(single: Single, secrets: Path, given: str | None, emulate: bool) -> Trial:
    """The smoke test's project, its report smoke_report's; EMULATE: the server's settings
    with the high-address emulation on (build/smoke-emulated.env)."""
    env_file = None
    if emulate:
        env_file = emulated(single.env_file, checkout_root() / "build" / "smoke-emulated.env")
    return trial_of(single, secrets, smoke_report(single, given, emulate), env_file)


def verify_trial(single: Single, secrets: Path, given: str | None) -> Trial:
    """Verify's project, its report GIVEN, else reports/verify-STACK.json."""
    return trial_of(single, secrets, Path(given or f"reports/verify-{single.stack}.json"))


@contextmanager
def secrets_made(trial: Trial, stop: bool = False) -> Iterator[str]:
    """Once the preset's model is checked: the throwaway key (yielded) and certificate,
    and the XPU server's GPU file; at the end, pass or fail, with STOP the server stopped
    (its log saved, the project removed), then the secrets removed."""
    check_model(trial.single)
    try:
        key = make_secrets(trial.secrets)
        write_gpus(trial.single)
        yield key
    finally:
        if stop:
            trial.server.stop()
        shutil.rmtree(trial.secrets, ignore_errors=True)


def start(trial: Trial, key: str, timeout: float) -> None:
    """Start the trial's server and wait until it is healthy: Unavailable after TIMEOUT s."""
    from arcvllm.client.api import Client, WaitTimeout

    trial.server.start()
    try:
        Client(trial.base_url, key, ca_cert=trial.ca_cert).wait_healthy(timeout)
    except WaitTimeout as exc:
        raise Unavailable(f"the server did not start: {exc} (its log: {trial.log})") from exc


def health_timeout(single: Single, given: float | None) -> float:
    """Seconds to wait for the server: GIVEN, else the flavour's model load and warm-up."""
    return given or SMOKE_HEALTH_TIMEOUT[single.flavor]


def check_emulated(log: Path) -> None:
    """The server's LOG has the emulation's banner: it ran with the emulation on."""
    if EMULATION_BANNER not in log.read_text(errors="replace"):
        raise CheckFailed(f"no emulation banner in {log}: the emulation was not on")


# ---- the other actions ----


def starting(single: Single) -> tuple[str, ...]:
    """The compose command that starts the server and the gateway."""
    return ("up", "-d", single.service, compose.GATEWAY)


def stopping(volumes: bool) -> tuple[str, ...]:
    """The compose command that stops and removes them, and what `make monitoring` started
    beside them (in watched's project; VOLUMES: the cache volumes too)."""
    return ("--profile", "monitoring", "down", *(("-v",) if volumes else ()))


def following(single: Single, tail: int) -> tuple[str, ...]:
    """The compose command that follows the server's log from its last TAIL lines."""
    return ("logs", "-f", f"--tail={tail}", single.service)


def up(single: Single) -> None:
    """Check the deployment (check), write the GPU file (XPU), then start the server and
    the gateway, compose's output passed through: Unavailable when compose fails."""
    project = single.compose()
    check(single)
    write_gpus(single)
    status = passed_through(project, *starting(single))
    if status != 0:
        raise Unavailable(f"compose up of {single.service} and the gateway failed (exit {status})")


# ---- monitoring beside the single server (`make monitoring`) ----

# compose.yaml's monitoring profile: Prometheus for the one server and the canary.
MONITORING = ("prometheus-single", "canary")
# compose.scale.yaml's, which delivers the alerts of either Prometheus.
ALERTMANAGER = "alertmanager"


def watched(single: Single) -> compose.Project:
    """SINGLE's project (the same settings file and variables as `make up`) with
    compose.scale.yaml after its files: Alertmanager's service and volume are there."""
    project = single.compose()
    scale = compose.docker_dir("compose.scale.yaml") / "compose.scale.yaml"
    files = (*project.files, scale)
    return compose.Project(project.name, project.env_file, files, project.profiles, project.env)


def monitoring_commands(single: Single) -> list[tuple[compose.Project, tuple[str, ...]]]:
    """What `make monitoring` runs: each project and its compose arguments. `--no-deps`:
    the canary's dependency, the gateway, is left as `make up` made it (compose would
    recreate a dependency whose settings differ from the ones it is given here; and
    compose.scale.yaml's gateway is the router's)."""
    return [
        (single.compose(), ("--profile", "monitoring", "up", "-d", "--no-deps", *MONITORING)),
        (watched(single), ("--profile", "monitoring", "up", "-d", "--no-deps", ALERTMANAGER)),
    ]


def check_monitoring(
    single: Single, project: compose.Project, start: str, environ: Mapping[str, str] = os.environ
) -> None:
    """Before anything starts: a receiver for Alertmanager (it refuses to start without
    one), the deployment of PROJECT up (the canary goes through its gateway; else START
    is named), the images there."""
    if not effective("ALERT_WEBHOOK_URL", single.settings, environ, ""):
        raise Unavailable(
            "ALERT_WEBHOOK_URL is not set (the webhook Alertmanager sends alerts to; "
            f"put it in {single.env_file} or export it)"
        )
    gateway = project.run("ps", "-q", compose.GATEWAY, timeout=60).stdout.strip()
    if not gateway:
        raise Unavailable(f"no gateway of project {single.project} runs: {start} first")
    sides = stack.side_images()
    check_images(single, {
        side: effective(f"{side.upper()}_IMAGE", single.settings, environ, sides[side].ref)
        for side in ("prometheus", "alertmanager")
    })  # fmt: skip


def monitoring(
    single: Single,
    commands: list[tuple[compose.Project, tuple[str, ...]]] | None = None,
    start: str = "make up",
) -> None:
    """Start Prometheus, the canary and Alertmanager beside SINGLE (COMMANDS: instead of
    monitoring_commands', e.g. the scale-out's, whose deployment START makes), after
    check_monitoring: Unavailable when compose fails."""
    commands = commands or monitoring_commands(single)
    check_monitoring(single, commands[0][0], start)
    for project, args in commands:
        status = passed_through(project, *args)
        if status != 0:
            raise Unavailable(f"compose {' '.join(args[2:])} failed (exit {status})")


def down(single: Single, volumes: bool = False) -> int:
    """Stop and remove the deployment and its monitoring (VOLUMES: their volumes too):
    compose's status."""
    return passed_through(watched(single), *stopping(volumes))


def logs(single: Single, tail: int) -> int:
    """Follow the server's log from its last TAIL lines: compose's exit status."""
    return passed_through(single.compose(), *following(single, tail))


def key(env_file: Path, out: Path | None = None, force: bool = False) -> Path:
    """The key file compose hands out (OUT, else ENV_FILE's VLLM_API_KEY_FILE), made so the
    containers' UID 1000 reads it (FORCE: an existing one replaced): its absolute path."""
    from arcvllm.operate.host import new_api_key_file

    values = settings.load(env_file)
    path = out or api_key_file(values, compose.docker_dir(), os.environ)
    new_api_key_file(path.resolve(), replace=force)
    return path.resolve()


BENCH_SCRATCH = "/tmp/arcvllm-bench"  # inside the container


def bench(single: Single, out: Path, extra: Sequence[str] = ()) -> int:
    """The benchmark (`arcvllm bench`, EXTRA its options) inside the running service, where
    vLLM, the tokenizer and matplotlib are, its results copied out to OUT: its exit status."""
    project = single.compose()
    inside: tuple[str, ...] = ("exec", "-T", single.service, "arcvllm", "bench", "--base-url")
    inside += ("http://127.0.0.1:8000", "--preset", single.preset, "--out", BENCH_SCRATCH)
    status = passed_through(project, *inside, *extra)
    if status != 0:
        return status
    cid = project.run("ps", "-q", single.service, timeout=60).stdout.strip()
    if not cid:
        raise Unavailable(f"no container of {single.service} in project {single.project}")
    out.mkdir(parents=True, exist_ok=True)
    copy = [docker_binary(), "cp", f"{cid}:{BENCH_SCRATCH}/.", f"{out}/"]
    if subprocess.run(copy).returncode != 0:
        raise Unavailable(f"docker cp of {BENCH_SCRATCH} out of {cid} failed")
    if not (out / "bench.png").exists():  # the image may carry no matplotlib: drawn here
        from arcvllm.bench.session import replot

        replot(out / "bench.json")
    return 0


def bench_from_host(
    single: Single, out: Path, extra: Sequence[str], vllm_python: str, tokenizer: str | None
) -> int:
    """The benchmark of the running service from this host, with VLLM_PYTHON's vLLM (and
    TOKENIZER, the model's): its exit status."""
    argv = [sys.executable, "-m", "arcvllm", "bench", "--base-url"]
    argv += [f"http://127.0.0.1:{single.port}", "--preset", single.preset]
    argv += ["--vllm-python", vllm_python, "--out", str(out)]
    argv += ["--tokenizer", tokenizer] if tokenizer else []
    return subprocess.run([*argv, *extra]).returncode
