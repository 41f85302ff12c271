"""`arcvllm deploy`: compose.yaml's server and gateway (arcvllm.operate.single)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from arcvllm import options, stack
from arcvllm.commands import doctor, fieldreport, smoke, verify
from arcvllm.errors import CheckFailed
from arcvllm.operate import compose, scale, single
from arcvllm.operate.host import DEFAULT_PORT
from arcvllm.operate.scale import PROJECT as SCALE_PROJECT
from arcvllm.paths import checkout_root
from arcvllm.serving.emulation import ENV

DESCRIPTION = """\
A deployment is named by the settings file (docker/arcvllm.env), the flavour (default:
xpu where this host has a render node, else cpu), the stack (default: the flavour's
default stack), the preset (default: the stack's), the image, the gateway image and the
port (each: the shell's, else the settings file's, else arcvllm:STACK, the side image of
configs/stacks.yaml, 8443), and a compose project. `up` checks the settings file, the
key file, for a preset whose model is under /models the model in MODELS_DIR, and the
server's and the gateway's images on the engine (a missing one: the command that builds or
pulls it, exit 3) before compose starts anything; `smoke` starts a project of its own on its own
port with a throwaway key and self-signed certificate (made here, the one place), runs
the smoke test through the gateway, saves the server's log beside the report and removes
the project with its volumes and the secrets, pass or fail. `bench`, `doctor` and
`field-report` take the same names. `--dry-run` prints the compose commands.
"""


def add_names(parser: argparse.ArgumentParser, project: str, port: str | None, preset=True):
    """The options that name a deployment; PROJECT and PORT their defaults here."""
    parser.add_argument(
        "--env-file",
        type=options.existing_file,
        default="docker/arcvllm.env",
        help="the settings file (docker/arcvllm.env)",
    )
    parser.add_argument("--flavor", choices=stack.FLAVORS, help="default: the stack's, else xpu "
                        "where this host has a render node, else cpu")  # fmt: skip
    parser.add_argument("--stack", help="default: the flavour's default stack")
    if preset:
        parser.add_argument(
            "--preset",
            help="default: ARCVLLM_PRESET (XPU) or CPU_PRESET (CPU) of the shell, else of the "
            "settings file, else the stack's; a preset alone also chooses the flavour",
        )
    parser.add_argument("--image", help="default: IMAGE (shell, settings), else arcvllm:STACK")
    parser.add_argument("--gateway-image", help="default: GATEWAY_IMAGE, else stacks.yaml's")
    where = f"{port}" if port else f"PORT (shell, settings), else {DEFAULT_PORT}"
    parser.add_argument("--port", default=port, help=f"the gateway's published port ({where})")
    parser.add_argument(
        "--project",
        default=project,
        help=f"the compose project: a second deployment on this host needs its own ({project})",
    )
    parser.add_argument(
        "--gpus-file", help=f"XPU: the file of this host's B70s ({compose.gpus_file()})"
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "deploy",
        help="compose.yaml's server and gateway: up, monitoring, down, logs, key, smoke, bench, "
        "doctor, report",
        description=DESCRIPTION,
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = sub.add_parser(
        "up", help="check the settings, the key file, the model and the images, then compose up -d"
    )
    stop = sub.add_parser("down", help="stop and remove the service (volumes kept unless -v)")
    stop.add_argument(
        "-v", "--volumes", action="store_true", help="the cache volumes too (compile caches)"
    )
    follow = sub.add_parser("logs", help="follow the server's log")
    follow.add_argument("--tail", type=int, default=200, help="lines of the past first (200)")
    for each in (start, stop, follow):
        add_names(each, single.PROJECT, None)
        each.add_argument("--dry-run", action="store_true", help="print the compose command")
        options.add_json(each, help="the deployment and the compose command as JSON (logs: "
                         "instead of following them)")  # fmt: skip
    start.set_defaults(func=_up)

    watch = sub.add_parser(
        "monitoring",
        help="Prometheus, the canary and Alertmanager beside the running deployment",
        description="Start compose.yaml's monitoring profile (Prometheus for the one server, "
        "the canary) and compose.scale.yaml's Alertmanager in the deployment's project, with "
        "its settings file and names, `--no-deps`: the gateway is left as `up` made it. "
        "Refused before anything starts without ALERT_WEBHOOK_URL (shell or settings file), "
        "without a running gateway, or without the images (exit 3).",
    )
    add_names(watch, single.PROJECT, None)
    watch.add_argument(
        "--scale",
        action="store_true",
        help="beside `arcvllm scale up`'s replicas instead: compose.scale.yaml's Prometheus, "
        f"Alertmanager and the canary in its project ({SCALE_PROJECT} unless --project)",
    )
    watch.add_argument("--dry-run", action="store_true", help="print the compose commands")
    options.add_json(watch, help="the compose commands, run or (--dry-run) to run, as JSON")
    watch.set_defaults(func=_monitoring)
    stop.set_defaults(func=_down)
    follow.set_defaults(func=_logs)

    test = sub.add_parser(
        "smoke",
        help="the smoke test through the gateway, in a project of its own, stopped after",
        description="Start the server and the gateway as their own compose project on their "
        "own port (a throwaway key and self-signed certificate, the gateway's diagnostic "
        "routes on), run the smoke test through the gateway, save the server's log beside "
        "the report (.log), and remove the project, its volumes and the secrets, pass or fail.",
    )
    add_names(test, single.SMOKE_PROJECT, single.SMOKE_PORT, preset=False)
    smoke.add_checks(test, health_timeout=None)
    test.add_argument(
        "--secrets",
        default=str(checkout_root() / "build" / "smoke-gateway"),
        help="where the throwaway key and certificate are made (removed at the end)",
    )
    test.add_argument(
        "--emulate-high-addresses",
        action="store_true",
        help=f"{ENV}=1 in the container (XPU-like mamba copy pointers): must pass, "
        "with the emulation's banner in the log (report: reports/smoke-STACK-emulated.json)",
    )
    test.add_argument("--dry-run", action="store_true", help="print the compose commands")
    test.set_defaults(func=_smoke)

    accept = sub.add_parser(
        "verify",
        help="arcvllm verify through the gateway, in a project of its own, stopped after",
        description="Start the server and the gateway as their own compose project on their "
        "own port (a throwaway key and self-signed certificate), run `arcvllm verify` through "
        "the gateway (every mamba-state path checked against the model itself), save the "
        "server's log beside the report (.log), and remove the project, its volumes and the "
        "secrets, pass or fail. The acceptance test of a host before it takes traffic.",
    )
    add_names(accept, single.VERIFY_PROJECT, single.VERIFY_PORT, preset=False)
    verify.add_rows(accept)
    accept.add_argument(
        "--health-timeout", type=float, help="seconds to wait for the server (600 CPU, 900 XPU)"
    )
    accept.add_argument(
        "--secrets",
        default=str(checkout_root() / "build" / "verify-gateway"),
        help="where the throwaway key and certificate are made (removed at the end)",
    )
    accept.add_argument("--dry-run", action="store_true", help="print the compose commands")
    accept.set_defaults(func=_verify)

    make_key = sub.add_parser(
        "key",
        help="make the API key file, readable by the containers' user (UID 1000) only",
        description=_key.__doc__,
    )
    make_key.add_argument(
        "--env-file",
        type=options.existing_file,
        default="docker/arcvllm.env",
        help="the settings file whose VLLM_API_KEY_FILE is made (docker/arcvllm.env)",
    )
    make_key.add_argument("--out", help="this file instead of VLLM_API_KEY_FILE")
    make_key.add_argument("--force", action="store_true", help="replace an existing key file")
    options.add_json(make_key, help="the file made, as JSON (never the key)")
    make_key.set_defaults(func=_key)

    check_host = sub.add_parser("doctor", help="host preflight for the deployment's preset")
    add_names(check_host, single.PROJECT, None)
    options.add_json(check_host)
    check_host.set_defaults(func=_doctor)

    measure = sub.add_parser("bench", help="benchmark the running server: JSON + PNG in --out")
    add_names(measure, single.PROJECT, None)
    measure.add_argument("--out", default="reports/bench", help="results folder (reports/bench)")
    measure.add_argument("--vllm-python", help="a Python with vLLM: run from this host instead")
    measure.add_argument("--tokenizer", help="with --vllm-python: the model's tokenizer")
    measure.add_argument("--bench-args", default="", help="more `arcvllm bench` options")
    options.add_json(measure, help="what `arcvllm bench` prints with --json")
    measure.set_defaults(func=_bench)

    report = sub.add_parser(
        "field-report", help="the running service in one tarball (arcvllm field-report)"
    )
    add_names(report, single.PROJECT, None)
    report.add_argument("--out", help="the tarball (reports/field-report-STACK.tar.gz)")
    fieldreport.add_options(report)
    report.set_defaults(func=_field_report)


def names_of(args: argparse.Namespace) -> single.Names:
    """The deployment ARGS name (add_names' options)."""
    return single.Names(
        env_file=Path(args.env_file),
        project=args.project,
        flavor=args.flavor,
        stack=args.stack,
        preset=getattr(args, "preset", None),
        image=args.image,
        gateway_image=args.gateway_image,
        port=args.port,
        gpus_file=Path(args.gpus_file) if args.gpus_file else None,
    )


def _shown(
    args: argparse.Namespace,
    named: single.Single,
    command: tuple[str, ...],
    ran: bool,
    project: compose.Project | None = None,
) -> None:
    """What up, down and logs print of the compose COMMAND (in PROJECT, default the
    deployment's): with --json, the deployment and COMMAND (RAN: run, not with
    --dry-run); with --dry-run, COMMAND as a shell line."""
    project = project or named.compose()
    if args.json:
        doc: dict[str, Any] = {"project": named.project, "service": named.service}
        doc["image"] = named.image
        doc |= {"port": named.port, "command": project.argv(*command), "ran": ran}
        print(json.dumps(doc))
    elif args.dry_run:
        print(project.shell(*command))


def _up(args: argparse.Namespace) -> int:
    named = single.resolve(names_of(args), strict=not args.dry_run)
    if not args.dry_run:
        single.up(named)
    _shown(args, named, single.starting(named), not args.dry_run)
    return 0


def _monitoring(args: argparse.Namespace) -> int:
    if args.scale and args.project == single.PROJECT:
        args.project = SCALE_PROJECT
    named = single.resolve(names_of(args), strict=not args.dry_run)
    made = scale.monitoring_commands if args.scale else single.monitoring_commands
    commands = [project.shell(*command) for project, command in made(named)]
    if not args.dry_run and args.scale:
        scale.monitoring(named)
    elif not args.dry_run:
        single.monitoring(named)
    if args.json:
        print(json.dumps({"commands": commands, "run": not args.dry_run}, indent=2))
    elif args.dry_run:
        print("\n".join(commands))
    return 0


def _down(args: argparse.Namespace) -> int:
    named = single.resolve(names_of(args), strict=False)
    status = 0 if args.dry_run else single.down(named, args.volumes)
    _shown(args, named, single.stopping(args.volumes), not args.dry_run, single.watched(named))
    return status


def _logs(args: argparse.Namespace) -> int:
    named = single.resolve(names_of(args), strict=False)
    if args.json or args.dry_run:
        _shown(args, named, single.following(named, args.tail), False)
        return 0
    return single.logs(named, args.tail)


def _key(args: argparse.Namespace) -> int:
    """The key file compose hands out (--out, else the settings file's VLLM_API_KEY_FILE),
    made so the containers' UID 1000 reads it: its path is printed, never the key."""
    path = single.key(Path(args.env_file), Path(args.out) if args.out else None, args.force)
    print(json.dumps({"file": str(path)}) if args.json else path)
    return 0


def _bench(args: argparse.Namespace) -> int:
    """The benchmark inside the running service (where vLLM, the tokenizer and matplotlib
    are), its results copied out to --out; with --vllm-python, from this host instead."""
    named = single.resolve(names_of(args))
    out = Path(args.out)
    extra = [*shlex.split(args.bench_args), *(["--json"] if args.json else [])]
    if args.vllm_python:
        return single.bench_from_host(named, out, extra, args.vllm_python, args.tokenizer)
    status = single.bench(named, out, extra)
    if status == 0:
        print(f"bench results in {out}", file=sys.stderr)
    return status


def _dry_run(args: argparse.Namespace, trial: single.Trial) -> bool:
    """--dry-run: the test project's compose commands printed (True); else --out is the
    trial's report from here on."""
    if args.dry_run:
        print("\n".join(trial.server.commands()))
        return True
    args.out = str(trial.report)
    return False


def _smoke(args: argparse.Namespace) -> int:
    from arcvllm.smoke.session import finish, options_from

    named = single.resolve(names_of(args))
    emulate = args.emulate_high_addresses
    trial = single.smoke_trial(named, Path(args.secrets), args.out, emulate)
    if _dry_run(args, trial):
        return 0
    timeout = single.health_timeout(named, args.health_timeout)
    with single.secrets_made(trial) as key:
        given = trial.options(key) | {"lifecycle": trial.server, "health_timeout": timeout}
        report = finish(args, options_from(args, **given))
    print(f"server log: {trial.log}", file=sys.stderr)
    if report.verdict != "pass":
        return CheckFailed.exit_code
    if emulate:
        single.check_emulated(trial.log)
        print(f"smoke: pass, emulation banner in {trial.log}", file=sys.stderr)
    return 0


def _verify(args: argparse.Namespace) -> int:
    """`arcvllm verify` through the gateway of a project of its own, stopped after: the
    deployment's acceptance test before it takes traffic (docs/verify.md)."""
    from arcvllm.verify.session import exit_status, finish, options_from

    named = single.resolve(names_of(args))
    trial = single.verify_trial(named, Path(args.secrets), args.out)
    if _dry_run(args, trial):
        return 0
    timeout = single.health_timeout(named, args.health_timeout)
    with single.secrets_made(trial, stop=True) as key:
        single.start(trial, key, timeout)
        report = finish(args, options_from(args, **trial.options(key)))
    print(f"server log: {trial.log}", file=sys.stderr)
    return exit_status(report)  # 1 a row failed, 4 one did not run its path


def _doctor(args: argparse.Namespace) -> int:
    """`deploy doctor`: `arcvllm doctor` for the deployment's preset and settings file."""
    named = single.resolve(names_of(args))
    args.preset, args.env_file, args.root = named.preset, named.env_file, Path("/")
    return doctor.run(args)


def _field_report(args: argparse.Namespace) -> int:
    """`deploy field-report`: `arcvllm field-report` of the deployment's service."""
    named = single.resolve(names_of(args))
    shell = named.compose().shell()
    asked = fieldreport.asked_of(args, shell, named.service, named.image, named.env_file)
    out = Path(args.out or f"reports/field-report-{named.stack}.tar.gz")
    return fieldreport.made(asked, out, args.json)
