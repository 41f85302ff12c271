"""`arcvllm deploy`: compose.yaml's server and gateway (arcvllm.operate.single)."""

from __future__ import annotations

import argparse
from pathlib import Path

from arcvllm import options, stack
from arcvllm.commands import doctor, fieldreport, smoke, verify
from arcvllm.operate import compose, single
from arcvllm.operate.host import DEFAULT_PORT
from arcvllm.paths import checkout_root
from arcvllm.serving.emulation import ENV


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
        help="compose.yaml's server and gateway: up, down, logs, key, smoke, bench, doctor, report",
        description=single.__doc__.split("\n\n")[1],
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = sub.add_parser(
        "up", help="check the settings, the key file and the model, then compose up -d"
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
    start.set_defaults(func=single.up)
    stop.set_defaults(func=single.down)
    follow.set_defaults(func=single.logs)

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
    test.set_defaults(func=single.smoke)

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
    accept.set_defaults(func=single.verify)

    make_key = sub.add_parser(
        "key",
        help="make the API key file, readable by the containers' user (UID 1000) only",
        description=single.key.__doc__,
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
    make_key.set_defaults(func=single.key)

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
    measure.set_defaults(func=single.bench)

    report = sub.add_parser(
        "field-report", help="the running service in one tarball (arcvllm field-report)"
    )
    add_names(report, single.PROJECT, None)
    report.add_argument("--out", help="the tarball (reports/field-report-STACK.tar.gz)")
    fieldreport.add_options(report)
    report.set_defaults(func=_field_report)


def _doctor(args: argparse.Namespace) -> int:
    """`deploy doctor`: `arcvllm doctor` for the deployment's preset and settings file."""
    named = single.resolve(args)
    args.preset, args.env_file, args.root = named.preset, named.env_file, Path("/")
    return doctor.run(args)


def _field_report(args: argparse.Namespace) -> int:
    """`deploy field-report`: `arcvllm field-report` of the deployment's service."""
    named = single.resolve(args)
    args.compose = named.compose().shell()
    args.service = named.service
    args.image = named.image
    args.env_file = named.env_file
    args.out = args.out or f"reports/field-report-{named.stack}.tar.gz"
    return fieldreport.run(args)
