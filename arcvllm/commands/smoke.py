"""`arcvllm smoke`: the smoke test against a running server (arcvllm.smoke)."""

from __future__ import annotations

import argparse

from arcvllm.options import add_json, add_log_source, add_metrics_url, add_server
from arcvllm.smoke import session
from arcvllm.smoke.checks import ShellLifecycle

DESCRIPTION = """\
Proves a running vLLM server decodes a hybrid model across mamba blocks: reads the block
size from the server, decodes across two boundaries, checks the server survives, that a
long prompt sent twice hits the prefix cache and gives the same greedy text, and that 8
concurrent streams crossing boundaries all complete. Optionally starts and stops the
server itself (--start-cmd / --stop-cmd), e.g. a container."""


def _cmd(args: argparse.Namespace) -> int:
    lifecycle = ShellLifecycle(args.start_cmd, args.stop_cmd) if args.start_cmd else None
    report = session.finish(args, session.options_from(args, lifecycle=lifecycle))
    return 0 if report.verdict == "pass" else 1


def add_checks(parser: argparse.ArgumentParser, health_timeout: float | None = 300.0) -> None:
    """The options of the checks themselves, for `smoke` and a deployment's smoke test."""
    parser.add_argument("--model", help="served model name (default: the only one served)")
    parser.add_argument("--preset", help="take the served model name from this preset")
    parser.add_argument("--out", metavar="PATH", help="write the JSON report to this file")
    add_json(parser)
    what = f"seconds ({health_timeout:.0f})" if health_timeout else "seconds"
    parser.add_argument("--health-timeout", type=float, default=health_timeout, help=what)
    parser.add_argument("--request-timeout", type=float, default=300.0, help="seconds (300)")
    add_metrics_url(parser)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "smoke",
        help="check a vLLM server: decode across mamba blocks, prefix cache, concurrency",
        description=DESCRIPTION,
    )
    add_server(parser)
    add_checks(parser)
    add_log_source(parser)
    parser.add_argument("--start-cmd", help="shell command that starts the server (detached)")
    parser.add_argument("--stop-cmd", help="shell command that stops it again (after --start-cmd)")
    parser.set_defaults(func=_cmd)
