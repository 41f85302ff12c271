"""`arcvllm presets`: list, show and check the deployment presets (arcvllm.presets)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from arcvllm import options, presets
from arcvllm.text import columns


def _cmd_presets(args: argparse.Namespace) -> int:
    """List the presets, or check them against the vLLM releases of their stacks."""
    found = presets.load_all(args.presets_dir)
    if not args.check:
        if args.json:
            listed = [
                {
                    "name": p.name,
                    "model": p.model,
                    "flavor": p.flavor,
                    "gpus": p.gpus,
                    "stacks": list(p.stacks),
                }
                for p in found.values()
            ]
            print(json.dumps(listed, indent=2))
            return 0
        rows = [("NAME", "MODEL", "GPUS", "STACKS")]
        for p in found.values():
            gpus = f"{p.gpus}x B70" if p.flavor == "xpu" else "cpu"
            rows.append((p.name, p.model, gpus, ",".join(p.stacks)))
        print(columns(rows))
        return 0
    doc: dict[str, Any] = {"json": args.json, "vllm": None, "problems": []}
    versions = presets.stack_vllm_versions()
    doc["problems"] += [
        line for p in found.values() for line in presets.stack_problems(p, versions)
    ]
    defects_status = presets.check_defects(found, args.defects_file, doc)
    status = presets.check_arguments(found, doc)
    if status is None:
        if not args.json:
            print("no vLLM in this Python: argument check left to the release's Python")
        status = 0
    status = max(status, defects_status)
    if doc["problems"]:
        status = max(status, 1)
    if args.kernels:
        from arcvllm.builder import kernels

        status = max(status, kernels.check_presets(found, args.release, doc))
    del doc["json"]
    doc["ok"] = status == 0
    if args.json:
        print(json.dumps(doc, indent=2))
    for problem in doc["problems"]:
        print(f"arcvllm: {problem}", file=sys.stderr)
    return status


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
        help="with --check: the kernel table and memory fit (default: on)",
    )
    parser.add_argument(
        "--release",
        action="append",
        default=[],
        metavar="VERSION=PYTHON[:SITE]",
        help="run vLLM VERSION's selection in PYTHON (with SITE on its path) instead of "
        "the test venvs (build/venvs, $ARCVLLM_TEST_VENVS)",
    )
    options.add_presets_dir(parser)

    options.add_defects_file(parser)
    options.add_json(parser)
    parser.set_defaults(func=_cmd_presets)
