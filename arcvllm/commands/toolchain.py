"""`arcvllm toolchain`: the build toolchain (arcvllm.builder.toolchain)."""

from __future__ import annotations

import argparse
import json

from arcvllm import options
from arcvllm.builder import toolchain
from arcvllm.errors import Unavailable


def _cmd(args: argparse.Namespace) -> int:
    try:
        facts = toolchain.check_here()
    except Unavailable as exc:
        if args.json:
            print(json.dumps({"ok": False, "problem": str(exc)}, indent=2))
        raise
    print(json.dumps({"ok": True, **facts}, indent=2) if args.json else toolchain.render(facts))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "toolchain",
        help="check the compiler, headers and libraries Triton's XPU launcher needs",
        description=toolchain.__doc__.splitlines()[0],
    )
    options.add_json(parser)
    parser.set_defaults(func=_cmd)
