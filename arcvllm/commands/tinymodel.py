"""`arcvllm tinymodel`: the tiny test model (arcvllm.builder.tinymodel)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from arcvllm import options
from arcvllm.builder import tinymodel
from arcvllm.errors import Unavailable


def _cmd_build(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ModuleNotFoundError as exc:
        raise Unavailable(
            f"`tinymodel build` needs the vLLM environment ({exc.name} is missing)"
        ) from exc
    path = tinymodel.build(Path(args.dir), seed=args.seed, mtp=args.mtp)
    if args.json:
        summary = json.loads((path / "arcvllm-tinymodel.json").read_text())
        print(json.dumps({"dir": str(path), **summary}, indent=2))
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
