"""The `arcvllm` command: parses arguments and hands them to the domain modules.

Each command module exposes `register(subparsers)`, which adds its sub-command and sets
`func`; this is the one place that registers them (a command's own sub-commands kept in
another module are listed in NESTED). The modules import their heavy dependencies lazily so
that `arcvllm patches` runs in any environment that has a vLLM, and nothing more. What
their arguments share is arcvllm.options.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

from arcvllm import __version__, options
from arcvllm.errors import ArcvllmError, Unavailable

# Module names, in the order `arcvllm --help` lists them.
COMMANDS = (
    "patching.patches",
    "builder.stack",
    "builder.image",
    "builder.release",
    "ci.standins",
    "builder.toolchain",
    "presets",
    "defects",
    "operate.settings",
    "model",
    "serving.serve",
    "smoke",
    "operate.canary",
    "verify",
    "bench",
    "operate.doctor",
    "operate.gpus",
    "operate.fieldreport",
    "operate.scale",
    "operate.deploy",
    "builder.tinymodel",
)

# Commands of a checkout only (the wheel leaves arcvllm/ci out: pyproject.toml).
CHECKOUT_ONLY = ("ci.standins",)

# Sub-commands registered under a command from a module of their own: the command's
# register() returns its sub-parsers.
NESTED = {"builder.stack": ("builder.audit",), "model": ("operate.weights",)}


def _installed(module: str) -> bool:
    """Whether MODULE is part of this install (find_spec raises when its package is not)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def build_parser() -> argparse.ArgumentParser:
    parser = options.Parser(prog="arcvllm", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"arcvllm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        if name in CHECKOUT_ONLY and not _installed(f"arcvllm.{name}"):
            continue
        nested = importlib.import_module(f"arcvllm.{name}").register(sub)
        for inner in NESTED.get(name, ()):
            importlib.import_module(f"arcvllm.{inner}").register(nested)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    options.running = f"arcvllm {args.command}"
    try:
        return int(args.func(args) or 0)
    except ArcvllmError as exc:
        print(f"arcvllm: {exc}", file=sys.stderr)
        return exc.exit_code
    except ModuleNotFoundError as exc:
        top = (exc.name or "").partition(".")[0]
        if top not in options.EXTRAS:
            raise  # not an optional dependency: a bug, worth its traceback
        error = Unavailable(
            f"{options.running} needs the '{options.EXTRAS[top]}' extra: pip install "
            f"'arcvllm[{options.EXTRAS[top]}]' (no module named {exc.name})"
        )
        print(f"arcvllm: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
