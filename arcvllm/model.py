"""`arcvllm model check PRESET [DIR]`: can these files serve this preset? Read, never loaded.

Before any GPU memory is taken, the model folder is held to what the preset was checked
with: config.json's architecture and quantization scheme against the preset's committed
excerpt (the scheme `arcvllm presets --check` ran each release's kernel selection on), the
tensor names of the safetensors index (or of each safetensors file's header) against the
families the preset needs (`mtp.*` for a preset that drafts with the checkpoint's MTP
layer: vLLM loads a quantized checkpoint without it and drafts with uninitialised
weights), the weights' size against the GPUs' memory, and the tokenizer and chat template
vLLM's chat endpoint needs.

Files only: json and the documented safetensors header (8-byte little-endian length, then
that many bytes of JSON); no tensor is read and nothing heavy is imported, so `arcvllm
serve` runs it before it execs vLLM.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from arcvllm.errors import CheckFailed, UsageError
from arcvllm.presets import (
    GIB,
    GPU_GIB,
    Preset,
    flag_values,
    get_preset,
    server_command,
    speculative_config,
)
from arcvllm.text import columns

INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
MTP_PREFIX = "mtp."
# The safetensors header is JSON of at most this many bytes (the format's own limit).
MAX_HEADER = 100 * 1024 * 1024
# The weights' keys a quantization scheme is decided by.
SCHEME_KEYS = ("num_bits", "type", "symmetric", "strategy", "group_size")


@dataclass(frozen=True)
class Finding:
    """One check of the model folder: passed or not, and what was seen."""

    check: str
    ok: bool
    seen: str


# ---- reading the folder (files only) ----


def read_config(directory: Path) -> dict[str, Any]:
    """config.json, or a UsageError naming what is wrong with the folder."""
    if not directory.is_dir():
        raise UsageError(f"model folder {directory} does not exist")
    path = directory / "config.json"
    if not path.is_file():
        raise UsageError(f"{directory} has no config.json: not a model folder")
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise UsageError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path} is not a JSON object")
    return data


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file (its tensors' names, dtypes, shapes)."""
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise CheckFailed(f"{path.name} is not a safetensors file (shorter than 8 bytes)")
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER:
            raise CheckFailed(f"{path.name} is not a safetensors file (header of {length} bytes)")
        text = f.read(length)
    try:
        header = json.loads(text)
    except ValueError as exc:
        raise CheckFailed(f"{path.name}: its safetensors header is not JSON") from exc
    if not isinstance(header, dict):
        raise CheckFailed(f"{path.name}: its safetensors header is not a JSON object")
    return header


def tensor_names(directory: Path) -> list[str]:
    """Every tensor name of the checkpoint: the index's weight map where there is one (and
    each file it names must be there), else the headers of the folder's safetensors files."""
    index = directory / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckFailed(f"{INDEX} has no readable weight_map") from exc
        missing = sorted({f for f in weight_map.values() if not (directory / f).is_file()})
        if missing:
            raise CheckFailed(f"{INDEX} names files that are not there: {', '.join(missing)}")
        return sorted(weight_map)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckFailed(f"no safetensors weights in {directory} (no {INDEX}, no *.safetensors)")
    return sorted(n for f in files for n in safetensors_header(f) if n != "__metadata__")


def weights_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.glob("*.safetensors"))


# ---- the checks (pure over what was read) ----


