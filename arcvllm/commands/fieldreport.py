"""`arcvllm field-report`: the running service in one tarball (arcvllm.operate.fieldreport)."""

from __future__ import annotations

import argparse

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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The report of ARGS: both `field-report` and `deploy field-report` (which names the
    deployment's compose project, service, image and settings file)."""
    return fieldreport.run(args)
