"""High-address emulation: make vLLM's mamba copy path see XPU-like pointers on any host.

DIAGNOSTICS ONLY, off unless ARCVLLM_EMULATE_HIGH_ADDRESSES=1. On Intel Arc GPUs device
pointers can be >= 2^63; stored into a signed int64 buffer they raise
`OverflowError: Python int too large to convert to C long` in
`collect_mamba_copy_meta` (the bug the project's patch series fixes). Host pointers on
x86-64 stay below 2^47, so the bug cannot show on CPU. With the variable set, this vLLM
general plugin:

- wraps `collect_mamba_copy_meta` so that every source and destination pointer it reads
  (via `state[block].data_ptr()` in the copy specs and for the destination) has bit 63 set;
- wraps `do_mamba_copy_block` so that, right before the memory copy, the bit is cleared
  again on exactly the entries it tagged (a pointer that was already high stays untouched);
- on the fused speculative-decoding path (vLLM >= 0.22, `MambaSpecDecodeGPUContext`),
  wraps `initialize_from_forward_context` the same way: the state pointers it stores into
  its int64 metadata (`state_base_addrs`, where vllm-project/vllm#48059 overflowed) have
  bit 63 set, and the bit is cleared on exactly those entries before any kernel reads them.

vLLM loads general plugins in every process; the wrappers are installed only where
`vllm.v1.worker.mamba_utils` is imported (the engine's worker), through an import hook, so
the plugin imports nothing from vLLM until then.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys
from typing import Any

ENV = "ARCVLLM_EMULATE_HIGH_ADDRESSES"
TARGET = "vllm.v1.worker.mamba_utils"
BIT63 = 1 << 63
BANNER = (
    "ARCVLLM HIGH-ADDRESS EMULATION IS ON (%s=1): mamba state-copy pointers are tagged with "
    "bit 63 and untagged before the copy. This is an emulation for diagnostics and tests, "
    "not a production setting."
)

logger = logging.getLogger("vllm.arcvllm.emulation")


def enabled(environ: dict[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get(ENV, "") == "1"


def tag(addr: int) -> int:
    """ADDR as an XPU-like high pointer."""
    return addr | BIT63


class _Ledger:
    """The tagged pointers handed out since the last copy, so only those get untagged."""

    def __init__(self) -> None:
        self.tagged: set[int] = set()
        self.copies = 0

    def tag(self, addr: int) -> int:
        if addr & BIT63:
            return addr  # already high (a real XPU pointer): leave it as it is
        tagged = tag(addr)
        self.tagged.add(tagged)
        return tagged


_ledger = _Ledger()


class _TaggedTensor:
    """A view of a state tensor whose `data_ptr()` reads with bit 63 set.

    Indexing yields tagged views again; everything else is the real tensor's.
    """

    __slots__ = ("_tensor",)

    def __init__(self, tensor: Any) -> None:
        self._tensor = tensor

    def __getitem__(self, index: Any) -> _TaggedTensor:
        return _TaggedTensor(self._tensor[index])

    def data_ptr(self) -> int:
        return _ledger.tag(self._tensor.data_ptr())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tensor, name)


class _TaggedLayer:
    """A layer of the forward context whose `kv_cache` states hand out tagged pointers."""

    __slots__ = ("_layer",)

    def __init__(self, layer: Any) -> None:
        self._layer = layer

    @property
    def kv_cache(self) -> list[_TaggedTensor]:
        return [_TaggedTensor(state) for state in self._layer.kv_cache]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._layer, name)


class _TaggedContext(dict):
    """The forward context, with tagged layers."""

    def __getitem__(self, key: str) -> _TaggedLayer:
        return _TaggedLayer(super().__getitem__(key))


def _wrap_collect(original):
    import inspect

    signature = inspect.signature(original)

    def collect_mamba_copy_meta(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.arguments["forward_context"] = _TaggedContext(bound.arguments["forward_context"])
        return original(*bound.args, **bound.kwargs)

    collect_mamba_copy_meta.__wrapped__ = original
    return collect_mamba_copy_meta


def untag_entries(values: Any, tagged: set[int]) -> int:
    """Clear bit 63 in place on the entries of a uint64 numpy view that are in TAGGED."""
    import numpy as np

    count = 0
    for i in range(len(values)):
        if int(values[i]) in tagged:
            values[i] = np.uint64(int(values[i]) & ~BIT63)
            count += 1
    return count


def _wrap_copy(original):
    import numpy as np

    def do_mamba_copy_block(copy_bufs: Any) -> Any:
        n = copy_bufs.offset
        if n:
            stripped = sum(
                untag_entries(buf.np[:n].view(np.uint64), _ledger.tagged)
                for buf in (copy_bufs.src_ptrs, copy_bufs.dst_ptrs)
            )
            _ledger.copies += 1
            if _ledger.copies <= 3 or _ledger.copies % 100 == 0:
                logger.warning(
                    "arcvllm emulation: mamba state copy #%d, %d entries; %d high pointers "
                    "untagged before the copy",
                    _ledger.copies,
                    n,
                    stripped,
                )
        _ledger.tagged.clear()
        return original(copy_bufs)

    do_mamba_copy_block.__wrapped__ = original
    return do_mamba_copy_block


MASK64 = (1 << 64) - 1


def untag_metadata(values: Any, tagged: set[int]) -> int:
    """Clear bit 63 in place on the entries of an int64 tensor whose u64 pattern is in
    TAGGED (stored as two's complement by a fixed vLLM)."""
    count = 0
    for i, value in enumerate(values.tolist()):
        if value & MASK64 in tagged:
            values[i] = (value & MASK64) & ~BIT63
            count += 1
    return count


def _wrap_fused_init(original):
    def initialize_from_forward_context(self, kv_cache_config, forward_context, *a, **kw):
        if self.is_initialized:
            return original(self, kv_cache_config, forward_context, *a, **kw)
        before = set(_ledger.tagged)
        original(self, kv_cache_config, _TaggedContext(forward_context), *a, **kw)
        mine = _ledger.tagged - before
        untagged = untag_metadata(self.state_base_addrs, mine)
        _ledger.tagged -= mine
        logger.warning(
            "arcvllm emulation: fused spec-decode metadata: %d state pointers stored high; "
            "%d high pointers untagged before the kernels",
            len(mine),
            untagged,
        )

    initialize_from_forward_context.__wrapped__ = original
    return initialize_from_forward_context


def install(module: Any) -> None:
    """Wrap the copy functions of a loaded `vllm.v1.worker.mamba_utils` (idempotent)."""
    if getattr(module, "_arcvllm_emulation", False):
        return
    module.collect_mamba_copy_meta = _wrap_collect(module.collect_mamba_copy_meta)
    module.do_mamba_copy_block = _wrap_copy(module.do_mamba_copy_block)
    fused = getattr(module, "MambaSpecDecodeGPUContext", None)
    if fused is not None:
        fused.initialize_from_forward_context = _wrap_fused_init(
            fused.initialize_from_forward_context
        )
    module._arcvllm_emulation = True
    logger.warning("arcvllm emulation: wrapped %s in process %d", TARGET, os.getpid())


class _Hook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Installs the wrappers as soon as the target module has been executed."""

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
    """The `vllm.general_plugins` entry point: a no-op unless the variable is set."""
    if not enabled():
        return
    logger.warning(BANNER, ENV)
    if TARGET in sys.modules:
        install(sys.modules[TARGET])
    elif not any(isinstance(f, _Hook) for f in sys.meta_path):
        sys.meta_path.insert(0, _Hook())
