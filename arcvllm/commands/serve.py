"""`arcvllm serve`: a preset to vLLM's OpenAI server, in the image (arcvllm.serving.serve)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from arcvllm import options
from arcvllm.errors import UsageError
from arcvllm.presets import EXTRA_ARGS
from arcvllm.serving import serve


def _cmd_serve(args: argparse.Namespace) -> int:
    planned = serve.plan(args.preset, args.presets_dir, args.extra, os.environ)
    if args.json and not args.dry_run:
        raise UsageError("--json prints what --dry-run would: give both")
    if args.resolve:
        if args.dry_run:
            raise UsageError("--resolve and --dry-run: give one")
        print(serve.resolve(planned, os.environ))
        return 0
    if not args.dry_run:
        serve.run(planned, os.environ)
    if args.json:
        print(json.dumps(planned.as_json(os.environ), indent=2))
    else:
        print(serve.describe(planned.command, os.environ))
    for warning in planned.warnings():
        print(f"arcvllm: warning: {warning}", file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="start vLLM's OpenAI server from a preset",
        description="Start vLLM's OpenAI server from a preset; arguments after `--` go to "
        f"vLLM and win over the preset's and over ${EXTRA_ARGS} (the settings file's extra "
        "arguments, checked with the installed vLLM's own parser before the server starts).",
    )
    parser.add_argument("--preset", required=True, help="preset name (`arcvllm presets`)")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the environment and command, run nothing"
    )
    parser.add_argument(
        "--resolve",
        action="store_true",
        help="resolve the server's configuration with the installed vLLM (its checks, its "
        "model-class inspection cached in VLLM_CACHE_ROOT), load nothing, serve nothing",
    )
    options.add_presets_dir(parser)
    options.add_json(
        parser, help="with --dry-run: the environment and the argv as one JSON document"
    )
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="-- extra vLLM arguments")
    parser.set_defaults(func=_cmd_serve)
