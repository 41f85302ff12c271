"""The ledger of known upstream defects (configs/defects.yaml) and its verdicts.

Each defect names a component (vllm, vllm-xpu-kernels, compute-runtime), the versions that
carry it (a PEP 440 specifier set, or `unknown-before-fix`), the release that fixed it,
and what must be true of a preset for it to bite (its trigger: GDN layers, context length,
speculation, quantization, graph mode, ...). A stack pins one version of each component
(configs/stacks.yaml), so every XPU preset x XPU stack gets a verdict: the defects that
apply, those that may (the tracker gives no range that decides the pin), and those the
image's patch series fixes. The default XPU stack is the newest whose verdict for the
default preset is clean, and `default_stack` says which one that is.

Pure: data in, verdicts out; `arcvllm presets --check` prints them, `arcvllm defects`
lists the ledger.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arcvllm.errors import ArcvllmError, UsageError
from arcvllm.modelconfig import text_config
from arcvllm.paths import configs_dir
from arcvllm.text import Shown, columns

COMPONENTS = ("vllm", "vllm-xpu-kernels", "compute-runtime")
EFFECTS = ("wrong-output", "engine-dies")
UNKNOWN_BEFORE_FIX = "unknown-before-fix"
TRIGGER_KEYS = (
    "layers",
    "min_max_model_len",
    "speculative",
    "quantization",
    "compiled",
    "xpu_graph",
    "prefix_caching",
    "min_tensor_parallel",
    "min_num_seqs",
    "moe_width_not_power_of_two",
)
LAYER_KINDS = ("gdn", "mamba2", "moe")
QUANTIZATIONS = ("int4", "fp8", "sym_int4", "bf16")

# A pin's standing against one defect.
AFFECTED, UNKNOWN, NOT_AFFECTED = "affected", "unknown", "not-affected"


@dataclass(frozen=True)
class Defect:
    """One upstream defect: where it lives, which versions carry it, what triggers it."""

    id: str
    url: str
    title: str
    effect: str
    component: str
    affected: str  # a PEP 440 specifier set, or UNKNOWN_BEFORE_FIX
    fixed: str | None
    trigger: Mapping[str, Any]
    evidence: str
    patched_by: str | None = None

    def standing(self, version: str | None) -> str:
        """AFFECTED when VERSION lies in the affected range, NOT_AFFECTED at or after the
        fix, else UNKNOWN: a version the tracker says nothing about is never taken as
        clean, nor as affected."""
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        if version is None:
            return UNKNOWN
        pinned = Version(version)
        if self.affected != UNKNOWN_BEFORE_FIX and SpecifierSet(self.affected).contains(
            pinned, prereleases=True
        ):
            return AFFECTED
        if self.fixed is not None and pinned >= Version(self.fixed):
            return NOT_AFFECTED
        if self.affected != UNKNOWN_BEFORE_FIX and _below_start(self.affected, pinned):
            return NOT_AFFECTED  # older than the first release the range names
        return UNKNOWN


def _below_start(affected: str, version: Any) -> bool:
    """Whether VERSION is older than the range's stated start (a `>=` or `>` bound)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    starts = [s for s in SpecifierSet(affected) if s.operator in (">=", ">")]
    return any(
        version < Version(s.version) or (s.operator == ">" and version == Version(s.version))
        for s in starts
    )


@dataclass(frozen=True)
class Settings:
    """What a preset does on one stack that a defect's trigger can ask about: its flags and
    model (layers, length, speculation, quantization, TP, sequences, MoE widths) and what
    the stack's release makes of them (compiled, xpu_graph, prefix_caching:
    arcvllm.presets.triggers)."""

    layers: frozenset[str]
    max_model_len: int
    speculative: bool
    quantization: str
    compiled: bool
    xpu_graph: bool
    prefix_caching: str | None
    tensor_parallel: int
    num_seqs: int
    moe_widths: tuple[int, ...] = ()


@dataclass(frozen=True)
class Verdict:
    """One preset on one stack: which defects apply, may apply, or are patched."""

    preset: str
    stack: str
    affected: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    patched: tuple[str, ...] = ()
    listed: bool = False

    @property
    def clean(self) -> bool:
        return not self.affected

    @property
    def word(self) -> str:
        return "clean" if self.clean else "AFFECTED"

    def summary(self) -> str:
        """`clean` or `AFFECTED: ids`, then what may apply and what the image patches."""
        parts = [self.word + (f": {', '.join(self.affected)}" if self.affected else "")]
        if self.unknown:
            parts.append(f"range unknown: {', '.join(self.unknown)}")
        if self.patched:
            parts.append(f"patched: {', '.join(self.patched)}")
        return "; ".join(parts)


