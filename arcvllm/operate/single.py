"""`arcvllm deploy`: compose.yaml's single server and its gateway, as `make up` runs them.

A deployment is named by the settings file (docker/arcvllm.env), the flavour (default:
xpu where this host has a render node, else cpu), the stack (default: the flavour's
default stack), the preset (default: the stack's), the image, the gateway image and the
port (each: the shell's, else the settings file's, else arcvllm:STACK, the side image of
configs/stacks.yaml, 8443), and a compose project. `up` checks the settings file, the
key file and, for a preset whose model is under /models, the model in MODELS_DIR before
compose starts anything; `smoke` starts a project of its own on its own
port with a throwaway key and self-signed certificate (made here, the one place), runs
the smoke test through the gateway, saves the server's log beside the report and removes
the project with its volumes and the secrets, pass or fail. `bench`, `doctor` and
`field-report` take the same names. `--dry-run` prints the compose commands.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
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


def resolve(
    args: argparse.Namespace,
    environ: Mapping[str, str] = os.environ,
    dri_dir: Path = DRI_DIR,
    strict: bool = True,
) -> Single:
    """The deployment ARGS name (add_names). STRICT: the settings file must pass its check
    (anything that starts a server); else an unreadable one is compose's to report.

    The preset: --preset, else the shell's or the settings file's ARCVLLM_PRESET (XPU) or
    CPU_PRESET (CPU), else the stack's. A preset named alone chooses the flavour and, when
    the flavour's default stack is not one of its stacks, its first stack. A preset that
    is unknown, of the other flavour or not for the stack is a usage error."""
    env_file = Path(args.env_file).resolve()
    try:
        values = settings.load(env_file)
    except ArcvllmError:
        if strict:
            raise
        values = {}
    stacks, defaults = stack.load()
    if args.stack is not None and args.stack not in stacks:
        raise UsageError(f"unknown stack {args.stack!r}; stacks: {', '.join(stacks)}")
    named = get_preset(args.preset) if getattr(args, "preset", None) else None
    flavor = (
        args.flavor
        or (stacks[args.stack].flavor if args.stack else None)
        or (named.flavor if named else None)
        or default_flavor(dri_dir)
    )
    chosen = named
    if chosen is None and (value := effective(PRESET_SETTING[flavor], values, environ, "")):
        chosen = get_preset(value)
    if chosen is not None and chosen.flavor != flavor:
        raise UsageError(f"preset {chosen.name} is {chosen.flavor}, not {flavor}")
    name = args.stack or defaults[flavor]
    if args.stack is None and chosen is not None and name not in chosen.stacks:
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
        image=args.image or effective("IMAGE", values, environ, f"arcvllm:{name}"),
        port=str(args.port or effective("PORT", values, environ, DEFAULT_PORT)),
        gateway_image=args.gateway_image or effective("GATEWAY_IMAGE", values, environ, gateway),
        project=args.project,
        gpus_file=Path(args.gpus_file).resolve() if args.gpus_file else compose.gpus_file(),
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


def check(single: Single, environ: Mapping[str, str] = os.environ, dri_dir: Path = DRI_DIR):
    """Before compose starts the server: a RENDER_GID that is the render nodes' group, a
    key file compose can hand out (one line each; `arcvllm settings check`'s checks), and
    the preset's model in MODELS_DIR."""
    source = str(single.env_file)
    settings.check_render_gid(settings.read(single.env_file), render_node_gids(dri_dir), source)
    check_api_key_file(api_key_file(single.settings, compose.docker_dir(), environ))
    check_model(single)


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

    def commands(self) -> list[str]:
        """What start and stop run, as shell lines (--dry-run)."""
        return [
            self.project.shell("up", "-d", self.service, compose.GATEWAY),
            f"{self.project.shell('logs', '--no-color', self.service)} > "
            f"{shlex.quote(str(self.log))}",
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


def smoke(args: argparse.Namespace) -> int:
    from arcvllm.client.log import LogSource
    from arcvllm.smoke.session import finish, options_from

    single = resolve(args)
    folder = Path(args.secrets).resolve()
    out = smoke_report(single, args.out, args.emulate_high_addresses)
    log = out.with_suffix(".log")
    env_file = single.env_file
    if args.emulate_high_addresses:
        env_file = emulated(env_file, checkout_root() / "build" / "smoke-emulated.env")
    project = smoke_project(single, folder, env_file)
    if args.dry_run:
        print("\n".join(ComposeServer(project, single.service, log).commands()))
        return 0
    args.out = str(out)
    check_model(single)
    try:
        key = make_secrets(folder)
        write_gpus(single)
        opts = options_from(
            args,
            base_url=f"https://127.0.0.1:{single.port}",
            preset=single.preset,
            api_key=key,
            ca_cert=str(folder / "cert.pem"),
            log=LogSource(cmd=project.shell("logs", "--no-color", single.service)),
            lifecycle=ComposeServer(project, single.service, log),
            health_timeout=args.health_timeout or SMOKE_HEALTH_TIMEOUT[single.flavor],
        )
        report = finish(args, opts)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"server log: {log}", file=sys.stderr)
    if report.verdict != "pass":
        return CheckFailed.exit_code
    if args.emulate_high_addresses:
        if EMULATION_BANNER not in log.read_text(errors="replace"):
            raise CheckFailed(f"no emulation banner in {log}: the emulation was not on")
        print(f"smoke: pass, emulation banner in {log}", file=sys.stderr)
    return 0


def verify(args: argparse.Namespace) -> int:
    """`arcvllm verify` through the gateway of a project of its own, stopped after: the
    deployment's acceptance test before it takes traffic (docs/verify.md)."""
    from arcvllm.client.api import Client, WaitTimeout
    from arcvllm.client.log import LogSource
    from arcvllm.verify.session import finish, options_from

    single = resolve(args)
    folder = Path(args.secrets).resolve()
    out = Path(args.out or f"reports/verify-{single.stack}.json")
    log = out.with_suffix(".log")
    project = smoke_project(single, folder, single.env_file)
    logs = project.shell("logs", "--no-color", single.service)
    server = ComposeServer(project, single.service, log)
    if args.dry_run:
        print("\n".join(server.commands()))
        return 0
    args.out = str(out)
    check_model(single)
    base_url, cert = f"https://127.0.0.1:{single.port}", str(folder / "cert.pem")
    try:
        key = make_secrets(folder)
        write_gpus(single)
        server.start()
        timeout = args.health_timeout or SMOKE_HEALTH_TIMEOUT[single.flavor]
        try:
            Client(base_url, key, ca_cert=cert).wait_healthy(timeout)
        except WaitTimeout as exc:
            raise Unavailable(f"the server did not start: {exc} (its log: {log})") from exc
        opts = options_from(
            args, base_url=base_url, preset=single.preset, api_key=key, ca_cert=cert,
            log=LogSource(cmd=logs),
        )  # fmt: skip
        report = finish(args, opts)
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    print(f"server log: {log}", file=sys.stderr)
    return 0 if report.verdict == "pass" else CheckFailed.exit_code


# ---- the other actions ----


def said(single: Single, project: compose.Project, args: tuple[str, ...], ran: bool) -> None:
    """--json: the deployment and the compose command (run, or not with --dry-run)."""
    doc: dict[str, Any] = {"project": single.project, "service": single.service}
    doc["image"] = single.image
    doc |= {"port": single.port, "command": project.argv(*args), "ran": ran}
    print(json.dumps(doc))


def up(args: argparse.Namespace) -> int:
    single = resolve(args, strict=not args.dry_run)
    project = single.compose()
    start = ("up", "-d", single.service, compose.GATEWAY)
    if not args.dry_run:
        check(single)
        write_gpus(single)
        status = passed_through(project, *start)
        if status != 0:
            raise Unavailable(
                f"compose up of {single.service} and the gateway failed (exit {status})"
            )
    if args.json:
        said(single, project, start, not args.dry_run)
    elif args.dry_run:
        print(project.shell(*start))
    return 0


def down(args: argparse.Namespace) -> int:
    single = resolve(args, strict=False)
    stop = ("down", *(("-v",) if args.volumes else ()))
    status = 0 if args.dry_run else passed_through(single.compose(), *stop)
    if args.json:
        said(single, single.compose(), stop, not args.dry_run)
    elif args.dry_run:
        print(single.compose().shell(*stop))
    return status


def logs(args: argparse.Namespace) -> int:
    single = resolve(args, strict=False)
    follow = ("logs", "-f", f"--tail={args.tail}", single.service)
    if args.json or args.dry_run:
        if args.json:
            said(single, single.compose(), follow, False)
        else:
            print(single.compose().shell(*follow))
        return 0
    return passed_through(single.compose(), *follow)


def key(args: argparse.Namespace) -> int:
    """The key file compose hands out (--out, else the settings file's VLLM_API_KEY_FILE),
    made so the containers' UID 1000 reads it: its path is printed, never the key."""
    from arcvllm.operate.host import new_api_key_file

    values = settings.load(Path(args.env_file))
    path = Path(args.out) if args.out else api_key_file(values, compose.docker_dir(), os.environ)
    new_api_key_file(path.resolve(), replace=args.force)
    print(json.dumps({"file": str(path.resolve())}) if args.json else path.resolve())
    return 0


BENCH_SCRATCH = "/tmp/arcvllm-bench"  # inside the container


def bench(args: argparse.Namespace) -> int:
    """The benchmark inside the running service (where vLLM, the tokenizer and matplotlib
    are), its results copied out to --out; with --vllm-python, from this host instead."""
    single = resolve(args)
    out = Path(args.out)
    extra = [*shlex.split(args.bench_args), *(["--json"] if args.json else [])]
    if args.vllm_python:
        argv = [sys.executable, "-m", "arcvllm", "bench", "--base-url"]
        argv += [f"http://127.0.0.1:{single.port}", "--preset", single.preset]
        argv += ["--vllm-python", args.vllm_python, "--out", str(out)]
        argv += ["--tokenizer", args.tokenizer] if args.tokenizer else []
        return subprocess.run([*argv, *extra]).returncode
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
    print(f"bench results in {out}", file=sys.stderr)
    return 0


# ---- the command ----
