"""Behavioural probes: run the real (patched or not) vLLM code path each patch fixes.

Each probe imports the vLLM found first on sys.path and calls the function a patch
changes, on the CPU, with inputs that trigger the bug. A probe returns None when the
code behaves, or a one-line reason when it does not; an exception from the probe's own
set-up (the code is not shaped as expected) is reported separately as an error.

Device pointers >= 2**63 are EMULATED here: no CPU hands them out, so the state tensors
are stand-ins whose data_ptr() reports addresses in the upper half of the address
space, as Intel XPU allocations have. Nothing is ever read from or written to them.

Run as `python -m arcvllm.patching.probe NAME...` in the environment that carries the target:
prints one JSON object per probe.
"""

from __future__ import annotations

import inspect
import json
import logging
import sys
import traceback
from collections.abc import Callable
from types import SimpleNamespace

# Mixed high and low addresses; the first is what an Arc Pro B70 handed out.
STATE_BASES = (0xFFFF_D556_B640_0000, 0x0000_7F3A_1200_0000, (1 << 63) + 0x4000_0000)
BLOCK_BYTES = 4096
NUM_BLOCKS = 8
ELEMENT_SIZE = 2


def _i64(value: int) -> int:
    return value - (1 << 64) if value >= (1 << 63) else value


class _Block:
    """One block of an emulated state tensor: an address and a size, no memory."""

    def __init__(self, addr: int, numel: int) -> None:
        self._addr, self._numel = addr, numel

    def data_ptr(self) -> int:
        return self._addr

    def numel(self) -> int:
        return self._numel

    def element_size(self) -> int:
        return ELEMENT_SIZE