def _scheme(quant: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A quantization config reduced to what decides the kernel: the method and, per
    config group, the weights' bits, type, symmetry, strategy and group size."""
    if not quant:
        return None
    groups = quant.get("config_groups") or {}
    weights = sorted(
        json.dumps({k: (g.get("weights") or {}).get(k) for k in SCHEME_KEYS}, sort_keys=True)
        for g in groups.values()
    )
    flat = {k: quant.get(k) for k in ("bits", "group_size", "sym") if k in quant}
    return {"method": quant.get("quant_method"), "weights": weights, **flat}


def _describe(scheme: Mapping[str, Any] | None) -> str:
    if scheme is None:
        return "none (unquantized)"
    parts = [str(scheme["method"])]
    for text in scheme["weights"]:
        w = json.loads(text)
        sym = "sym" if w.get("symmetric") else "asym"
        parts.append(
            f"{w.get('type')}{w.get('num_bits')} {sym} {w.get('strategy')} {w.get('group_size')}"
        )
    parts += [f"{k}={v}" for k, v in scheme.items() if k not in ("method", "weights")]
    return ", ".join(parts)


def _text(config: Mapping[str, Any]) -> Mapping[str, Any]:
    return config.get("text_config") or config


def check_architecture(preset: Preset, config: Mapping[str, Any]) -> Finding:
    have = list(config.get("architectures") or [])
    want = list(preset.model_config.get("architectures") or [])
    if not want:
        return Finding("architecture", True, f"{', '.join(have) or '?'} (the preset names none)")
    if have != want:
        return Finding(
            "architecture", False, f"config.json says {have or 'none'}; {preset.name} is for {want}"
        )
    return Finding("architecture", True, ", ".join(have))


def check_quantization(preset: Preset, config: Mapping[str, Any]) -> Finding:
    have = _scheme(config.get("quantization_config") or _text(config).get("quantization_config"))
    if not preset.model_config:
        return Finding("quantization", True, f"{_describe(have)} (the preset names none)")
    want = _scheme(
        preset.model_config.get("quantization_config")
        or _text(preset.model_config).get("quantization_config")
    )
    if have != want:
        return Finding(
            "quantization",
            False,
            f"config.json: {_describe(have)}; {preset.name}'s kernel verdict is for "
            f"{_describe(want)}",
        )
    return Finding("quantization", True, _describe(have))


def needed_families(preset: Preset) -> dict[str, str]:
    """Tensor-name prefixes the preset needs -> why."""
    families = {"layers": "the decoder layers"}
    spec = speculative_config(preset) or {}
    if spec.get("method") == "mtp":
        families[MTP_PREFIX] = "the MTP layer its speculative-config drafts with (method mtp)"
    return families


def check_tensors(preset: Preset, names: Sequence[str]) -> Finding:
    missing = []
    for family, why in needed_families(preset).items():
        if family == MTP_PREFIX:
            found = any(n.startswith(MTP_PREFIX) for n in names)
        else:
            found = any(f".{family}." in f".{n}" for n in names)
        if not found:
            missing.append(f"no {family.rstrip('.')}.* tensors ({why})")
    seen = f"{len(names)} tensors"
    mtp = sum(n.startswith(MTP_PREFIX) for n in names)
    if mtp:
        seen += f", {mtp} mtp.*"
    if missing:
        return Finding("tensors", False, f"{seen}: {'; '.join(missing)}")
    return Finding("tensors", True, seen)


def check_size(preset: Preset, size: int) -> Finding:
    if preset.flavor != "xpu" or preset.gpus < 1:
        return Finding("size", True, f"{size / GIB:.2f} GiB of weights (CPU: not fitted)")
    values = flag_values(server_command(preset).args)
    tp = int(values.get("tensor-parallel-size", 1))
    budget = float(values.get("gpu-memory-utilization", 0.9)) * GPU_GIB * GIB
    per_gpu = size / tp
    seen = (
        f"{size / GIB:.1f} GiB of weights, {per_gpu / GIB:.1f} GiB per GPU at TP={tp} "
        f"of {budget / GIB:.1f} GiB"
    )
    return Finding("size", per_gpu < budget, seen)


def check_tokenizer(directory: Path) -> Finding:
    found = [f for f in TOKENIZER_FILES if (directory / f).is_file()]
    if not found:
        return Finding("tokenizer", False, f"none of {', '.join(TOKENIZER_FILES)}")
    return Finding("tokenizer", True, ", ".join(found))


def check_chat_template(directory: Path) -> Finding:
    files = [f for f in TEMPLATE_FILES if (directory / f).is_file()]
    config = directory / "tokenizer_config.json"
    try:
        inline = config.is_file() and bool(json.loads(config.read_text()).get("chat_template"))
    except ValueError:
        inline = False
    if inline:
        files.append("tokenizer_config.json chat_template")
    if not files:
        return Finding(
            "chat template",
            False,
            f"none ({', '.join(TEMPLATE_FILES)} or tokenizer_config.json chat_template)",
        )
    return Finding("chat template", True, ", ".join(files))


def check(preset: Preset, directory: Path) -> list[Finding]:
    """Every check of DIRECTORY for PRESET; a folder that is no model is a UsageError."""
    config = read_config(directory)
    findings = [check_architecture(preset, config), check_quantization(preset, config)]
    try:
        findings.append(check_tensors(preset, tensor_names(directory)))
    except CheckFailed as exc:
        findings.append(Finding("tensors", False, str(exc)))
    findings += [
        check_size(preset, weights_bytes(directory)),
        check_tokenizer(directory),
        check_chat_template(directory),
    ]
    return findings


def problem(preset: Preset, directory: Path, findings: Sequence[Finding]) -> str | None:
    """The one line an operator reads when the folder cannot serve the preset."""
    failed = [f for f in findings if not f.ok]
    if not failed:
        return None
    return f"model {directory} cannot serve {preset.name}: " + "; ".join(
        f"{f.check}: {f.seen}" for f in failed
    )


def refuse(preset: Preset, directory: Path) -> None:
    """CheckFailed (one line) unless DIRECTORY can serve PRESET."""
    line = problem(preset, directory, check(preset, directory))
    if line:
        raise CheckFailed(line)


def model_dir(preset: Preset, extra: Sequence[str] = ()) -> Path | None:
    """The local folder the preset (with EXTRA vLLM arguments) serves; None for a hub id."""
    model = str(flag_values(server_command(preset, extra).args).get("model", ""))
    if not model.startswith(("/", "./", "../", "~")):
        return None
    return Path(model).expanduser()


# ---- CLI ----


@dataclass(frozen=True)
class Checked:
    """A model folder checked for a preset: every finding, and the one problem line."""

    preset: Preset
    directory: Path
    findings: list[Finding]
    problem: str | None  # None: the folder can serve the preset

    def as_json(self) -> dict[str, Any]:
        return {
            "preset": self.preset.name,
            "dir": str(self.directory),
            "ok": self.problem is None,
            "rows": [asdict(f) for f in self.findings],
        }

    def table(self) -> str:
        rows = [("CHECK", "RESULT", "SEEN")]
        rows += [(f.check, "ok" if f.ok else "FAIL", f.seen) for f in self.findings]
        return columns(rows)


def check_preset(name: str, presets_dir: Path | None, directory: str | None) -> Checked:
    """`arcvllm model check NAME [DIRECTORY]`: the preset's model folder (default: the one
    it serves; UsageError for a hub id) checked for it."""
    preset = get_preset(name, presets_dir)
    folder = Path(directory) if directory else model_dir(preset)
    if folder is None:
        raise UsageError(f"preset {preset.name} serves a hub id ({preset.model}): give DIR")
    findings = check(preset, folder)
    return Checked(preset, folder, findings, problem(preset, folder, findings))
