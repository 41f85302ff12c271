"""The stacks file: the three stacks, their provenance, and agreement with the Dockerfile."""

from __future__ import annotations

import shlex
import subprocess

import pytest
import yaml
from support import ROOT

from arcvllm import stack
from arcvllm.builder import dockerfile, image, index
from arcvllm.cli import main
from arcvllm.errors import ArcvllmError

DOCKERFILE = ROOT / "docker" / "Dockerfile"


@pytest.fixture(scope="module")
def stacks():
    return stack.load()


def test_the_newest_stack_with_the_pointer_bugs_needs_both_pointer_patches(stacks):
    """xpu-0.23 is a release the series patches (both pointer fixes), not one that already
    carries upstream's fixes. It is no longer the default: the defect ledger picks the
    default (tests/test_defects.py), and 0.23's kernels carry vllm-xpu-kernels#411."""
    from arcvllm.patching import series

    by_name, defaults = stacks
    assert defaults["xpu"] != "xpu-0.23"
    flagship = by_name["xpu-0.23"]
    entries = series.entries_for(series.load(), series.parse_version(flagship.vllm_version))
    applied = {e.patch.name for e in entries if e.expect == series.APPLY}
    assert {"mamba-copy-uint64", "mamba-fused-u64"} <= applied


def test_an_xpu_stack_serves_the_cpu_stacks_release(stacks):
    """xpu-0.32 runs the vLLM the CPU image serves end to end (its description says so):
    bumping one without the other makes it false."""
    by_name, _ = stacks
    assert by_name["xpu-0.32"].vllm_version == by_name["cpu"].vllm_version
    assert "the release the CPU stack serves" in " ".join(by_name["xpu-0.32"].description.split())


def test_every_pin_says_where_it_came_from(stacks):
    by_name, _ = stacks
    for s in by_name.values():
        for key, pin in s.args.items():
            assert pin.source, f"{s.name}: {key} has no `from`"


def test_no_download_host_in_the_stacks_file():
    """The sdist is named by version and sha256; its URL comes from pip's configured index."""
    assert "pythonhosted" not in stack.stacks_file().read_text()


def test_sdist_url_is_asked_of_the_configured_index(stacks, monkeypatch):
    asked = []
    monkeypatch.setattr(
        index, "file_url", lambda *a: asked.append(a) or "https://mirror.invalid/vllm.tar.gz"
    )
    by_name, _ = stacks
    args = index.build_args(by_name["xpu-0.23"])
    assert args["VLLM_SDIST_URL"] == "https://mirror.invalid/vllm.tar.gz"
    assert asked == [("vllm", "vllm-0.23.0.tar.gz", args["VLLM_SDIST_SHA256"])]


def test_pin_without_provenance_is_refused():
    data = {"stacks": {"x": {"flavor": "cpu", "vllm": {"version": "1"}, "args": {"A": "1"}}}}
    with pytest.raises(ArcvllmError, match="needs `value` and `from`"):
        stack.parse(data)


def test_differences_are_read_with_the_stack_and_must_be_a_mapping():
    entry = {"flavor": "xpu", "vllm": {"version": "1"}, "differences": {"a fact": "  why\n"}}
    stacks, _ = stack.parse({"stacks": {"x": entry}})
    assert stacks["x"].differences == {"a fact": "why"}
    entry["differences"] = ["a fact"]
    with pytest.raises(ArcvllmError, match="`differences:` must map a fact to a reason"):
        stack.parse({"stacks": {"x": entry}})


def test_every_reader_of_the_stacks_file_goes_through_stack_read():
    """One loader: no other module of the package opens configs/stacks.yaml itself."""
    readers = [
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "arcvllm").rglob("*.py")
        if 'stacks.yaml"' in path.read_text() and path.name != "stack.py"
    ]
    assert readers == []


def test_default_of_the_wrong_flavour_is_refused():
    data = {
        "defaults": {"xpu": "x"},
        "stacks": {"x": {"flavor": "cpu", "vllm": {"version": "1"}}},
    }
    with pytest.raises(ArcvllmError, match="not a xpu stack"):
        stack.parse(data)


def test_no_arg_a_stack_sets_has_a_default_in_the_dockerfile(stacks):
    assert dockerfile.mismatches(DOCKERFILE.read_text(), *stacks) == []


@pytest.mark.parametrize(
    "arg,default",
    [
        ("TORCH_VERSION", "2.13.0+cpu"),  # a stage's ARG, even equal to the stack's value
        ("FLAVOR", "cpu"),  # a global ARG that names FROM stages
        ("XPU_LOCK", "configs/locks/xpu-0.23.txt"),  # an XPU-only pin
    ],
)
def test_a_default_for_a_stack_pin_is_caught(stacks, arg, default):
    text = DOCKERFILE.read_text()
    assert f"ARG {arg}\n" in text
    problems = dockerfile.mismatches(
        text.replace(f"ARG {arg}\n", f"ARG {arg}={default}\n", 1), *stacks
    )
    assert len(problems) == 1 and f"ARG {arg} " in problems[0], problems


