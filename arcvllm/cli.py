"""The `arcvllm` command: serve hybrid (mamba) models with vLLM on Intel Arc Pro B70 GPUs,
and check, deploy, test and measure the server.

Each command is one module of arcvllm.commands (arcvllm.ci.command for CI's, in a checkout
only) whose `register(subparsers)` adds its sub-command and sets `func`; this is the one
place that lists them, grouped by who runs them. The modules import their heavy
dependencies lazily so that `arcvllm patches` runs in any environment that has a vLLM, and
nothing more. What their arguments share is arcvllm.options.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

from arcvllm import __version__, options
from arcvllm.errors import ArcvllmError, Unavailable

# The command modules, grouped as `arcvllm --help` lists them.
GROUPS = {
    "Serve and operate": (
        "commands.serve",
        "commands.presets",
        "commands.model",
        "commands.settings",
        "commands.doctor",
        "commands.gpus",
        "commands.deploy",
        "commands.smoke",
        "commands.verify",
        "commands.canary",
        "commands.bench",
        "commands.fieldreport",
        "commands.scale",
        "commands.defects",
    ),
    "Build and release": (
        "commands.image",
        "commands.stack",
        "commands.patches",
        "commands.release",
        "commands.toolchain",
        "commands.tinymodel",
    ),
}

# CI's commands: runnable in a checkout, never listed, absent from the wheel (which leaves
# arcvllm/ci out: pyproject.toml).
CI_ONLY = ("ci.command",)

COMMANDS = (*(m for group in GROUPS.values() for m in group), *CI_ONLY)

DESCRIPTION = (
    "arcvllm serves hybrid (mamba) models with vLLM on Intel Arc Pro B70 GPUs: it starts the "
    "server from a preset, checks the host, deploys, tests and measures the service, and "
    "builds and releases its images."
)


class _Formatter(options._Formatter):
    """Prints the grouped listing of the commands as written (the epilog up to EXIT_STATUS)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        listing, sep, rest = text.partition(options.EXIT_STATUS)
        if not listing.startswith(tuple(GROUPS)):
            return super()._fill_text(text, width, indent)
        return listing + super()._fill_text(sep + rest, width, indent)


def _installed(module: str) -> bool:
    """Whether MODULE is part of this install (find_spec raises when its package is not)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _listing(helps: dict[str, str], names: dict[str, list[str]]) -> str:
    """The commands of each group, one a line with its help, as `--help` shows them."""
    width = max(len(name) for name in helps) + 2
    blocks = []
    for group, modules in GROUPS.items():
        lines = [f"{group}:"]
        for module in modules:
            lines += [f"  {name:<{width}}{helps[name]}" for name in names[module]]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n\n"


def build_parser() -> argparse.ArgumentParser:
    parser = options.Parser(prog="arcvllm", description=DESCRIPTION, formatter_class=_Formatter)
    parser.add_argument("--version", action="version", version=f"arcvllm {__version__}")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="one of the commands below"
    )
    names: dict[str, list[str]] = {}
    for module in COMMANDS:
        if module in CI_ONLY and not _installed(f"arcvllm.{module}"):
            continue
        before = set(sub.choices)
        importlib.import_module(f"arcvllm.{module}").register(sub)
        names[module] = [name for name in sub.choices if name not in before]
    # The listing is the epilog's, grouped; argparse's own flat one (and CI's) is dropped.
    helps = {action.dest: action.help or "" for action in sub._choices_actions}
    sub._choices_actions.clear()
    parser.epilog = _listing(helps, names) + (parser.epilog or "")
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
