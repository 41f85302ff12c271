"""The CPU implementations of vLLM's fused mamba align kernels, on host memory (numpy).

Each case builds state tensors and a block table the way vLLM lays them out (one row of
block ids per request, a state block per block id) and checks the bytes that moved
against the copy specs the kernels mirror: a conv state's window shifts by the
accepted-token bias, a temporal state takes the accepted column's block.
"""

from __future__ import annotations

import numpy as np
import pytest
from support import ROOT
from support.venvs import site_packages, vllm_env

from arcvllm.serving import cpukernels as K

BLOCKS, CONV_WIDTH, CONV_DIM, TEMPORAL = 8, 3, 4, 6


def _i64(addr: int) -> int:
    """The int64 vLLM stores a pointer as (`_reinterpret_u64_as_i64`)."""
    return addr - (1 << 64) if addr >= (1 << 63) else addr


class Layout:
    """One conv state ([block, width, dim] fp32), one temporal state ([block, n] fp32),
    one mamba group, block table rows of 6 block ids."""

    def __init__(self, rows: list[list[int]]) -> None:
        rng = np.random.default_rng(0)
        self.conv = rng.standard_normal((BLOCKS, CONV_WIDTH, CONV_DIM)).astype(np.float32)
        self.temporal = rng.standard_normal((BLOCKS, TEMPORAL)).astype(np.float32)
        self.table = np.array(rows, dtype=np.int32)
        states = (self.conv, self.temporal)
        self.meta = dict(
            block_table_ptrs=np.array([_i64(self.table.ctypes.data)], dtype=np.int64),
            block_table_stride_req=self.table.shape[1],
            state_base_addrs=np.array([_i64(s.ctypes.data) for s in states], dtype=np.int64),
            state_block_strides=np.array([s.strides[0] for s in states], dtype=np.int64),
            state_elem_sizes=np.array([4, 4], dtype=np.int32),
            state_inner_sizes=np.array([CONV_DIM, TEMPORAL], dtype=np.int64),
            state_conv_widths=np.array([CONV_WIDTH, 0], dtype=np.int32),
            state_group_indices=np.array([0, 0], dtype=np.int32),
            state_dim_row_count=np.zeros(2, dtype=np.int32),
            state_dim_row_stride=np.zeros(2, dtype=np.int64),
        )

    def precopy(self, dst_col: list[int], src_col: list[int], bias: list[int]) -> None:
        K.precopy_mamba_align_fused(
            np.array(dst_col, dtype=np.int32),
            np.array(src_col, dtype=np.int32),
            np.array(bias, dtype=np.int32),
            *self.meta.values(),
            None,
            len(dst_col),
            COPY_BLOCK_SIZE=1024,
            CONV_STATE_DIM_FIRST=False,
            HAS_IDX_MAPPING=False,
        )


def test_precopy_shifts_the_conv_window_and_takes_the_accepted_temporal_block():
    layout = Layout([[5, 1, 2, 3, 0, 0], [4, 6, 7, 0, 0, 0]])
    conv, temporal = layout.conv.copy(), layout.temporal.copy()
    # Request 0 moves from column 0 (block 5) to column 2 (block 2), one draft accepted;
    # request 1 stays in its block: nothing moves.
    layout.precopy(dst_col=[2, 1], src_col=[0, 1], bias=[1, 0])
    expected_conv = conv.copy()
    expected_conv[2, : CONV_WIDTH - 1] = conv[5, 1:]
    expected_temporal = temporal.copy()
    expected_temporal[2] = temporal[1]  # column 0 + bias 1 -> block 1
    np.testing.assert_array_equal(layout.conv, expected_conv)
    np.testing.assert_array_equal(layout.temporal, expected_temporal)


def test_precopy_of_a_fresh_request_copies_nothing():
    layout = Layout([[5, 1, 2, 3, 0, 0]])
    conv, temporal = layout.conv.copy(), layout.temporal.copy()
    layout.precopy(dst_col=[1], src_col=[-1], bias=[0])
    np.testing.assert_array_equal(layout.conv, conv)
    np.testing.assert_array_equal(layout.temporal, temporal)


