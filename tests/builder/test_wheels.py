"""The kernels wheel a stack pins matches that stack, read from the wheel itself."""

from __future__ import annotations

import dataclasses

import pytest
from support import ROOT, wheels

from arcvllm import stack

CACHE = ROOT / "build" / "wheels"


@pytest.mark.vllm
def test_xpu_0_33_kernels_are_linked_against_the_sycl_runtime_the_stack_installs():
    """vllm_xpu_kernels 0.1.15.4 (PyPI, sha256-pinned) declares no Requires-Dist; its
    extensions need libsycl.so.9, which 0.33's oneAPI 2026.1.1 override provides."""
    verdict = wheels.check(stack.get("xpu-0.33"), ROOT, CACHE)
    assert verdict is not None
    assert verdict.torch_requirement is None
    assert verdict.needs_libsycl == {"libsycl.so.9"}
    assert verdict.sycl_runtime == "intel-sycl-rt==2026.1.1"
    assert verdict.problems == []


@pytest.mark.vllm
def test_kernels_built_for_another_sycl_runtime_are_caught():
    verdict = wheels.check(stack.get("xpu-0.33"), ROOT, CACHE)
    older = dataclasses.replace(verdict, provides_libsycl={"libsycl.so.8"})
    assert older.problems == [
        f"{verdict.wheel} needs libsycl.so.9; {verdict.sycl_runtime} provides libsycl.so.8"
    ]


def test_github_release_kernels_have_their_evidence_in_the_stacks_file():
    """Where the wheel is not on an index, the stack records what its source tag declares."""
    for name in ("xpu-0.20", "xpu-0.23"):
        s = stack.get(name)
        assert wheels.check(s, ROOT, CACHE) is None
        assert "torch 2.11.0+xpu" in " ".join(s.args["VLLM_XPU_KERNELS"].source.split())