def test_a_pin_the_dockerfile_ignores_is_caught(tmp_path, stacks):
    data = yaml.safe_load(stack.stacks_file().read_text())
    data["stacks"]["cpu"]["args"]["NEW_PIN"] = {"value": "1", "from": "test"}
    by_name, defaults = stack.parse(data)
    problems = dockerfile.mismatches(DOCKERFILE.read_text(), by_name, defaults)
    assert problems == ["stack cpu: NEW_PIN is no ARG of the Dockerfile"]


def test_build_args_quote_values_with_spaces(stacks):
    by_name, _ = stacks
    words = shlex.split(stack.render_build_args(by_name["xpu-0.20"].build_args()))
    pairs = dict(w.split("=", 1) for w in words if w != "--build-arg")
    assert pairs["FLAVOR"] == "xpu"
    assert pairs["STACK"] == "xpu-0.20"
    assert pairs["GPU_DEBS"].count("https://") == 8


def test_cli_list_and_unknown_stack(capsys):
    assert main(["stack", "list"]) == 0
    out = capsys.readouterr().out
    assert "xpu-0.33 (default)" in out and "cpu (default)" in out
    assert main(["stack", "show", "nope"]) == 2
    known = ", ".join(stack.load()[0])  # in the file's order
    assert known.startswith("xpu-0.20, xpu-0.23, ") and known.endswith(", cpu")
    assert f"unknown stack 'nope'; stacks: {known}" in capsys.readouterr().err


def test_cli_flavour_mismatch(capsys):
    assert main(["stack", "build-args", "xpu-0.33", "--flavor", "cpu"]) == 2
    assert "stack xpu-0.33 is xpu, not cpu; cpu stacks: cpu" in capsys.readouterr().err


def test_cli_get(capsys):
    assert main(["stack", "get", "xpu-0.33", "VLLM_VERSION"]) == 0
    assert capsys.readouterr().out.strip() == "0.33.0"


def test_make_build_with_an_unknown_stack_lists_stacks_and_fails():
    result = subprocess.run(
        ["make", "-s", "build", "STACK=nope", "DOCKER=false"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "unknown stack 'nope'" in result.stderr
    assert "xpu-0.33" in result.stdout and "cpu (default)" in result.stdout


def test_ci_build_args_are_the_xpu_stacks_own_with_flavor_xpu(stacks, monkeypatch, tmp_path):
    """CI builds the operator's XPU build: same flavour, stages and locks (the stand-ins of
    arcvllm/ci/standins.yaml replace only unreachable inputs: tests/ci/test_standins.py)."""
    from arcvllm.ci import standins

    monkeypatch.setattr(index, "file_url", lambda *a: "https://mirror.invalid/vllm.tar.gz")
    config = standins.load()
    standins.make_wheels(config, tmp_path)
    standins.make_oneccl(config, tmp_path)
    debs = config.entry("gpu-debs")
    (tmp_path / debs["dir"]).mkdir()
    for name, (version, _) in debs["packages"].items():
        (tmp_path / debs["dir"] / standins._deb_file(name, version)).write_bytes(b"")
    by_name, _ = stacks
    real = index.build_args(by_name["xpu-0.20"])
    args = image.ci_build_args(by_name["xpu-0.20"], tmp_path)
    assert args["FLAVOR"] == "xpu"
    kept = "STACK VLLM_VERSION VLLM_SDIST_SHA256 XPU_LOCK TORCH_VERSION PYTHON_VERSION"
    kept += " TRITON_REINSTALL ONEAPI_PIP VLLM_DEPS_FROM PRESET"
    for key in kept.split():
        assert args[key] == real[key], key
    assert args["XPU_BASE_IMAGE"] == "arcvllm-standin/ubuntu:24.04"


def test_ci_build_args_of_a_cpu_stack_are_refused(stacks):
    by_name, _ = stacks
    with pytest.raises(ArcvllmError, match="CI stand-ins are for xpu"):
        image.ci_build_args(by_name["cpu"])


def test_each_stack_defaults_to_a_preset_that_lists_it(stacks):
    """The image's default preset must be one its own release can load (presets --check)."""
    by_name, _ = stacks
    presets_dir = ROOT / "configs" / "presets"
    for s in by_name.values():
        preset = yaml.safe_load((presets_dir / f"{s.build_args()['PRESET']}.yaml").read_text())
        assert s.name in preset.get("stacks", [s.name]), f"{s.name}: {preset['name']}"
