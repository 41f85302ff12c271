"""The defect ledger: its data, each preset x stack verdict, and the default XPU stack."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from arcvllm import cli, stack
from arcvllm import defects as D
from arcvllm import presets as P
from arcvllm.errors import ArcvllmError
from arcvllm.paths import configs_dir

LEDGER = D.load()
STACKS, DEFAULTS = stack.load()
DEFAULT = P.get_preset(P.DEFAULT_XPU_PRESET)
XPU_STACKS = [name for name, s in STACKS.items() if s.flavor == "xpu"]


def per_stack(preset: P.Preset, engines: dict | None = None) -> dict[str, D.Settings]:
    """PRESET's settings on every XPU stack; without ENGINES, the worst its flags allow."""
    return P.check.stack_settings(preset, XPU_STACKS, engines or {})


def raw_ledger() -> dict:
    return yaml.safe_load(D.ledger_file().read_text())


def one(**overrides) -> dict:
    entry = {
        "id": "x#1",
        "url": "https://github.com/o/x/issues/1",
        "title": "t",
        "effect": "wrong-output",
        "component": "vllm-xpu-kernels",
        "affected": "<=0.1.9",
        "fixed": "0.1.10",
        "trigger": {"layers": ["gdn"]},
        "evidence": "read",
    }
    entry.update(overrides)
    return {"defects": [entry]}


# ---- the default stack follows the ledger ----


def test_the_default_xpu_stack_is_the_newest_whose_verdict_for_the_default_preset_is_clean():
    """A ledger change that makes the default dirty fails here (and `presets --check`)."""
    assert DEFAULTS["xpu"] == D.default_stack(LEDGER, per_stack(DEFAULT), STACKS)


def test_a_defect_that_reaches_the_default_stack_moves_the_pick_and_check_names_it():
    data = raw_ledger()
    data["defects"].append(
        {
            **one()["defects"][0],
            "id": "new#9",
            "affected": "<=0.1.15.4",
            "fixed": None,
            "trigger": {"layers": ["gdn"]},
        }
    )
    dirty = D.parse(data)
    picked = D.default_stack(dirty, per_stack(DEFAULT), STACKS)
    assert picked != DEFAULTS["xpu"]
    problem = D.default_problem(dirty, DEFAULT.name, per_stack(DEFAULT), STACKS, DEFAULTS["xpu"])
    assert problem is not None and DEFAULTS["xpu"] in problem


def test_presets_check_fails_in_one_line_when_the_default_is_not_the_ledgers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = raw_ledger()
    data["defects"].append({**one()["defects"][0], "id": "new#9", "affected": ">=0", "fixed": None})
    ledger = tmp_path / "defects.yaml"
    ledger.write_text(yaml.safe_dump(data))
    argv = ["presets", "--check", "--no-kernels", "--defects-file", str(ledger)]
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    lines = [ln for ln in captured.err.splitlines() if "default preset" in ln]
    assert lines == [
        f"arcvllm: no XPU stack is clean for the default preset {DEFAULT.name} "
        f"by the defect ledger; the default {DEFAULTS['xpu']} is not either"
    ]
    assert "AFFECTED: new#9" in captured.out


def test_presets_check_shows_each_xpu_preset_on_each_xpu_stack_naming_the_defects(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["presets", "--check", "--no-kernels", "--json"]) in (0, 1)
    doc = json.loads(capsys.readouterr().out)
    xpu_presets = [p for p in P.load_all().values() if p.flavor == "xpu"]
    xpu_stacks = [s for s in STACKS.values() if s.flavor == "xpu"]
    assert len(doc["defects"]) == len(xpu_presets) * len(xpu_stacks)
    found = {(d["preset"], d["stack"]): d for d in doc["defects"]}
    old = found[(DEFAULT.name, "xpu-0.23")]
    assert old["verdict"] == "affected" and "vllm-xpu-kernels#411" in old["affected"]
    assert found[(DEFAULT.name, DEFAULTS["xpu"])]["verdict"] == "clean"
    assert doc["default_xpu_stack"] == DEFAULTS["xpu"]


# ---- versions ----


def test_each_xpu_stack_pins_a_version_of_every_component():
    for s in STACKS.values():
        if s.flavor == "xpu":
            pins = D.pinned_versions(s)
            assert all(pins[c] for c in D.COMPONENTS), (s.name, pins)
    assert D.pinned_versions(STACKS["xpu-0.23"]) == {
        "vllm": "0.23.0",
        "vllm-xpu-kernels": "0.1.9",
        "compute-runtime": "25.48.36300.8",
    }
    assert D.pinned_versions(STACKS["xpu-0.33"])["vllm-xpu-kernels"] == "0.1.15.4"


