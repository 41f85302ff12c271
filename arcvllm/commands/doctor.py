"""`arcvllm doctor`: the host preflight (arcvllm.operate.doctor)."""

from __future__ import annotations

import argparse

from arcvllm import options
from arcvllm.operate import doctor
from arcvllm.operate.host import Host
from arcvllm.operate.settings import load as load_settings


def run(args: argparse.Namespace) -> int:
    """The preflight of ARGS' host (--root, --env-file) for --preset: both `doctor` and
    `deploy doctor` (which names the deployment's preset and settings file)."""
    host = Host(root=args.root, settings=load_settings(args.env_file) if args.env_file else {})
    return doctor.preflight(host, args.preset, args.json)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="host preflight: can this host serve a preset?",
        description="Check the GPU, its kernel driver and firmware, resizable BAR, the render "
        "group, shared memory, RAM and the model for a preset. A failing host item prints the "
        "fix line for this host's distribution (docs/host.md); doctor changes nothing.",
    )
    parser.add_argument(
        "--preset",
        help=f"default: $ARCVLLM_PRESET, else the --env-file's, else {doctor.DEFAULT_PRESET}",
    )
    parser.add_argument(
        "--root",
        default="/",
        type=options.existing_dir,
        help="read every file (/dev, /sys, /proc, /lib, /etc) and find every tool under this root",
    )
    parser.add_argument(
        "--env-file",
        type=options.existing_file,
        help="the settings file (docker/arcvllm.env): its ARCVLLM_PRESET is the preset checked "
        "unless named, its RENDER_GID is checked against the render nodes' group (default: "
        "$RENDER_GID, as compose hands it to the container)",
    )
    options.add_json(parser, help="the report as JSON")
    parser.set_defaults(func=run)
