"""The stacks the tests parametrize over, read from configs/stacks.yaml, so that a stack
added there is tested (and rehearsed: `make rehearsal STACK=...` selects its tests by name)
without a list to extend here."""

from __future__ import annotations

from arcvllm import stack

_STACKS = stack.load()[0]

# Every XPU stack, in the file's order, and its vLLM release.
XPU_VERSIONS = [(name, s.vllm_version) for name, s in _STACKS.items() if s.flavor == "xpu"]
XPU_STACKS = [name for name, _ in XPU_VERSIONS]
# The XPU stacks that install oneCCL from Intel's offline installer (ONECCL: installer).
INSTALLER_STACKS = [
    name for name in XPU_STACKS if _STACKS[name].build_args().get("ONECCL") == "installer"
]
