"""`arcvllm settings check`: the settings file (arcvllm.operate.settings)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from arcvllm import options
from arcvllm.errors import ArcvllmError
from arcvllm.operate import settings
from arcvllm.operate.host import DRI_DIR


def _cmd_check(args: argparse.Namespace) -> int:
    try:
        keys = settings.check_file(args.file, args.dri_dir, args.key_file)
    except ArcvllmError as exc:
        if args.json:
            print(json.dumps({"file": str(args.file), "ok": False, "problem": str(exc)}))
        raise
    if args.json:  # the keys only: values may be secrets
        print(json.dumps({"file": str(args.file), "ok": True, "keys": keys}))
    else:
        print(f"{args.file}: {len(keys)} settings ok")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "settings",
        help="check a settings file (docker/arcvllm.env) before compose reads it",
        description="Check the compose settings file: known keys, known preset, only the "
        "syntax compose v2 and docker-compose 1.29 read alike, and a RENDER_GID that is the "
        "group of this host's render nodes.",
    )
    sub = parser.add_subparsers(dest="settings_command", required=True, metavar="ACTION")
    check_parser = sub.add_parser("check", help="refuse unknown keys and unportable lines")
    check_parser.add_argument(
        "file", type=options.existing_file, help="the settings file, e.g. docker/arcvllm.env"
    )
    check_parser.add_argument(
        "--dri-dir",
        type=options.existing_dir,
        help=f"where the render nodes are (default {DRI_DIR}; none there: nothing to compare)",
    )
    check_parser.add_argument(
        "--key-file",
        type=Path,
        help="also the API key file compose hands out: readable, and the one key rule",
    )
    options.add_json(check_parser, help="the verdict and the keys (never the values) as JSON")
    check_parser.set_defaults(func=_cmd_check)
