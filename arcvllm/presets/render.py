"""A preset rendered into the exact vLLM command (pure): its flags, the settings file's
extra arguments, the stacks' vLLM versions it needs, the parsers it names.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arcvllm.errors import ArcvllmError
from arcvllm.presets.load import SHUTDOWN_TIMEOUT_SINCE, Command, Preset
from arcvllm.text import Shown, columns

if TYPE_CHECKING:
    pass


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


# The setting that carries extra vLLM server arguments under compose (docker/arcvllm.env):
# the container's environment, read by `arcvllm serve`.
EXTRA_ARGS = "VLLM_EXTRA_ARGS"
# Flags the deployment sets itself: extra arguments must not move them.
RESERVED_FLAGS = {
    "model": "the preset's (ARCVLLM_PRESET names another preset)",
    "served-model-name": "the preset's, which clients and the smoke test name",
    "host": "compose and the gateway reach the server on 0.0.0.0:8000",
    "port": "compose and the gateway reach the server on 0.0.0.0:8000",
    "api-key": "the key comes from VLLM_API_KEY_FILE (an argument shows in ps)",
}
_FLAG = re.compile(r"[a-z0-9][a-z0-9-]*")


def extra_args(value: str) -> list[str]:
    """VLLM_EXTRA_ARGS as arguments, refused in one line when not shaped like vLLM's long
    flags and their values (shell words, --flag or --flag=value first), or when it sets a
    flag the deployment owns. vLLM's own parser judges the rest, where vLLM is."""
    try:
        args = shlex.split(value)
    except ValueError as exc:
        raise ArcvllmError(f"{EXTRA_ARGS}: {exc}") from None
    if args and not args[0].startswith("--"):
        raise ArcvllmError(f"{EXTRA_ARGS}: starts with {args[0]!r}, not a --flag")
    for key, tokens in split_flags(args):
        flag = tokens[0].split("=", 1)[0]
        if key is None or not _FLAG.fullmatch(flag[2:].replace("_", "-")):
            raise ArcvllmError(f"{EXTRA_ARGS}: {flag!r} is not a vLLM flag (--long-flag VALUE)")
        if key in RESERVED_FLAGS:
            raise ArcvllmError(f"{EXTRA_ARGS}: --{key} is the deployment's: {RESERVED_FLAGS[key]}")
    return args


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


def has_shutdown_timeout(version: str) -> bool:
    """Whether vLLM VERSION's server takes --shutdown-timeout."""
    from packaging.version import Version

    return Version(Version(version).base_version) >= Version(SHUTDOWN_TIMEOUT_SINCE)


def shutdown_timeout_problem(preset: Preset, version: str) -> str | None:
    """Why vLLM VERSION cannot take PRESET's shutdown_timeout, in one line (None: it can)."""
    if preset.shutdown_timeout is None or has_shutdown_timeout(version):
        return None
    return (
        f"preset {preset.name}: shutdown_timeout needs vLLM >= {SHUTDOWN_TIMEOUT_SINCE} "
        f"(--shutdown-timeout); vLLM {version} has no such flag"
    )


def stack_problems(preset: Preset, stack_versions: Mapping[str, str]) -> list[str]:
    """Preset fields the vLLM of one of its stacks cannot take, one line each."""
    problems = []
    for name in preset.stacks:
        version = stack_versions.get(name)
        problem = shutdown_timeout_problem(preset, version) if version else None
        if problem:
            problems.append(f"{problem} (stack {name})")
    return problems


