"""`arcvllm tinymodel`: the tiny test model (arcvllm.builder.tinymodel)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from arcvllm import options
from arcvllm.builder import tinymodel


def _cmd_build(args: argparse.Namespace) -> int:
    path = tinymodel.build_here(Path(args.dir), seed=args.seed, mtp=args.mtp)
    if args.json:
        print(json.dumps(tinymodel.summary(path), indent=2))
    else:
        print(f"tiny hybrid model written to {path} (serve it as {tinymodel.SERVED_NAME!r})")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "tinymodel", help="build the tiny hybrid MoE model used by the CPU flavour"
    )
    sub = parser.add_subparsers(dest="tinymodel_command", required=True, metavar="ACTION")
    b = sub.add_parser("build", help="write the model (random bf16 weights, local tokenizer)")
    b.add_argument("dir", help="output folder (created; must be empty)")
    b.add_argument("--seed", type=int, default=0, help="seed for tokenizer text and weights")
    b.add_argument(
        "--mtp",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write the MTP layer's mtp.* weights (--no-mtp: leave them out, config unchanged)",
    )
    options.add_json(b, help="print the folder, seed, served name and parameter count as JSON")
    b.set_defaults(func=_cmd_build)
