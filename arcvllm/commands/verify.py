"""`arcvllm verify`: the correctness suite against a running server (arcvllm.verify)."""

from __future__ import annotations

import argparse

from arcvllm.client.oracle import DRIFT_NATS, TOP_K
from arcvllm.options import add_json, add_log_source, add_metrics_url, add_server
from arcvllm.verify import plan as P
from arcvllm.verify import record, session

DESCRIPTION = """\
Checks that a running vLLM server's output is right on every path that touches a hybrid
model's mamba state, with the model itself as the oracle: each token a path produces must be
the plain model's greedy choice at its position (one cold prefill of the produced sequence).
Rows: decode across two block boundaries (speculative, if the server speculates), a prompt
longer than the prefill chunk, a cached prefix resumed and extended, batches mixing prefill
and decode, preemption and recompute (when the KV cache can run out), a request to
max-model-len, prompts of every length mod 64 (every logprob finite), sampled answers to
open prompts (no run of one token, no collapsed entropy). Where the path returns its own
top-5 logprobs, each token's drift from the plain model's (|Δ logprob|) is judged too, and
summarised per row (p50/p99/max). --record FILE keeps a healthy run (its tokens and drift);
--against FILE holds a later one to it (an upgrade, another stack, the day it was deployed).
A table and a JSON report; exit 1 when a row fails, 4 when none fails but one did not
exercise its path (INCOMPLETE: e.g. nothing was preempted; its line says how to make it
run), 3 when no server answers."""


def rows(value: str) -> tuple[str, ...]:
    """argparse type: comma-separated row names, each one of plan.ROWS."""
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    unknown = [name for name in names if name not in P.ROWS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown row {unknown[0] if unknown else value!r}; rows: {', '.join(P.ROWS)}"
        )
    return names


def _cmd(args: argparse.Namespace) -> int:
    report = session.finish(args, session.options_from(args))
    return session.exit_status(report)


def add_rows(parser: argparse.ArgumentParser) -> None:
    """The options of the suite itself, for `verify` and a deployment's verify."""
    parser.add_argument("--model", help="served model name (default: the only one served)")
    parser.add_argument("--preset", help="take the served model name (and chunk) from this preset")
    parser.add_argument("--out", metavar="PATH", help="write the JSON report to this file")
    add_json(parser)
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        metavar="N",
        help="the server's prefill chunk (default: the preset's, else the server's log)",
    )
    parser.add_argument(
        "--rows",
        type=rows,
        default=P.ROWS,
        metavar="ROW,...",
        help=f"run only these rows (default: all: {', '.join(P.ROWS)})",
    )
    parser.add_argument(
        "--request-timeout", type=float, default=600.0, help="seconds per request (600)"
    )
    add_drift(parser)
    add_metrics_url(parser)


def add_drift(parser: argparse.ArgumentParser, record_it: bool = True) -> None:
    """The drift threshold and a record to hold the run to (verify's, the canary's), and
    with RECORD_IT the record to keep of it (verify's)."""
    parser.add_argument(
        "--drift-nats",
        type=float,
        default=DRIFT_NATS,
        metavar="NATS",
        help=f"a token whose path logprob is further than this from the plain model's fails "
        f"its row ({DRIFT_NATS:g}; the top-{TOP_K} logprobs are compared)",
    )
    if record_it:
        parser.add_argument(
            "--record",
            metavar="FILE",
            help="keep this run (each row's tokens and drift, the model, vLLM, the geometry) "
            "when no row failed",
        )
    parser.add_argument(
        "--against",
        metavar="FILE",
        help="hold this run to a record: a row whose tokens differ, or whose drift p99 is "
        "beyond the record's + --margin, fails (a record of another model or geometry: exit 2)",
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=record.MARGIN,
        metavar="NATS",
        help=f"drift p99 allowed beyond the record's ({record.MARGIN:g})",
    )


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="check a vLLM server's output on every mamba-state path, the model as the oracle",
        description=DESCRIPTION,
    )
    add_server(parser)
    add_rows(parser)
    add_log_source(parser)
    parser.set_defaults(func=_cmd)