@dataclass(frozen=True)
class Ledger:
    defects: tuple[Defect, ...] = field(default_factory=tuple)

    def by_id(self) -> dict[str, Defect]:
        return {d.id: d for d in self.defects}


# ---- reading the ledger (the one reader of configs/defects.yaml) ----


def ledger_file() -> Path:
    return configs_dir() / "defects.yaml"


def _specifier(text: str, where: str) -> str:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    if text == UNKNOWN_BEFORE_FIX:
        return text
    try:
        SpecifierSet(text)
    except InvalidSpecifier as exc:
        raise ArcvllmError(
            f"{where}: affected {text!r} is neither a PEP 440 specifier set "
            f"nor {UNKNOWN_BEFORE_FIX}"
        ) from exc
    if not text.strip():
        raise ArcvllmError(f"{where}: affected is empty (say {UNKNOWN_BEFORE_FIX})")
    return text


def _trigger(raw: object, where: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise ArcvllmError(f"{where}: trigger must be a mapping (an empty one: every preset)")
    unknown = sorted(set(raw) - set(TRIGGER_KEYS))
    if unknown:
        raise ArcvllmError(
            f"{where}: unknown trigger key(s) {', '.join(unknown)}; "
            f"known: {', '.join(TRIGGER_KEYS)}"
        )
    for key, allowed in (("layers", LAYER_KINDS), ("quantization", QUANTIZATIONS)):
        values = raw.get(key)
        if values is not None and (
            not isinstance(values, list) or not values or not set(values) <= set(allowed)
        ):
            raise ArcvllmError(f"{where}: trigger {key} must be a list of {', '.join(allowed)}")
    for key in ("min_max_model_len", "min_tensor_parallel", "min_num_seqs"):
        if key in raw and (type(raw[key]) is not int or raw[key] < 1):
            raise ArcvllmError(f"{where}: trigger {key} must be a whole number >= 1")
    for key in ("speculative", "compiled", "xpu_graph", "moe_width_not_power_of_two"):
        if key in raw and raw[key] is not True:
            raise ArcvllmError(f"{where}: trigger {key} can only be true (leave it out)")
    if "prefix_caching" in raw and raw["prefix_caching"] != "align":
        raise ArcvllmError(f"{where}: trigger prefix_caching can only be align")
    return dict(raw)


def parse(data: object, source: str = "defects.yaml") -> Ledger:
    """Validate the parsed YAML; an error names the file, the defect and the key."""
    from packaging.version import InvalidVersion, Version

    if not isinstance(data, Mapping) or not isinstance(data.get("defects"), list):
        raise ArcvllmError(f"{source}: expected a `defects:` list")
    defects: list[Defect] = []
    required = ("id", "url", "title", "effect", "component", "affected", "fixed", "trigger")
    for index, raw in enumerate(data["defects"]):
        where = f"{source}: defect {index + 1}"
        if not isinstance(raw, Mapping):
            raise ArcvllmError(f"{where}: not a mapping")
        where = f"{source}: {raw.get('id', f'defect {index + 1}')}"
        missing = [key for key in required if key not in raw]
        if missing:
            raise ArcvllmError(f"{where}: missing key(s) {', '.join(missing)}")
        unknown = sorted(set(raw) - {*required, "evidence", "patched_by"})
        if unknown:
            raise ArcvllmError(f"{where}: unknown key(s) {', '.join(unknown)}")
        if not str(raw.get("evidence") or "").strip():
            raise ArcvllmError(f"{where}: evidence is empty (say what was read)")
        if raw["component"] not in COMPONENTS:
            raise ArcvllmError(f"{where}: component must be one of {', '.join(COMPONENTS)}")
        if raw["effect"] not in EFFECTS:
            raise ArcvllmError(f"{where}: effect must be one of {', '.join(EFFECTS)}")
        if not str(raw["url"]).startswith("https://"):
            raise ArcvllmError(f"{where}: url must be the tracker's https address")
        fixed = raw["fixed"]
        if fixed is not None:
            try:
                Version(str(fixed))
            except InvalidVersion as exc:
                raise ArcvllmError(f"{where}: fixed {fixed!r} is not a version") from exc
        affected = _specifier(str(raw["affected"]), where)
        if affected == UNKNOWN_BEFORE_FIX and fixed is None and raw.get("patched_by"):
            raise ArcvllmError(f"{where}: a patched defect needs its range")
        defects.append(
            Defect(
                id=str(raw["id"]),
                url=str(raw["url"]),
                title=str(raw["title"]),
                effect=str(raw["effect"]),
                component=str(raw["component"]),
                affected=affected,
                fixed=None if fixed is None else str(fixed),
                trigger=_trigger(raw["trigger"], where),
                evidence=" ".join(str(raw["evidence"]).split()),
                patched_by=None if raw.get("patched_by") is None else str(raw["patched_by"]),
            )
        )
    ids = [d.id for d in defects]
    doubled = sorted({i for i in ids if ids.count(i) > 1})
    if doubled:
        raise ArcvllmError(f"{source}: defect(s) listed twice: {', '.join(doubled)}")
    return Ledger(tuple(defects))


def load(path: Path | None = None) -> Ledger:
    import yaml

    path = path or ledger_file()
    if not path.exists():
        raise ArcvllmError(f"no defect ledger at {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ArcvllmError(f"{path}: not valid YAML: {exc}") from exc
    return parse(data, str(path))


# ---- what a stack pins ----

_KERNELS = re.compile(r"vllm_xpu_kernels(?:==|-)(\d[0-9A-Za-z.]*?)(?:-cp|\s|$)")
_RUNTIME = re.compile(r"libze-intel-gpu1_(\d+(?:\.\d+)+)")


def pinned_versions(stack: Any) -> dict[str, str | None]:
    """The version of each component a stack (arcvllm.stack.Stack) pins."""
    args = {key: pin.value for key, pin in stack.args.items()}
    kernels = _KERNELS.search(args.get("VLLM_XPU_KERNELS", ""))
    runtime = _RUNTIME.search(args.get("GPU_DEBS", ""))
    return {
        "vllm": stack.vllm_version,
        "vllm-xpu-kernels": kernels.group(1) if kernels else None,
        "compute-runtime": runtime.group(1) if runtime else None,
    }


# ---- what a preset sets (arcvllm.presets.defect_settings reads it) ----


def quantization(model_config: Mapping[str, Any]) -> str:
    """The weight scheme in one word: int4, fp8 or bf16 (unquantized)."""
    quant = model_config.get("quantization_config") or text_config(model_config).get(
        "quantization_config"
    )
    if not quant:
        return "bf16"
    method = str(quant.get("quant_method", ""))
    if "fp8" in method:
        return "fp8"
    for group in (quant.get("config_groups") or {}).values():
        weights = group.get("weights") or {}
        if weights.get("type") == "float" and int(weights.get("num_bits", 16)) == 8:
            return "fp8"
        if int(weights.get("num_bits", 16)) == 4:
            return "int4"
    if int(quant.get("bits", 16)) == 4:  # gptq / auto_round / awq
        return "int4"
    return method or "bf16"


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def triggered(trigger: Mapping[str, Any], settings: Settings) -> bool:
    """Whether SETTINGS meet every key of TRIGGER."""
    checks = {
        "layers": lambda v: bool(settings.layers & set(v)),
        "min_max_model_len": lambda v: settings.max_model_len >= v,
        "speculative": lambda v: settings.speculative,
        "quantization": lambda v: settings.quantization in v,
        "compiled": lambda v: settings.compiled,
        "xpu_graph": lambda v: settings.xpu_graph,
        "prefix_caching": lambda v: settings.prefix_caching == v,
        "min_tensor_parallel": lambda v: settings.tensor_parallel >= v,
        "min_num_seqs": lambda v: settings.num_seqs >= v,
        "moe_width_not_power_of_two": lambda v: any(
            not _power_of_two(w) for w in settings.moe_widths
        ),
    }
    return all(checks[key](value) for key, value in trigger.items())


# ---- verdicts ----


def verdict(
    ledger: Ledger,
    preset: str,
    settings: Settings,
    stack: str,
    pins: Mapping[str, str | None],
    listed: bool = False,
) -> Verdict:
    """Every defect whose trigger the preset meets, by its standing on the stack's pins."""
    affected, unknown, patched = [], [], []
    for defect in ledger.defects:
        if not triggered(defect.trigger, settings):
            continue
        standing = defect.standing(pins.get(defect.component))
        if standing == AFFECTED and defect.patched_by:
            patched.append(f"{defect.id} ({defect.patched_by})")
        elif standing == AFFECTED:
            affected.append(defect.id)
        elif standing == UNKNOWN:
            unknown.append(defect.id)
    return Verdict(preset, stack, tuple(affected), tuple(unknown), tuple(patched), listed)


def verdicts(
    ledger: Ledger,
    presets: Iterable[tuple[str, Mapping[str, Settings], Sequence[str]]],
    stacks: Mapping[str, Any],
) -> list[Verdict]:
    """Every (preset name, its settings on each XPU stack, its listed stacks) x every XPU
    stack, stacks a preset does not list too. A preset's settings are per stack: whether
    it compiles, replays XPU graphs and caches prefixes is the release's decision
    (arcvllm.presets.triggers)."""
    out = []
    xpu = {name: s for name, s in stacks.items() if s.flavor == "xpu"}
    for name, settings, listed in presets:
        for stack_name, stack in xpu.items():
            pins = pinned_versions(stack)
            here = settings[stack_name]
            out.append(verdict(ledger, name, here, stack_name, pins, stack_name in listed))
    return out


def default_stack(
    ledger: Ledger, settings: Mapping[str, Settings], stacks: Mapping[str, Any]
) -> str | None:
    """The newest XPU stack (by its vLLM) whose verdict for a preset of SETTINGS (per
    stack) is clean; None if none is."""
    from packaging.version import Version

    xpu = sorted(
        (s for s in stacks.values() if s.flavor == "xpu"),
        key=lambda s: Version(s.vllm_version),
        reverse=True,
    )
    for stack in xpu:
        if verdict(ledger, "", settings[stack.name], stack.name, pinned_versions(stack)).clean:
            return stack.name
    return None


def default_problem(
    ledger: Ledger,
    preset: str,
    settings: Mapping[str, Settings],
    stacks: Mapping[str, Any],
    current: str,
) -> str | None:
    """Why CURRENT (the stacks file's default XPU stack) is not the one the ledger picks
    for PRESET (of SETTINGS, per stack); None when it is."""
    picked = default_stack(ledger, settings, stacks)
    if picked == current:
        return None
    if picked is None:
        return (
            f"no XPU stack is clean for the default preset {preset} "
            f"by the defect ledger; the default {current} is not either"
        )
    return (
        f"the default XPU stack is {current}, but the newest stack clean for {preset} "
        f"by the defect ledger is {picked}: set defaults.xpu of the stacks file"
    )


def pins_line(name: str, pins: Mapping[str, str | None]) -> str:
    """`xpu-0.23: vllm 0.23.0, vllm-xpu-kernels 0.1.9, compute-runtime 25.48.36300.8`."""
    return f"{name}: " + ", ".join(f"{c} {pins.get(c) or '?'}" for c in COMPONENTS)


def rows(found: Sequence[Verdict]) -> list[tuple[str, ...]]:
    table: list[tuple[str, ...]] = [("PRESET", "STACK", "LISTED", "VERDICT")]
    for v in found:
        table.append((v.preset, v.stack, "yes" if v.listed else "no", v.summary()))
    return table


# ---- `arcvllm defects` ----


def listing(ledger_path: Path | None = None, stack_name: str | None = None) -> Shown:
    """The ledger as `arcvllm defects` prints it; with STACK_NAME, each defect's standing
    on that stack's pins (UsageError: no such stack)."""
    from arcvllm import stack as stacks_mod

    ledger = load(ledger_path)
    pins: dict[str, str | None] = {}
    if stack_name:
        try:
            pins = pinned_versions(stacks_mod.get(stack_name))
        except ArcvllmError as exc:  # a stack named on the command line
            raise UsageError(str(exc)) from None
    listed: list[dict[str, Any]] = []
    for d in ledger.defects:
        entry = {
            "id": d.id,
            "component": d.component,
            "affected": d.affected,
            "fixed": d.fixed,
            "effect": d.effect,
            "trigger": dict(d.trigger),
            "patched_by": d.patched_by,
            "url": d.url,
            "title": d.title,
        }
        if stack_name:
            entry["standing"] = d.standing(pins.get(d.component))
        listed.append(entry)
    head = ("DEFECT", "COMPONENT", "AFFECTED", "FIXED", "EFFECT", "TRIGGER")
    table: list[tuple[str, ...]] = [head + (("STANDING",) if stack_name else ())]
    for e in listed:
        trigger = ", ".join(f"{k}={v}" for k, v in e["trigger"].items()) or "any preset"
        row = (e["id"], e["component"], e["affected"], e["fixed"] or "-", e["effect"], trigger)
        table.append(row + ((e["standing"],) if stack_name else ()))
    return Shown({"stack": stack_name, "pins": pins, "defects": listed}, columns(table))
