"""`arcvllm gpus`: this host's GPUs and their render nodes (arcvllm.operate.gpus)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from arcvllm import options
from arcvllm.operate import gpus
from arcvllm.operate.compose import gpus_file
from arcvllm.operate.doctor import DEFAULT_PRESET
from arcvllm.operate.host import Host
from arcvllm.operate.settings import load as load_settings


def _cmd(args: argparse.Namespace) -> int:
    if args.probe:  # in the image: its torch (arcvllm/serving/probe.py)
        from arcvllm.serving.probe import probe, show

        return show(probe(), args.json)
    settings = load_settings(args.env_file) if args.env_file else {}
    host = Host(root=args.root, settings=settings)
    rows = gpus.table(host)
    out = None
    if args.compose:
        out = args.compose.resolve()
        gpus.write_for(host, out, args.preset)
    if args.json:
        print(json.dumps({"gpus": rows, "compose": str(out) if out else None}, indent=2))
        return 0
    from arcvllm.text import columns

    head = ("LEVEL ZERO", "SLOT", "GPU", "RENDER", "GID", "SERVER")
    lines = [head]
    for r in rows:
        server = "-" if r["server"] is None else str(r["server"])
        lines.append(
            (str(r["level_zero"]), r["slot"], r["name"], r["render"], str(r["gid"]), server)
        )
    print(columns(lines) if rows else "no Intel GPU with a render node here")
    if out:
        print(f"wrote {out}", file=sys.stderr)
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
