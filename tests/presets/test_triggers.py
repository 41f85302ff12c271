"""The ledger's release-decided triggers (compiled, xpu_graph, prefix_caching): the pure
reading of a release's configuration, and each key flipped on real releases' own code."""

from __future__ import annotations

from dataclasses import replace

import pytest

from arcvllm import defects as D
from arcvllm import presets as P
from arcvllm import stack
from arcvllm.builder import kernels as K
from arcvllm.builder import triggers as B
from arcvllm.presets import triggers as T

TP = P.get_preset("qwen3.6-35b-a3b-w4a16-2xb70")
DEFAULT = P.get_preset(P.DEFAULT_XPU_PRESET)
STACKS, DEFAULTS = stack.load()


def with_args(preset: P.Preset, name: str, drop: tuple[str, ...] = (), **args) -> P.Preset:
    kept = {k: v for k, v in preset.vllm_args.items() if k not in drop}
    return replace(preset, name=name, vllm_args={**kept, **args})


# The TP preset as vLLM would run it without the setting that keeps graphs off.
GRAPHS = with_args(TP, "graphs", drop=("compilation-config",))
EAGER = with_args(TP, "eager", **{"enforce-eager": True})
NO_CACHE = with_args(TP, "no-cache", **{"enable-prefix-caching": False})
GRAPH_ENV = replace(GRAPHS, name="graph-env", env={**GRAPHS.env, "VLLM_XPU_ENABLE_XPU_GRAPH": "1"})


# ---- pure ----


def test_a_releases_configuration_reads_as_the_trigger_values():
    report = {
        "compilation_mode": 3,
        "cudagraph_mode": "FULL_AND_PIECEWISE",
        "enable_prefix_caching": True,
        "mamba_cache_mode": "align",
    }
    assert T.engine_of(report, "0.32.0") == T.Engine(
        True, True, "align", "vLLM 0.32.0's own configuration"
    )
    off = {**report, "compilation_mode": 0, "cudagraph_mode": "NONE"}
    got = T.engine_of({**off, "enable_prefix_caching": False}, "0.32.0")
    assert (got.compiled, got.xpu_graph, got.prefix_caching) == (False, False, None)


def test_without_a_release_the_flags_worst_case_is_assumed_and_said_so():
    graphs = T.assumed(GRAPHS, "no venv")
    assert (graphs.compiled, graphs.xpu_graph, graphs.prefix_caching) == (True, True, "align")
    assert graphs.source == "assumed (no venv)"
    shipped = T.assumed(TP, "no venv")
    assert (shipped.compiled, shipped.xpu_graph) == (True, False)
    eager = T.assumed(EAGER, "no venv")
    assert (eager.compiled, eager.xpu_graph) == (False, False)
    assert T.assumed(NO_CACHE, "no venv").prefix_caching is None


def test_the_probe_gets_the_presets_arguments_without_the_tokenizers_and_its_vllm_env():
    request = T.request_of(GRAPH_ENV, "0.32.0", "2.14.0+xpu")
    assert "--reasoning-parser" not in request.args and "--tensor-parallel-size" in request.args
    assert request.env == {
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "VLLM_XPU_ENABLE_XPU_GRAPH": "1",
    }
    assert request.torch == "2.14.0+xpu"


def test_a_tp_preset_that_replays_graphs_is_affected_by_48327_and_the_shipped_one_is_not():
    ledger = D.load()
    pins = D.pinned_versions(STACKS["xpu-0.33"])
    on = T.Engine(True, True, "align", "read")
    off = T.Engine(True, False, "align", "read")
    graphs = D.verdict(ledger, "p", P.defect_settings(GRAPHS, on), "xpu-0.33", pins)
    assert "vllm#48327" in graphs.affected and not graphs.clean
    shipped = D.verdict(ledger, "p", P.defect_settings(TP, off), "xpu-0.33", pins)
    assert "vllm#48327" not in shipped.affected + shipped.unknown