def server_command(
    preset: Preset,
    extra: Sequence[str] = (),
    python: str | None = None,
    vllm_version: str | None = None,
) -> Command:
    """The exact server command for PRESET, EXTRA vLLM arguments winning over the preset's.

    With VLLM_VERSION, a preset field that release cannot take is refused rather than
    rendered into a flag its parser rejects, or dropped so the server aborts requests
    on stop.
    """
    if vllm_version is not None and (problem := shutdown_timeout_problem(preset, vllm_version)):
        raise ArcvllmError(problem)
    drain = {} if preset.shutdown_timeout is None else {"shutdown-timeout": preset.shutdown_timeout}
    base = [
        "--model",
        preset.model,
        "--served-model-name",
        preset.served_model_name,
        *flag_args({**preset.vllm_args, **drain}),
    ]
    args = merge_args(base, list(extra))
    check_mamba_block_size(args)
    return Command(python or sys.executable, tuple(args), dict(preset.env))


def speculative_config(preset: Preset) -> dict[str, Any] | None:
    """The preset's speculative-config (a mapping, or vLLM's JSON text), None without."""
    value = preset.vllm_args.get("speculative-config")
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ArcvllmError(f"preset {preset.name}: speculative-config is not JSON") from exc
    if not isinstance(value, Mapping):
        raise ArcvllmError(f"preset {preset.name}: speculative-config must be a mapping")
    return dict(value)


# ---- parsers: the reasoning and tool-call parsers a preset names, in each release ----

# Where a release registers its parsers by name (vLLM 0.20 .. 0.33): a dict of
# name -> (module file, class) in the package's __init__, read as text (no import).
PARSER_REGISTRIES = {
    "reasoning-parser": ("reasoning", "_REASONING_PARSERS_TO_REGISTER"),
    "tool-call-parser": ("tool_parsers", "_TOOL_PARSERS_TO_REGISTER"),
}


def release_parsers(vllm_dir: Path) -> dict[str, frozenset[str]]:
    """Flag -> the parser names the release in VLLM_DIR (its `vllm/` package) registers
    and ships the module of, read from its files."""
    import ast

    found: dict[str, frozenset[str]] = {}
    for flag, (package, variable) in PARSER_REGISTRIES.items():
        path = vllm_dir / package / "__init__.py"
        try:
            tree = ast.parse(path.read_text())
        except (OSError, SyntaxError) as exc:
            raise ArcvllmError(f"{path}: cannot read vLLM's --{flag} registry ({exc})") from None
        registry = next(
            (
                node.value
                for node in tree.body
                if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == variable for t in node.targets)
                and isinstance(node.value, ast.Dict)
            ),
            None,
        )
        if registry is None:
            raise ArcvllmError(f"{path}: no {variable}: not a layout arcvllm knows")
        names = set()
        for key, value in zip(registry.keys, registry.values, strict=True):
            module = ast.literal_eval(value)[0] if isinstance(value, ast.Tuple) else None
            if isinstance(key, ast.Constant) and (vllm_dir / package / f"{module}.py").is_file():
                names.add(str(key.value))
        found[flag] = frozenset(names)
    return found


def parser_problems(
    preset: Preset, version: str, parsers: Mapping[str, frozenset[str]]
) -> list[str]:
    """The parsers PRESET names that vLLM VERSION (PARSERS: release_parsers) lacks."""
    problems = []
    for flag in PARSER_REGISTRIES:
        name = preset.vllm_args.get(flag)
        if name is not None and str(name) not in parsers[flag]:
            problems.append(
                f"preset {preset.name}: --{flag} {name} is not one of vLLM {version}'s "
                f"({', '.join(sorted(parsers[flag]))})"
            )
    return problems


def listing(found: Mapping[str, Preset]) -> Shown:
    """The presets as `arcvllm presets` lists them: one a line (name, model, GPUs, stacks)."""
    doc = [
        {"name": p.name, "model": p.model, "flavor": p.flavor, "gpus": p.gpus,
         "stacks": list(p.stacks)}
        for p in found.values()
    ]  # fmt: skip
    rows = [("NAME", "MODEL", "GPUS", "STACKS")]
    for p in found.values():
        gpus = f"{p.gpus}x B70" if p.flavor == "xpu" else "cpu"
        rows.append((p.name, p.model, gpus, ",".join(p.stacks)))
    return Shown(doc, columns(rows))
