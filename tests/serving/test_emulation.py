"""The high-address emulation plugin: off by default, tags and untags exactly its pointers.

The end-to-end proof with real servers is in test_emulation_server.py; here the plugin
runs against vLLM 0.32.0's real `collect_mamba_copy_meta` and `do_mamba_copy_block` on
real tensors, as shipped (uint64 buffers) and with vLLM's fix reverted (int64 buffers).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from support import ROOT
from support.venvs import vllm_env

from arcvllm.serving import emulation as E

REVERT = ROOT / "tests" / "support" / "patches" / "vllm-0.32.0-revert-mamba-copy-uint64.patch"


def test_off_unless_the_variable_is_exactly_one():
    assert not E.enabled({})
    assert not E.enabled({E.ENV: "0"})
    assert not E.enabled({E.ENV: "true"})
    assert E.enabled({E.ENV: "1"})


def test_register_is_a_no_op_when_off():
    """In a fresh interpreter: no hook, no banner, nothing of vLLM imported."""
    code = (
        "import sys, logging; logging.basicConfig();"
        "from arcvllm.serving import emulation as E; before = list(sys.meta_path); E.register();"
        "assert sys.meta_path == before; assert 'vllm' not in sys.modules; print('ok')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={"PATH": "/usr/bin"}
    )
    assert out.stdout.strip() == "ok", out.stderr
    assert "EMULATION" not in out.stderr


def test_register_when_on_says_so_and_hooks_the_import():
    code = (
        "import sys, logging; logging.basicConfig();"
        "from arcvllm.serving import emulation as E; E.register(); E.register();"
        "print(sum(isinstance(f, E._Hook) for f in sys.meta_path))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin", E.ENV: "1"},
    )
    assert out.stdout.strip() == "1", out.stderr
    assert "HIGH-ADDRESS EMULATION IS ON" in out.stderr
    assert "not a production setting" in out.stderr


class _FakeTensor:
    def __init__(self, addr: int) -> None:
        self.addr = addr

    def __getitem__(self, index: int) -> _FakeTensor:
        return _FakeTensor(self.addr + 4096 * index)

    def data_ptr(self) -> int:
        return self.addr

    def element_size(self) -> int:
        return 2


def test_tagged_views_report_bit_63_and_delegate_the_rest():
    E._ledger.tagged.clear()
    state = E._TaggedTensor(_FakeTensor(0x7F00_0000_0000))
    assert state[2].data_ptr() == (1 << 63) | (0x7F00_0000_0000 + 8192)
    assert state.element_size() == 2
    # An address that is already high is left as it is, and not recorded for untagging.
    assert E._TaggedTensor(_FakeTensor((1 << 63) + 16)).data_ptr() == (1 << 63) + 16
    assert E._ledger.tagged == {(1 << 63) | (0x7F00_0000_0000 + 8192)}
    E._ledger.tagged.clear()


def test_untag_clears_only_the_entries_it_tagged():
    real_high = (1 << 63) + 0x100
    tagged = E.tag(0x7F00_0000_1000)
    values = np.array([tagged, real_high, 0x1234], dtype=np.uint64)
    assert E.untag_entries(values, {tagged}) == 1
    assert values.tolist() == [0x7F00_0000_1000, real_high, 0x1234]


def test_tagged_context_wraps_layers_lazily():
    layer = type("L", (), {"kv_cache": [_FakeTensor(64)], "name": "x"})()
    ctx = E._TaggedContext({"layer": layer})
    assert ctx["layer"].name == "x"
    assert ctx["layer"].kv_cache[0].data_ptr() & (1 << 63)
    E._ledger.tagged.clear()


# ---------------------------------------------------------------- with vLLM's real code

SCRIPT = r"""
import json, sys
from types import SimpleNamespace
import torch
from vllm.platforms import current_platform
from vllm.model_executor.layers.mamba import mamba_utils as layer_utils
from vllm.v1.kv_cache_interface import MambaSpec
from vllm.v1.utils import CpuGpuBuffer
from vllm.v1.worker import mamba_utils
from arcvllm.serving import emulation

emulation.install(mamba_utils)
current_platform.register_triton_kernel_overrides()
spec = MambaSpec(block_size=64, shapes=((512,),), dtypes=(torch.bfloat16,))
config = SimpleNamespace(kv_cache_groups=[SimpleNamespace(kv_cache_spec=spec, layer_names=["l0"])])
funcs = {spec.mamba_type: (layer_utils.get_temporal_copy_spec,)}
state = torch.arange(8, dtype=torch.bfloat16).repeat_interleave(512).reshape(8, 512).contiguous()
bufs = mamba_utils.MambaCopyBuffers.create(
    2, config, funcs, lambda n, dtype: CpuGpuBuffer(n, dtype=dtype, device="cpu", pin_memory=False)
)
result = {"dtype": str(bufs.src_ptrs.cpu.dtype)}
try:
    mamba_utils.collect_mamba_copy_meta(
        bufs, config, funcs, [0], 1, 2, 0,
        SimpleNamespace(block_ids=([3, 5, 6, 7],)), {"l0": SimpleNamespace(kv_cache=[state])},
    )
except OverflowError as exc:
    result["error"] = f"OverflowError: {exc}"
else:
    import numpy as np
    result["stored_src"] = int(bufs.src_ptrs.np.view(np.uint64)[0])
    result["real_src"] = state[5].data_ptr()
    mamba_utils.do_mamba_copy_block(bufs)
    result["copied"] = bool(torch.equal(state[6], state[5])) and float(state[6][0]) == 5.0
print(json.dumps(result))
"""


def _run(tmp_path, patches=()):
    env = vllm_env("0.32.0")
    extra = {"TMPDIR": str(tmp_path)}
    if patches:
        from support.overlay import make_overlay

        extra["PYTHONPATH"] = str(make_overlay(env.python, tmp_path / "overlay", list(patches)))
    out = env.run("-c", SCRIPT, env=extra, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.vllm
def test_with_vllms_fix_the_copy_sees_high_pointers_and_still_copies(tmp_path):
    result = _run(tmp_path)
    assert result["dtype"] == "torch.uint64"
    assert result["stored_src"] == result["real_src"] | (1 << 63)
    assert result["copied"] is True


@pytest.mark.vllm
def test_with_the_fix_reverted_the_original_overflow_comes_back(tmp_path):
    result = _run(tmp_path, [REVERT])
    assert result["dtype"] == "torch.int64"
    assert result["error"] == "OverflowError: Python int too large to convert to C long"


@pytest.mark.vllm
def test_the_series_patch_on_the_revert_stores_and_copies(tmp_path):
    result = _run(tmp_path, [REVERT, ROOT / "patches" / "vllm" / "mamba-copy-uint64.patch"])
    assert result["dtype"] == "torch.int64"
    assert result["stored_src"] == result["real_src"] | (1 << 63)
    assert result["copied"] is True
