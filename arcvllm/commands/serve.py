"""`arcvllm serve`: a preset to vLLM's OpenAI server, in the image (arcvllm.serving.serve)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from arcvllm import options
from arcvllm.errors import Unavailable, UsageError
from arcvllm.model import model_dir, refuse
from arcvllm.presets import (
    EXTRA_ARGS,
    get_preset,
    merge_args,
    server_command,
    shutdown_timeout_problem,
    stack_vllm_versions,
)
from arcvllm.serving import serve


def _cmd_serve(args: argparse.Namespace) -> int:
    preset = get_preset(args.preset, args.presets_dir)
    from_settings = serve.setting_args(os.environ)
    # the preset's, then the settings file's, then the command line's: the later ones win
    command = server_command(preset, merge_args(from_settings, serve.split_extra(args.extra)))
    problem = serve.model_path_problem(command)
    installed = serve.installed_vllm()
    mismatch = serve.stack_problem(preset, installed, stack_vllm_versions())
    if installed and not mismatch:
        # The server would reject the flag, or (dropped) abort every request on stop.
        mismatch = shutdown_timeout_problem(preset, installed[1])
    if from_settings and installed and not mismatch:
        refused = serve.vllm_refusal(command, installed[1])
        if refused:
            raise UsageError(f"{EXTRA_ARGS}={os.environ[EXTRA_ARGS]}: {refused}")
    if args.json and not args.dry_run:
        raise UsageError("--json prints what --dry-run would: give both")
    if args.dry_run and args.json:
        env = {k: serve.operator_value(os.environ, k) or v for k, v in command.env.items()}
        print(json.dumps({"env": env, "argv": command.argv}, indent=2))
    elif args.dry_run:
        print(serve.describe(command, os.environ))
    if args.dry_run:
        for warning in (problem, mismatch if installed else None):
            if warning:
                print(f"arcvllm: warning: {warning}", file=sys.stderr)
        return 0
    if problem:
        raise Unavailable(problem)
    if mismatch:
        raise Unavailable(mismatch)  # no vLLM, or one the preset's stacks do not span
    served = model_dir(preset, serve.split_extra(args.extra))
    if served is not None:
        refuse(preset, served)  # the files, before vLLM takes any memory (arcvllm.model)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command.python, command.argv, serve.effective_env(command, os.environ))
    raise AssertionError("not reached: os.execve replaced this process")


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
    options.add_presets_dir(parser)
    options.add_json(
        parser, help="with --dry-run: the environment and the argv as one JSON document"
    )
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="-- extra vLLM arguments")
    parser.set_defaults(func=_cmd_serve)
