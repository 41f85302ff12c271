"""`arcvllm canary`: verify's rows every few minutes, as metrics (arcvllm.operate.canary)."""

from __future__ import annotations

import argparse

from arcvllm import options
from arcvllm.client.report import table
from arcvllm.commands.verify import add_drift
from arcvllm.errors import status
from arcvllm.operate import canary
from arcvllm.verify import record


def _cmd(args: argparse.Namespace) -> int:
    from arcvllm.verify.session import exit_status, options_from

    opts = options_from(args, rows=canary.ROWS)
    if opts.against:
        record.load(opts.against)  # a file that is no record stops here, not every round
    metrics = canary.Metrics(args.acceptance_floor)
    if not args.once:
        canary.watch(opts, metrics, args.listen, args.port, args.interval, args.json)
    _, report = canary.one_round(opts, metrics)
    if report is None:
        return status(True)  # the round did not get that far (it said why)
    print(report.to_json() if args.json else table(report, "canary"), flush=True)
    return exit_status(report)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "canary",
        help="check a serving deployment's output every few minutes; Prometheus metrics",
        description=canary.DESCRIPTION,
    )
    options.add_server(parser)
    parser.add_argument("--model", help="served model name (default: the only one served)")
    parser.add_argument("--preset", help="take the served model name (and chunk) from this preset")
    parser.add_argument(
        "--request-timeout", type=float, default=600.0, help="seconds per request (600)"
    )
    options.add_metrics_url(parser)
    add_drift(parser, record_it=False)
    parser.set_defaults(rows=canary.ROWS, log_file=None, log_cmd=None, max_num_batched_tokens=None)
    parser.add_argument(
        "--interval",
        type=float,
        default=canary.INTERVAL,
        help=f"seconds between rounds ({canary.INTERVAL:g})",
    )
    parser.add_argument(
        "--port", type=int, default=canary.PORT, help=f"the metrics port ({canary.PORT})"
    )
    parser.add_argument("--listen", default="0.0.0.0", help="the metrics address (0.0.0.0)")
    parser.add_argument(
        "--acceptance-floor",
        type=float,
        default=canary.ACCEPTANCE_FLOOR,
        help=f"alert when a speculating server accepts fewer drafts ({canary.ACCEPTANCE_FLOOR})",
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="one round, its table; exit as verify's (1 failed, 4 incomplete)",
    )
    options.add_json(parser, help="--once: the round's report; else a JSON line per round")
    parser.set_defaults(func=_cmd)