@pytest.mark.parametrize(
    ("affected", "fixed", "version", "standing"),
    [
        ("<=0.1.9", "0.1.10", "0.1.9", D.AFFECTED),
        ("<=0.1.9", "0.1.10", "0.1.10", D.NOT_AFFECTED),
        ("<=0.1.9", "0.1.12", "0.1.11.1", D.UNKNOWN),  # between: nobody said
        ("unknown-before-fix", "0.1.12", "0.1.9", D.UNKNOWN),
        ("unknown-before-fix", "0.1.12", "0.1.12.1", D.NOT_AFFECTED),
        ("unknown-before-fix", None, "9.9", D.UNKNOWN),
        (">=0.1.12,<0.1.14", "0.1.14", "0.1.9", D.NOT_AFFECTED),  # before the range began
        (">=0.1.9,<=0.1.13.1", None, "0.1.15.4", D.UNKNOWN),  # after it, no fix known
        ("==25.48.36300.8", None, "26.27.39122.11", D.UNKNOWN),
        ("==25.48.36300.8", None, "25.48.36300.8", D.AFFECTED),
    ],
)
def test_a_pin_is_affected_only_inside_the_range_and_clean_only_past_a_fix(
    affected, fixed, version, standing
):
    defect = D.parse(one(affected=affected, fixed=fixed)).defects[0]
    assert defect.standing(version) == standing


# ---- triggers ----


def settings(**overrides) -> D.Settings:
    return replace(P.defect_settings(DEFAULT), **overrides)


def test_the_default_presets_settings_are_read_from_its_flags_and_config():
    s = P.defect_settings(DEFAULT)
    assert s.layers == {"gdn", "moe"}
    assert (s.max_model_len, s.num_seqs, s.tensor_parallel) == (32768, 8, 1)
    # No release read: compilation and XPU graphs on, the worst its flags allow.
    assert (s.speculative, s.quantization, s.compiled, s.xpu_graph) == (False, "int4", True, True)
    assert s.prefix_caching == "align" and s.moe_widths == (512, 512)
    spec = {**DEFAULT.vllm_args, "speculative-config": {"method": "mtp"}}
    assert P.defect_settings(replace(DEFAULT, vllm_args=spec)).speculative
    assert P.defect_settings(P.get_preset("granite-4.0-h-tiny-1xb70")).quantization == "bf16"


@pytest.mark.parametrize(
    ("trigger", "met", "unmet"),
    [
        ({"min_max_model_len": 32768}, {}, {"max_model_len": 32767}),
        ({"speculative": True}, {"speculative": True}, {}),
        ({"layers": ["mamba2"]}, {"layers": frozenset({"mamba2"})}, {}),
        ({"quantization": ["fp8"]}, {"quantization": "fp8"}, {}),
        ({"xpu_graph": True}, {}, {"xpu_graph": False}),
        ({"compiled": True}, {}, {"compiled": False}),
        ({"min_tensor_parallel": 2}, {"tensor_parallel": 2}, {}),
        ({"min_num_seqs": 9}, {"num_seqs": 9}, {}),
        ({"moe_width_not_power_of_two": True}, {"moe_widths": (704,)}, {}),
        ({"prefix_caching": "align"}, {}, {"prefix_caching": None}),
        ({}, {}, None),
    ],
)
def test_a_trigger_holds_only_when_the_preset_meets_every_key(trigger, met, unmet):
    assert D.triggered(trigger, settings(**met))
    if unmet is not None:
        assert not D.triggered(trigger, settings(**unmet))


def test_long_context_and_speculative_defects_reach_only_the_presets_that_meet_them():
    trigger = {"layers": ["gdn"], "min_max_model_len": 32768}
    gdn_32k = D.parse(one(affected="<=0.1.9", trigger=trigger))
    pins = D.pinned_versions(STACKS["xpu-0.23"])
    long = D.verdict(gdn_32k, "p", settings(), "xpu-0.23", pins)
    short = D.verdict(gdn_32k, "p", settings(max_model_len=16384), "xpu-0.23", pins)
    assert long.affected == ("x#1",) and not long.clean
    assert short.clean and short.affected == ()
    mtp = D.parse(one(affected="<=0.1.9", trigger={"speculative": True}))
    assert D.verdict(mtp, "p", settings(), "xpu-0.23", pins).clean
    assert not D.verdict(mtp, "p", settings(speculative=True), "xpu-0.23", pins).clean


