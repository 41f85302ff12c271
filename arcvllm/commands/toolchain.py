"""`arcvllm toolchain`: the build toolchain (arcvllm.builder.toolchain)."""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import asdict
from pathlib import Path

from arcvllm import options
from arcvllm.builder import toolchain
from arcvllm.errors import Unavailable


def _cmd(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="arcvllm-toolchain-") as tmp:
        try:
            tc = toolchain.check(Path(tmp))
        except Unavailable as exc:
            if args.json:
                print(json.dumps({"ok": False, "problem": str(exc)}, indent=2))
            raise
    if args.json:
        print(json.dumps({"ok": True, **asdict(tc)}, indent=2))
    else:
        for key, value in asdict(tc).items():
            print(f"{key:20} {value}")
        print("toolchain: the Triton launcher builds, links -lsycl -lze_loader and loads")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "toolchain",
        help="check the compiler, headers and libraries Triton's XPU launcher needs",
        description=toolchain.__doc__.splitlines()[0],
    )
    options.add_json(parser)
    parser.set_defaults(func=_cmd)
