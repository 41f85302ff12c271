"""`arcvllm gpus`: this host's GPUs and their render nodes (arcvllm.operate.gpus)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from arcvllm import options
from arcvllm.operate import gpus
from arcvllm.operate.compose import gpus_file
from arcvllm.operate.doctor import DEFAULT_PRESET


def _cmd(args: argparse.Namespace) -> int:
    if args.probe:  # in the image: its torch (arcvllm/serving/probe.py)
        from arcvllm.serving.probe import probe, show

        return show(probe(), args.json)
    shown = gpus.survey(args.root, args.env_file, args.compose, args.preset)
    print(shown.render(args.json))
    if shown.doc["compose"] and not args.json:
        print(f"wrote {shown.doc['compose']}", file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "gpus",
        help="this host's Intel GPUs: Level Zero index, render node, which the server gets",
        description=gpus.__doc__.split("\n\n")[1],
    )
    parser.add_argument(
        "--compose",
        type=Path,
        nargs="?",
        const=gpus_file(),
        metavar="FILE",
        help="write compose.yaml's `vllm` its GPUs: every B70, nothing else (exit 3 when "
        f"fewer than the preset needs); FILE: {gpus_file()} unless given",
    )
    parser.add_argument(
        "--preset", help=f"default: the settings' or $ARCVLLM_PRESET, else {DEFAULT_PRESET}"
    )
    parser.add_argument(
        "--env-file", type=options.existing_file, help="the settings file (its ARCVLLM_PRESET)"
    )
    parser.add_argument(
        "--root",
        default="/",
        type=options.existing_dir,
        help="read /sys and /dev under this root (as doctor --root)",
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="in the XPU image: each device as PyTorch sees it (name, PCI ID, memory, driver) "
        "and a computation on it (exit 3 without torch or a device, 1 when one computes wrong)",
    )
    options.add_json(parser, help="the table (and the file written) as JSON")
    parser.set_defaults(func=_cmd)
