"""`arcvllm presets`: list, show and check the deployment presets (arcvllm.presets)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from arcvllm import options, presets
from arcvllm.errors import UsageError


def _cmd_presets(args: argparse.Namespace) -> int:
    """List the presets, or check them against the vLLM releases of their stacks."""
    found = presets.load_all(args.presets_dir)
    if args.stack and not (args.check and args.kernels):
        raise UsageError("--stack: only with --check (and the kernels, the default)")
    if not args.check:
        print(presets.listing(found).render(args.json))
        return 0
    # (an unknown --stack refused before anything runs)
    stacks = _xpu_stacks(args.stack) if args.kernels else None
    status, doc, text = presets.run_checks(
        found, args.defects_file, _kernels(args, found, stacks), _engines_of(stacks)
    )
    print(json.dumps(doc, indent=2) if args.json else text)
    for problem in doc["problems"]:
        print(f"arcvllm: {problem}", file=sys.stderr)
    return status


def _xpu_stacks(named: list[str]) -> dict[str, Any]:
    """The XPU stacks the check asks: those NAMED (--stack), else every one."""
    from arcvllm import stack

    stacks = {name: s for name, s in stack.load()[0].items() if s.flavor == "xpu"}
    if unknown := [name for name in named if name not in stacks]:
        raise UsageError(
            f"--stack {unknown[0]}: not an XPU stack of configs/stacks.yaml "
            f"(one of {', '.join(stacks)})"
        )
    return {name: s for name, s in stacks.items() if not named or name in named}


def _kernels(
    args: argparse.Namespace, found: dict, stacks: dict[str, Any] | None
) -> Callable[[dict[str, Any], list[str]], int] | None:
    """--kernels: the kernel table and memory fit of arcvllm.builder.kernels on STACKS,
    else None."""
    if stacks is None:
        return None
    from arcvllm.builder import kernels

    return lambda doc, text: kernels.check_presets(found, args.release, doc, text, stacks)


def _engines_of(stacks: dict[str, Any] | None) -> presets.EnginesOf | None:
    """--kernels: the defect triggers read from each of STACKS' releases
    (arcvllm.builder.triggers), else None (the worst the flags allow)."""
    if stacks is None:
        return None
    from arcvllm.builder import triggers

    return lambda found: triggers.engines(found, stacks)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "presets", help="list the deployment presets", description=_cmd_presets.__doc__
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="parse every preset this vLLM's stacks cover with the installed vLLM's parser; "
        "run each XPU stack's kernel selection on every preset's model; fit the memory "
        "(exit 1 when a check fails)",
    )
    parser.add_argument(
        "--kernels",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --check: the kernel table, the memory fit and the defect triggers read from "
        "each release (default: on; off: the triggers are the worst the flags allow)",
    )
    parser.add_argument(
        "--release",
        action="append",
        default=[],
        metavar="VERSION=PYTHON[:SITE]",
        help="run vLLM VERSION's selection in PYTHON (with SITE on its path) instead of "
        "the test venvs (build/venvs, $ARCVLLM_TEST_VENVS)",
    )
    parser.add_argument(
        "--stack",
        action="append",
        default=[],
        metavar="NAME",
        help="with --check: ask only this XPU stack's release (repeatable; default: every "
        "XPU stack), e.g. the one a host is about to run",
    )
    options.add_presets_dir(parser)

    options.add_defects_file(parser)
    options.add_json(parser)
    parser.set_defaults(func=_cmd_presets)