# ---- each key flipped on a real release's own code ----


def read(version: str, *presets: P.Preset) -> dict[str, T.Engine]:
    torch = {
        s.vllm_version: str(s.args["TORCH_VERSION"].value)
        for s in STACKS.values()
        if s.flavor == "xpu"
    }[version]
    found = B.read(K.find_release(version), [T.request_of(p, version, torch) for p in presets])
    for name, answer in found.items():
        assert isinstance(answer, T.Engine), (version, name, answer)
    return found  # type: ignore[return-value]


@pytest.fixture(scope="module")
def v032() -> dict[str, T.Engine]:
    return read("0.32.0", GRAPHS, TP, EAGER, NO_CACHE, DEFAULT)


@pytest.fixture(scope="module")
def v023() -> dict[str, T.Engine]:
    return read("0.23.0", GRAPHS, GRAPH_ENV, DEFAULT)


@pytest.fixture(scope="module")
def v033() -> dict[str, T.Engine]:
    return read("0.33.0", GRAPHS, TP, DEFAULT)


@pytest.mark.vllm
def test_xpu_graphs_are_on_by_default_in_0_32_and_off_with_eager_or_cudagraph_mode_none(v032):
    assert v032["graphs"].xpu_graph
    assert not v032["qwen3.6-35b-a3b-w4a16-2xb70"].xpu_graph
    assert not v032["eager"].xpu_graph
    assert v032["graphs"].source == "vLLM 0.32.0's own configuration"


@pytest.mark.vllm
def test_xpu_graphs_are_off_in_0_23_unless_its_environment_variable_is_set(v023):
    assert not v023["graphs"].xpu_graph
    assert v023["graph-env"].xpu_graph


@pytest.mark.vllm
def test_xpu_graphs_are_on_by_default_in_0_33_from_its_sdist_source(v033):
    assert v033["graphs"].xpu_graph
    assert not v033["qwen3.6-35b-a3b-w4a16-2xb70"].xpu_graph


@pytest.mark.vllm
def test_compilation_is_on_unless_eager_and_cudagraph_mode_none_keeps_it(v032):
    assert v032["graphs"].compiled
    assert v032["qwen3.6-35b-a3b-w4a16-2xb70"].compiled
    assert not v032["eager"].compiled


@pytest.mark.vllm
def test_prefix_caching_is_read_in_align_mode_and_off_when_the_preset_turns_it_off(v032, v023):
    assert v032["qwen3.6-35b-a3b-w4a16-2xb70"].prefix_caching == "align"
    assert v023["graphs"].prefix_caching == "align"
    assert v032["no-cache"].prefix_caching is None


@pytest.mark.vllm
def test_the_ledger_names_48327_where_the_release_replays_graphs_and_keeps_the_default(
    v023, v032, v033
):
    ledger = D.load()
    by_stack = {"xpu-0.23": v023, "xpu-0.32": v032, "xpu-0.33": v033}
    for name, found in by_stack.items():
        pins = D.pinned_versions(STACKS[name])
        graphs = D.verdict(ledger, "g", P.defect_settings(GRAPHS, found["graphs"]), name, pins)
        shipped_engine = found.get(TP.name) or found["graphs"]
        shipped = D.verdict(ledger, "s", P.defect_settings(TP, shipped_engine), name, pins)
        if name == "xpu-0.23":  # graphs off by 0.23.0's own default
            assert "vllm#48327" not in graphs.affected
        else:
            assert "vllm#48327" in graphs.affected, (name, graphs)
            assert "vllm#48327" not in shipped.affected, (name, shipped)
    engines = {(DEFAULT.name, n): found[DEFAULT.name] for n, found in by_stack.items()}
    xpu = [n for n, s in STACKS.items() if s.flavor == "xpu"]
    settings = P.check.stack_settings(DEFAULT, xpu, engines)
    assert D.default_stack(ledger, settings, STACKS) == DEFAULTS["xpu"]