def _postprocess(layout: Layout, accepted: int, state_idx: int, computed: int, drafts: int):
    out = np.array([accepted], dtype=np.int32)
    K.postprocess_mamba_fused(
        np.array([accepted], dtype=np.int32),
        np.array([state_idx], dtype=np.int32),
        np.array([drafts + 1], dtype=np.int32),  # scheduled: the last token + drafts
        np.array([computed], dtype=np.int32),
        np.array([drafts], dtype=np.int32),
        *layout.meta.values(),
        out,
        None,
        1,
        block_size=4,
        COPY_BLOCK_SIZE=1024,
        CONV_STATE_DIM_FIRST=False,
        HAS_IDX_MAPPING=False,
    )
    return int(out[0])


def test_postprocess_keeps_the_state_at_the_boundary_the_accepted_tokens_reached():
    # Block size 4; 6 tokens computed, running state in column 1 (block 1); step of the
    # last token + 2 drafts, both accepted: the sequence reaches 9 tokens, crossing 8,
    # so the state after token 8 (drafted column 1 + bias 1) is kept in column 1.
    layout = Layout([[5, 1, 2, 3, 0, 0]])
    temporal = layout.temporal.copy()
    count = _postprocess(layout, accepted=3, state_idx=1, computed=6, drafts=2)
    expected = temporal.copy()
    expected[1] = temporal[2]  # bt[src 1 + bias 1] = block 2 -> bt[dst 1] = block 1
    np.testing.assert_array_equal(layout.temporal, expected)
    assert count == 1  # the kept state now sits at the start of its block


def test_postprocess_leaves_a_step_that_reaches_no_boundary_alone():
    layout = Layout([[5, 1, 2, 3, 0, 0]])
    conv, temporal = layout.conv.copy(), layout.temporal.copy()
    assert _postprocess(layout, accepted=1, state_idx=1, computed=4, drafts=2) == 1
    np.testing.assert_array_equal(layout.conv, conv)
    np.testing.assert_array_equal(layout.temporal, temporal)


@pytest.mark.parametrize("value", [0x1000, (1 << 63) + 0x1000])
def test_metadata_pointers_are_read_as_u64(value):
    assert K.u64(_i64(value)) == value


def test_every_kernel_vllm_launches_has_an_implementation():
    assert set(K.IMPLEMENTATIONS) == set(K.KERNELS)


# Who, among the installed distributions, asks for triton on Linux x86_64 (no extra).
WHO_NEEDS_TRITON = """
import importlib.metadata as md
from packaging.requirements import Requirement
env = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
names = set()
for dist in md.distributions():
    for text in dist.requires or []:
        req = Requirement(text)
        if req.name == "triton" and (req.marker is None or req.marker.evaluate(env)):
            names.add(dist.metadata["Name"].lower())
print(" ".join(sorted(names)))
"""


@pytest.mark.vllm
def test_the_cpu_lock_leaves_out_triton_which_only_xgrammar_asks_for_and_vllm_disables():
    """PyPI's triton (1 GB, CUDA only) is not in the CPU venv: of the lock's distributions
    only xgrammar requires it, and vLLM's CPU platform turns off a Triton without a CPU
    backend, so the server runs the same without it (these kernels stand in)."""
    lock = (ROOT / "configs" / "locks" / "cpu.txt").read_text().splitlines()
    assert not [line for line in lock if line.startswith("triton==")]
    env = vllm_env("0.32.0")
    out = env.run("-c", WHO_NEEDS_TRITON, check=True)
    assert out.stdout.split() == ["xgrammar"], out.stdout
    importing = site_packages(env) / "vllm" / "triton_utils" / "importing.py"
    assert "doesn't include CPU backend" in importing.read_text()
    assert "HAS_TRITON = False" in importing.read_text()