def test_a_defect_the_image_patches_is_listed_as_patched_not_affected():
    pins = D.pinned_versions(STACKS["xpu-0.23"])
    found = D.verdict(LEDGER, DEFAULT.name, P.defect_settings(DEFAULT), "xpu-0.23", pins)
    assert "vllm#41817 (mamba-copy-uint64)" in found.patched
    assert all(not a.startswith("vllm#41817") for a in found.affected)
    series = yaml.safe_load((configs_dir().parent / "patches/vllm/series.yaml").read_text())
    names = json.dumps(series)
    for defect in LEDGER.defects:
        if defect.patched_by:
            assert defect.patched_by in names, defect.id


# ---- the data ----


def test_the_ledger_carries_the_defects_reported_against_xpu():
    ids = {d.id for d in LEDGER.defects}
    assert ids >= {
        "llm-scaler#596",
        "vllm-xpu-kernels#548",
        "vllm-xpu-kernels#411",
        "vllm-xpu-kernels#524",
        "vllm-xpu-kernels#464",
        "vllm#54740",
        "vllm#53928",
        "vllm#50729",
        "vllm#41817",
        "vllm#48059",
        "vllm#48327",
    }
    for d in LEDGER.defects:
        repo = d.id.split("#")[0]
        assert d.url.startswith("https://github.com/") and d.url.rstrip("/").endswith(
            d.id.split("#")[1]
        ), d.id
        assert repo.split("/")[-1] in d.url, d.id


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"affected": "0.1.9"}, "neither a PEP 440 specifier set nor unknown-before-fix"),
        ({"affected": ""}, "affected is empty"),
        ({"fixed": "soon"}, "is not a version"),
        ({"component": "torch"}, "component must be one of"),
        ({"effect": "slow"}, "effect must be one of"),
        ({"trigger": {"context": 4}}, "unknown trigger key(s) context"),
        ({"trigger": {"layers": ["lstm"]}}, "trigger layers must be a list of"),
        ({"trigger": {"speculative": False}}, "can only be true"),
        ({"trigger": {"min_max_model_len": "32k"}}, "whole number"),
        ({"evidence": " "}, "evidence is empty"),
        ({"url": "github.com/x"}, "https address"),
        ({"colour": "red"}, "unknown key(s) colour"),
    ],
)
def test_a_malformed_defect_is_refused_naming_it_and_the_key(overrides, message):
    with pytest.raises(ArcvllmError) as refused:
        D.parse(one(**overrides), "ledger.yaml")
    assert str(refused.value).startswith("ledger.yaml: x#1: ")
    assert message in str(refused.value)


def test_a_defect_listed_twice_is_refused():
    data = one()
    data["defects"].append(copy.deepcopy(data["defects"][0]))
    with pytest.raises(ArcvllmError, match="listed twice: x#1"):
        D.parse(data)


def test_the_defects_command_lists_the_ledger_and_each_standing_on_a_stack(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["defects", "--stack", "xpu-0.23", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    standing = {d["id"]: d["standing"] for d in doc["defects"]}
    assert standing["vllm-xpu-kernels#411"] == "affected"
    assert standing["vllm#53928"] == "not-affected"  # 0.1.9 accepts mixed batches
    assert cli.main(["defects", "--stack", "nope"]) == 2
    assert "unknown stack 'nope'" in capsys.readouterr().err


def test_unread_releases_are_assumed_to_replay_graphs_so_a_tp_preset_with_them_is_affected():
    tp = P.get_preset("qwen3.6-35b-a3b-w4a16-2xb70")
    args = {k: v for k, v in tp.vllm_args.items() if k != "compilation-config"}
    graphs = replace(tp, name="graphs", vllm_args=args)
    _, doc, text = P.run_checks({"graphs": graphs, tp.name: tp}, None)
    found = {(d["preset"], d["stack"]): d for d in doc["defects"]}
    for name in ("xpu-0.32", "xpu-0.33"):
        assert "vllm#48327" in found[("graphs", name)]["affected"], found[("graphs", name)]
        assert "vllm#48327" not in found[(tp.name, name)]["affected"]
        assert found[("graphs", name)]["triggers"] == {"source": "assumed (no release read)"}
    assert "graphs (assumed)" in text and "compiled (assumed)" in text