class _State:
    """A [num_blocks, block_elems] state tensor whose storage starts at BASE."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.block_elems = BLOCK_BYTES // ELEMENT_SIZE
        self.shape = (NUM_BLOCKS, self.block_elems)

    def __getitem__(self, block: int) -> _Block:
        return _Block(self.block_addr(block), self.block_elems)

    def block_addr(self, block: int) -> int:
        return self.base + block * BLOCK_BYTES

    def data_ptr(self) -> int:
        return self.base

    def element_size(self) -> int:
        return ELEMENT_SIZE

    def numel(self) -> int:
        return NUM_BLOCKS * self.block_elems

    def dim(self) -> int:
        return 2

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def stride(self, dim: int) -> int:
        return (self.block_elems, 1)[dim]


class _BlockTable:
    def __init__(self, addr: int) -> None:
        self._addr = addr

    def data_ptr(self) -> int:
        return self._addr

    def stride(self, dim: int) -> int:
        return (64, 1)[dim]


def _mamba_setup(layers: int):
    """Real MambaSpec and copy functions of the release, in the shapes it expects."""
    import torch
    from vllm.model_executor.layers.mamba import mamba_utils as layer_utils
    from vllm.v1.kv_cache_interface import MambaSpec
    from vllm.v1.worker import mamba_utils

    spec = MambaSpec(
        block_size=64,
        shapes=((BLOCK_BYTES // ELEMENT_SIZE,), (BLOCK_BYTES // ELEMENT_SIZE,)),
        dtypes=(torch.bfloat16, torch.bfloat16),
    )
    names = [f"model.layers.{i}.linear_attn" for i in range(layers)]
    kv_cache_config = SimpleNamespace(
        kv_cache_groups=[SimpleNamespace(kv_cache_spec=spec, layer_names=names)]
    )
    temporal = layer_utils.get_temporal_copy_spec
    funcs = (temporal, temporal)
    # From 0.30 the copy functions are keyed by the layer's mamba type.
    by_type = hasattr(mamba_utils, "_get_mamba_spec_for_layer")
    copy_funcs = {spec.mamba_type: funcs} if by_type else funcs
    return mamba_utils, kv_cache_config, copy_funcs, funcs, names


def _make_buffer(n: int, dtype):
    from vllm.v1.utils import CpuGpuBuffer

    return CpuGpuBuffer(n, dtype=dtype, device="cpu", pin_memory=False)


def _call(func: Callable, **available):
    """Call FUNC with the arguments its signature in this release asks for."""
    params = inspect.signature(func).parameters
    return func(**{name: available[name] for name in params if name in available})


def probe_mamba_copy_uint64() -> str | None:
    """collect_mamba_copy_meta stores source and destination pointers >= 2**63 by bits."""
    import numpy as np
    import torch

    mamba_utils, kv_cache_config, copy_funcs, funcs, names = _mamba_setup(len(STATE_BASES))
    bufs = _call(
        mamba_utils.MambaCopyBuffers.create,
        max_num_reqs=2,
        kv_cache_config=kv_cache_config,
        copy_funcs=copy_funcs,
        make_buffer=_make_buffer,
    )
    states = [_State(base) for base in STATE_BASES]
    # 0.17-0.18 keep a list of states per virtual engine.
    nested = "attention.kv_cache[0]" in inspect.getsource(mamba_utils.collect_mamba_copy_meta)
    forward_context = {
        name: SimpleNamespace(kv_cache=[[s, s]] if nested else [s, s])
        for name, s in zip(names, states, strict=True)
    }
    block_ids = [3, 5, 6, 7]
    src_idx, dest_idx, bias = 1, 2, 0
    try:
        _call(
            mamba_utils.collect_mamba_copy_meta,
            copy_bufs=bufs,
            kv_cache_config=kv_cache_config,
            mamba_state_copy_funcs=copy_funcs,
            mamba_group_ids=[0],
            src_block_idx=src_idx,
            dest_block_idx=dest_idx,
            accept_token_bias=bias,
            req_state=SimpleNamespace(block_ids=(block_ids,)),
            forward_context=forward_context,
        )
    except (OverflowError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    expected = [
        (s.block_addr(block_ids[src_idx + bias]), s.block_addr(block_ids[dest_idx]))
        for s in states
        for _ in funcs
    ]
    if bufs.offset != len(expected):
        return f"{bufs.offset} copy entries recorded, expected {len(expected)}"
    for what, buf in (("src", bufs.src_ptrs), ("dst", bufs.dst_ptrs)):
        # The copy kernel reads the tensor: it must hold whole 64-bit words.
        if buf.cpu.element_size() != 8:
            return f"{what}_ptrs holds {buf.cpu.dtype} elements; a pointer needs 8 bytes"
    for i, (src, dst) in enumerate(expected):
        for what, buf, addr in (("src", bufs.src_ptrs, src), ("dst", bufs.dst_ptrs, dst)):
            bits = int(buf.np.view(np.uint64)[i])
            word = int(buf.cpu.view(torch.int64)[i])
            if bits != addr or word != _i64(addr):
                return f"{what}_ptrs[{i}] holds {bits:#x} ({word}), expected {addr:#x}"
    return None


def probe_mamba_fused_u64() -> str | None:
    """The fused spec-decode metadata keeps state and block-table pointers >= 2**63."""
    mamba_utils, kv_cache_config, copy_funcs, funcs, names = _mamba_setup(len(STATE_BASES))
    states = [_State(base) for base in STATE_BASES]
    forward_context = {
        name: SimpleNamespace(kv_cache=[s, s]) for name, s in zip(names, states, strict=True)
    }
    ctx = _call(
        mamba_utils.MambaSpecDecodeGPUContext.create,
        max_num_reqs=2,
        kv_cache_config=kv_cache_config,
        num_state_types=len(funcs),
        copy_funcs=copy_funcs,
        device="cpu",
        make_buffer=_make_buffer,
        forward_context=forward_context,  # from 0.34: it counts the states there
    )
    table = _BlockTable(0xFFFF_D556_B800_0000)
    try:
        _call(
            ctx.initialize_from_forward_context,
            kv_cache_config=kv_cache_config,
            forward_context=forward_context,
            mamba_state_copy_funcs=copy_funcs,
            block_tables=[table],
        )
    except (OverflowError, ValueError, RuntimeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    stored = [int(v) for v in ctx.state_base_addrs.tolist()]
    expected = [_i64(s.base) for s in states for _ in funcs]
    if stored != expected:
        return f"state_base_addrs hold {stored}, expected {expected}"
    if int(ctx.block_table_ptrs[0]) != _i64(table.data_ptr()):
        return f"block_table_ptrs[0] holds {int(ctx.block_table_ptrs[0])}"
    return None


def probe_mamba_block_size_align_warning() -> str | None:
    """Align mode names a --mamba-block-size it overrides, and stays quiet otherwise."""
    import torch
    from vllm.config import CacheConfig
    from vllm.model_executor.models import ModelRegistry
    from vllm.platforms import interface

    class HybridModel:
        @staticmethod
        def get_mamba_state_shape_from_config(vllm_config):
            return ((3, 512), (4, 64, 64))

        @staticmethod
        def get_mamba_state_dtype_from_config(vllm_config):
            return (torch.bfloat16, torch.bfloat16)

    class Backend:
        @staticmethod
        def get_supported_kernel_block_sizes():
            return [16]

        @staticmethod
        def customize_spec(spec):
            return spec

    def align(mamba_block_size: int | None) -> tuple[int, list[str]]:
        cache = CacheConfig(block_size=16, enable_prefix_caching=True)
        cache.mamba_cache_mode = "align"
        # What a hybrid model config leaves here when the operator gave no value.
        cache.mamba_block_size = mamba_block_size or cache.block_size
        model = SimpleNamespace(
            dtype=torch.bfloat16,
            use_mla=False,
            architecture="HybridProbe",
            get_num_kv_heads=lambda parallel_config: 2,
            get_head_size=lambda: 64,
        )
        vllm_config = SimpleNamespace(
            cache_config=cache,
            model_config=model,
            parallel_config=SimpleNamespace(),
            # No attention layers registered: backend look-ups find none.
            compilation_config=SimpleNamespace(static_forward_context={}),
            # From 0.34 the state alignment asks; FlashInfer is CUDA's alone.
            use_flashinfer_replayssm=False,
        )
        records: list[str] = []
        handler = logging.Handler(logging.WARNING)
        # (a handler of one line; mypy holds methods read-only)
        handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
        logger = logging.getLogger("vllm")
        logger.addHandler(handler)
        saved = ModelRegistry.resolve_model_cls
        ModelRegistry.resolve_model_cls = lambda *a, **k: (HybridModel, "HybridProbe")
        patched_backends = hasattr(interface.Platform, "_find_non_ssm_backends")
        if patched_backends:
            saved_backends = interface.Platform.__dict__["_find_non_ssm_backends"]
            interface.Platform._find_non_ssm_backends = classmethod(lambda cls, cfg: [Backend])
        try:
            interface.Platform._align_hybrid_block_size(vllm_config, Backend)
        finally:
            ModelRegistry.resolve_model_cls = saved
            if patched_backends:
                interface.Platform._find_non_ssm_backends = saved_backends
            logger.removeHandler(handler)
        return cache.block_size, [r for r in records if "mamba-block-size" in r]

    block_size, warnings = align(512)
    if block_size == 512:
        return "the probe chose a mamba block size equal to the attention block size"
    if not warnings:
        return f"--mamba-block-size 512 was replaced by {block_size} without a warning"
    if "512" not in warnings[0] or str(block_size) not in warnings[0]:
        return f"the warning does not name both sizes: {warnings[0]!r}"
    _, unasked = align(None)
    if unasked:
        return f"warned although no --mamba-block-size was given: {unasked[0]!r}"
    return None


def _source_root() -> str:
    """The source tree on sys.path (a release sdist: setup.py beside vllm/)."""
    import os

    for entry in sys.path:
        if os.path.isfile(os.path.join(entry, "setup.py")) and os.path.isdir(
            os.path.join(entry, "vllm")
        ):
            return entry
    raise RuntimeError("no vLLM source tree (setup.py beside vllm/) on sys.path")


def probe_xpu_build_no_spinloop() -> str | None:
    """vLLM's setup.py, run for VLLM_TARGET_DEVICE=xpu with setuptools.setup() recorded
    instead of run: it must declare no `vllm.spinloop` CMake extension (its CMake project
    finds torch, which for torch +xpu needs a SYCL compiler the image does not carry)."""
    import os
    import runpy

    import setuptools

    root = _source_root()
    recorded: dict = {}
    real_setup, cwd = setuptools.setup, os.getcwd()
    setuptools.setup = lambda **kwargs: recorded.update(kwargs)
    os.environ["VLLM_TARGET_DEVICE"] = "xpu"
    try:
        os.chdir(root)
        runpy.run_path(os.path.join(root, "setup.py"), run_name="__main__")
    finally:
        setuptools.setup = real_setup
        os.chdir(cwd)
    if not recorded:
        raise RuntimeError("setup.py never called setuptools.setup()")
    names = [ext.name for ext in recorded.get("ext_modules") or []]
    if "vllm.spinloop" in names:
        return "setup.py builds the vllm.spinloop CMake extension for XPU (needs a SYCL compiler)"
    return None


PROBES: dict[str, Callable[[], str | None]] = {
    "mamba-copy-uint64": probe_mamba_copy_uint64,
    "mamba-fused-u64": probe_mamba_fused_u64,
    "mamba-block-size-align-warning": probe_mamba_block_size_align_warning,
    "xpu-build-no-spinloop": probe_xpu_build_no_spinloop,
}


def run(name: str) -> dict[str, str]:
    """{"probe", "result": pass|fail|error, "detail"} for one probe, in this process."""
    probe = PROBES.get(name)
    if probe is None:
        return {"probe": name, "result": "error", "detail": f"unknown probe {name!r}"}
    try:
        reason = probe()
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        detail = f"{type(exc).__name__}: {exc} ({where.filename}:{where.lineno})"
        return {"probe": name, "result": "error", "detail": detail}
    if reason is None:
        return {"probe": name, "result": "pass", "detail": ""}
    return {"probe": name, "result": "fail", "detail": reason}


def main(argv: list[str]) -> int:
    logging.disable(logging.NOTSET)
    results = [run(name) for name in argv]
    for result in results:
        print("ARCVLLM-PROBE " + json.dumps(result), flush=True)
    return 0 if all(r["result"] == "pass" for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
