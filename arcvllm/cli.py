"""The `arcvllm` command: parses arguments and hands them to the domain modules.

Each domain module exposes `register(subparsers)`, which adds its sub-command and sets
`func`; the modules import their heavy dependencies lazily so that `arcvllm patches`
runs in any environment that has a vLLM, and nothing more.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from arcvllm import __version__
from arcvllm.errors import ArcvllmError

# Module names, in the order `arcvllm --help` lists them.
COMMANDS = (
    "patches",
    "stack",
    "toolchain",
    "presets",
    "settings",
    "serve",
    "smoke",
    "bench",
    "doctor",
    "fieldreport",
    "scale",
    "tinymodel",
)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(prog="arcvllm", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"arcvllm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"arcvllm.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ArcvllmError as exc:
        print(f"arcvllm: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
