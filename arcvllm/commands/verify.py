"""`arcvllm verify`: the correctness suite against a running server (arcvllm.verify)."""

from __future__ import annotations

import argparse

from arcvllm.options import add_json, add_log_source, add_metrics_url, add_server
from arcvllm.verify import plan as P
from arcvllm.verify import session

DESCRIPTION = """\
Checks that a running vLLM server's output is right on every path that touches a hybrid
model's mamba state, with the model itself as the oracle: each token a path produces must
be the plain model's greedy choice at its position (one cold prefill of the produced
sequence). Rows: decode across two block boundaries (speculative, if the server
speculates), a prompt longer than the prefill chunk, a cached prefix resumed and extended,
batches mixing prefill and decode, preemption and recompute (when the KV cache can run
out), a request to max-model-len, prompts of every length mod 64 (every logprob finite),
sampled answers to open prompts (no run of one token, no collapsed entropy). A table and a
JSON report; exit 1 when a row fails, 4 when none fails but one did not exercise its path
(INCOMPLETE: e.g. nothing was preempted; its line says how to make it run), 3 when no
server answers."""


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
    add_metrics_url(parser)


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
