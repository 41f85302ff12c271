"""`arcvllm field-report`: the running service in one tarball (arcvllm.operate.fieldreport)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from arcvllm import options
from arcvllm.operate import fieldreport
from arcvllm.operate.canary import ROWS as CANARY_ROWS


def add_options(p: argparse.ArgumentParser) -> None:
    """What the report takes beside the deployment (its compose command, service, image)."""
    # Smoke and bench run inside the container against the server itself (no gateway, no
    # TLS): no URL to give. The key is asked for only to redact it from every file.
    key = p.add_mutually_exclusive_group()
    key.add_argument(
        "--api-key-file",
        dest="api_key",
        type=options.key_file,
        metavar="FILE",
        help="the server's key, redacted from every file (default: $VLLM_API_KEY_FILE)",
    )
    key.add_argument("--api-key", dest="api_key", metavar="KEY", help="the key itself")
    options.add_json(p, help="print the tarball's path and each step's exit code as JSON")
    p.add_argument("--docker", default=None, help="docker client (default: arcvllm's one choice)")
    p.add_argument(
        "--bench-args", default=fieldreport.SHORT_BENCH, help=f"default: {fieldreport.SHORT_BENCH}"
    )
    p.add_argument("--no-smoke", action="store_true", help="skip the smoke test")
    p.add_argument("--no-bench", action="store_true", help="skip the bench")
    p.add_argument("--no-verify", action="store_true", help="skip arcvllm verify")
    p.add_argument(
        "--verify-rows",
        default=",".join(CANARY_ROWS),
        metavar="ROW,...",
        help=f"the verify rows to run (default: the canary's: {', '.join(CANARY_ROWS)})",
    )
    p.add_argument(
        "--restart",
        action="store_true",
        help="last, restart the service and time it to healthy on its warm compile caches",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "field-report",
        help="one tarball for a bug report: doctor, image, smoke, bench, logs (secrets redacted)",
        description=fieldreport.__doc__.split("\n\n")[1],
    )
    p.add_argument("--compose", required=True, help="compose command prefix of the deployment")
    p.add_argument("--service", required=True, help="compose service (vllm, vllm-cpu)")
    p.add_argument("--image", required=True, help="the service's image")
    p.add_argument("--preset", help="default: the container's $ARCVLLM_PRESET")
    p.add_argument(
        "--env-file",
        type=options.existing_file,
        help="the settings file: its secrets are redacted, its VLLM_API_KEY is the default key",
    )
    p.add_argument("--out", default="reports/field-report.tar.gz", help="the tarball (*.tar.gz)")
    add_options(p)
    p.set_defaults(func=_cmd)


def asked_of(
    args: argparse.Namespace, compose: str, service: str, image: str, env_file: Path | None
) -> fieldreport.Asked:
    """The report add_options' ARGS ask for (and --preset) of the deployment that COMPOSE
    (the command prefix), SERVICE, IMAGE and ENV_FILE (its settings file) name."""
    return fieldreport.Asked(
        compose,
        service,
        image,
        preset=args.preset,
        env_file=env_file,
        api_key=args.api_key,
        docker=args.docker,
        smoke=not args.no_smoke,
        verify=not args.no_verify,
        verify_rows=args.verify_rows,
        bench=not args.no_bench,
        bench_args=args.bench_args,
        restart=args.restart,
    )


def made(asked: fieldreport.Asked, out: Path, as_json: bool) -> int:
    """The report ASKED in the tarball OUT, its summary printed (AS_JSON: its path and each
    step's exit status): both `field-report` and `deploy field-report`."""
    tarball = fieldreport.make(asked, out)
    if as_json:
        steps = [{"name": s.name, "rc": s.rc, "seconds": s.seconds} for s in tarball.steps]
        failed = [s.name for s in tarball.steps if s.rc != 0]
        print(json.dumps({"out": str(out), "steps": steps, "failed": failed}, indent=2))
    else:
        print(tarball.summary, end="")
        print(f"field report: {out}")
    return 0


def _cmd(args: argparse.Namespace) -> int:
    asked = asked_of(args, args.compose, args.service, args.image, args.env_file)
    return made(asked, Path(args.out), args.json)
