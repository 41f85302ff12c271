"""Presets: load, validate, render; and parse with the installed vLLM's own parser."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from support import ROOT
from support.venvs import release_root, vllm_env

from arcvllm import cli
from arcvllm import presets as P
from arcvllm.errors import ArcvllmError

REQUIRED = {
    "qwen3.6-35b-a3b-w4a16-1xb70",
    "qwen3.6-35b-a3b-w4a16-2xb70",
    "qwen3-next-80b-a3b-w4a16-2xb70",
    "granite-4.0-h-tiny-1xb70",
    "tiny-hybrid-cpu",
}
# The vLLM releases the test venvs carry (scripts/test-venvs.sh).
INSTALLED = ("0.32.0", "0.20.2")


def minimal(**overrides) -> dict:
    data = {
        "name": "x",
        "description": "d",
        "model": "/m",
        "served_model_name": "m",
        "flavor": "cpu",
        "gpus": 0,
        "stacks": ["cpu"],
    }
    data.update(overrides)
    return data


def test_every_deployment_of_the_issue_has_a_preset():
    assert set(P.load_all()) >= REQUIRED


@pytest.mark.parametrize("name", sorted(P.load_all()))
def test_preset_renders_the_server_module_with_model_and_name(name):
    preset = P.get_preset(name)
    command = P.server_command(preset, python="/py")
    assert command.argv[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    values = P.flag_values(command.args)
    assert values["model"] == preset.model
    assert values["served-model-name"] == preset.served_model_name
    assert "mamba-block-size" not in values


def test_every_preset_runs_prefix_caching_in_align_mode_and_leaves_block_size_to_vllm():
    for preset in P.load_all().values():
        values = P.flag_values(P.server_command(preset).args)
        assert values["enable-prefix-caching"] is True
        assert values["mamba-cache-mode"] == "align"
        assert "block-size" not in values, preset.name


def test_tensor_parallel_presets_match_their_gpu_count_and_affinity():
    for preset in P.load_all().values():
        tp = int(P.flag_values(P.server_command(preset).args).get("tensor-parallel-size", 1))
        assert tp == max(preset.gpus, 1), preset.name
        if preset.flavor == "xpu":
            assert len(preset.env["ZE_AFFINITY_MASK"].split(",")) == preset.gpus
            assert preset.env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
        if preset.gpus > 1:
            assert preset.env["CCL_WORKER_COUNT"] == "1"


def test_tiny_cpu_preset_matches_the_cpu_image():
    preset = P.get_preset("tiny-hybrid-cpu")
    values = P.flag_values(P.server_command(preset).args)
    assert preset.model == "/opt/arcvllm/models/tiny-hybrid"
    assert preset.served_model_name == "tiny-hybrid"
    assert values["enforce-eager"] is True
    assert values["max-model-len"] == "2048"
    assert "VLLM_CPU_KVCACHE_SPACE" in preset.env


def test_flag_args_renders_each_yaml_type():
    args = P.flag_args({"a": True, "b": False, "c": 3, "d": [1, 2], "e": {"k": 1}, "f": None})
    assert args == ["--a", "--no-b", "--c", "3", "--d", "1", "2", "--e", '{"k":1}']


def test_extra_args_win_over_the_preset_in_every_spelling():
    base = ["--model", "/m", "--max-model-len", "2048", "--enforce-eager", "--d", "1", "2"]
    merged = P.merge_args(base, ["--max_model_len=4096", "--no-enforce-eager", "--d", "3"])
    assert merged == ["--model", "/m", "--max_model_len=4096", "--no-enforce-eager", "--d", "3"]
    values = P.flag_values(merged)
    assert values["max-model-len"] == "4096"
    assert values["enforce-eager"] is False


def test_render_puts_extra_model_in_place_of_the_presets():
    command = P.server_command(
        P.get_preset("tiny-hybrid-cpu"), ["--model", "/elsewhere", "--port", "9"]
    )
    assert command.args.count("--model") == 1
    assert P.flag_values(command.args)["model"] == "/elsewhere"
    assert command.args[-2:] == ("--port", "9")


@pytest.mark.parametrize(
    "args",
    [
        ["--mamba-block-size", "64", "--mamba-cache-mode", "align"],
        ["--enable-prefix-caching", "--mamba_block_size=64"],
    ],
)
def test_mamba_block_size_with_align_mode_is_refused(args):
    with pytest.raises(ArcvllmError, match="vLLM ignores it"):
        P.check_mamba_block_size(args)


@pytest.mark.parametrize(
    "args",
    [
        ["--mamba-block-size", "64", "--mamba-cache-mode", "none"],
        ["--mamba-block-size", "64", "--no-enable-prefix-caching"],
        ["--mamba-cache-mode", "align", "--block-size", "64"],
    ],
)
def test_mamba_block_size_outside_align_mode_is_accepted(args):
    P.check_mamba_block_size(args)


def test_a_preset_or_extra_args_with_mamba_block_size_in_align_mode_do_not_render():
    bad = P.preset_from_mapping(
        minimal(vllm_args={"enable-prefix-caching": True, "mamba-block-size": 64})
    )
    with pytest.raises(ArcvllmError, match="mamba-block-size 64"):
        P.server_command(bad)
    with pytest.raises(ArcvllmError, match="align-mode"):
        P.server_command(P.get_preset("tiny-hybrid-cpu"), ["--mamba-block-size", "128"])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (minimal(flavor="gpu"), "flavor must be one of"),
        (minimal(stacks=[]), "stacks must be"),
        (minimal(colour="red"), "unknown key"),
        (minimal(vllm_args={"--port": 1}), "without dashes"),
        (minimal(vllm_args={"model": "/x"}), "top-level"),
        (minimal(vllm_args={"shutdown-timeout": 5}), "top-level"),
        (minimal(shutdown_timeout=-1), "shutdown_timeout must be whole seconds"),
        (minimal(shutdown_timeout="120"), "shutdown_timeout must be whole seconds"),
        (minimal(shutdown_timeout=True), "shutdown_timeout must be whole seconds"),
        ({"name": "x"}, "missing key"),
        ([1, 2], "mapping"),
    ],
)
def test_malformed_presets_are_refused_with_the_reason(data, message):
    with pytest.raises(ArcvllmError, match=message):
        P.preset_from_mapping(data, "bad.yaml")


def test_file_name_must_match_the_preset_name(tmp_path):
    (tmp_path / "y.yaml").write_text(yaml.safe_dump(minimal(name="x")))
    with pytest.raises(ArcvllmError, match="differs from the file name"):
        P.load_all(tmp_path)


def test_unknown_preset_is_one_line_listing_the_presets_and_exit_2(capsys):
    assert cli.main(["serve", "--preset", "nope", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "unknown preset 'nope'" in err
    assert all(name in err for name in REQUIRED)


def test_presets_command_lists_name_model_gpus_and_stacks(capsys):
    assert cli.main(["presets"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["NAME", "MODEL", "GPUS", "STACKS"]
    line = next(ln for ln in out.splitlines() if ln.startswith("qwen3.6-35b-a3b-w4a16-2xb70 "))
    assert "2x B70" in line and "xpu-0.23,xpu-0.32,xpu-0.33" in line and "/models/" in line


STACKS = {"xpu-0.20": "0.20.2", "xpu-0.23": "0.23.0", "xpu-0.33": "0.33.0", "cpu": "0.32.0"}


def test_a_preset_is_parsed_by_the_releases_its_stacks_span():
    xpu = P.preset_from_mapping(minimal(stacks=["xpu-0.20", "xpu-0.33"]))
    cpu = P.preset_from_mapping(minimal(stacks=["cpu"]))
    assert P.covers(xpu, "0.20.2", STACKS) and P.covers(xpu, "0.32.0+cpu", STACKS)
    assert not P.covers(xpu, "0.19.0", STACKS)
    assert P.covers(cpu, "0.32.0", STACKS) and not P.covers(cpu, "0.20.2", STACKS)
    assert not P.covers(P.preset_from_mapping(minimal(stacks=["nope"])), "0.32.0", STACKS)


def test_every_preset_names_known_stacks_and_an_installed_release_parses_it():
    stacks = P.stack_vllm_versions()
    for preset in P.load_all().values():
        assert set(preset.stacks) <= set(stacks), preset.name
        assert any(P.covers(preset, v, stacks) for v in INSTALLED), preset.name


# ---- the shutdown timeout: drain on stop ----


@pytest.mark.parametrize("name", sorted(P.load_all()))
def test_every_preset_drains_on_stop_with_its_shutdown_timeout(name):
    """vLLM's default (0) aborts in-flight requests on SIGTERM: every preset sets a drain."""
    preset = P.get_preset(name)
    assert preset.shutdown_timeout, name
    args = P.server_command(preset, vllm_version="0.20.2").args
    assert P.flag_values(args)["shutdown-timeout"] == str(preset.shutdown_timeout)
    assert args.count("--shutdown-timeout") == 1
    assert preset.shutdown_timeout == (120 if preset.flavor == "xpu" else 30)


def test_extra_args_win_over_the_presets_shutdown_timeout():
    preset = P.preset_from_mapping(minimal(shutdown_timeout=30))
    args = P.server_command(preset, ["--shutdown-timeout", "5"]).args
    assert args.count("--shutdown-timeout") == 1 and P.flag_values(args)["shutdown-timeout"] == "5"


def test_a_preset_without_a_shutdown_timeout_renders_no_flag():
    assert "--shutdown-timeout" not in P.server_command(P.preset_from_mapping(minimal())).args


def test_a_release_without_the_flag_refuses_the_shutdown_timeout_in_one_line():
    preset = P.preset_from_mapping(minimal(shutdown_timeout=30))
    with pytest.raises(ArcvllmError) as refused:
        P.server_command(preset, vllm_version="0.17.1")
    assert str(refused.value) == (
        "preset x: shutdown_timeout needs vLLM >= 0.18.0 (--shutdown-timeout); "
        "vLLM 0.17.1 has no such flag"
    )
    assert P.server_command(preset, vllm_version="0.18.0+cpu").args[-2:] == (
        "--shutdown-timeout",
        "30",
    )
    assert P.server_command(
        P.preset_from_mapping(minimal()), vllm_version="0.17.1"
    )  # nothing to refuse


def test_the_presets_check_refuses_a_timeout_its_stacks_release_cannot_take():
    """Without vLLM installed too: the stacks file names each stack's release."""
    old = {**STACKS, "xpu-0.17": "0.17.1"}
    preset = P.preset_from_mapping(minimal(stacks=["xpu-0.17", "xpu-0.23"], shutdown_timeout=9))
    assert P.stack_problems(preset, old) == [
        "preset x: shutdown_timeout needs vLLM >= 0.18.0 (--shutdown-timeout); "
        "vLLM 0.17.1 has no such flag (stack xpu-0.17)"
    ]
    assert P.stack_problems(replace(preset, stacks=("xpu-0.23",)), old) == []
    # The parser check names it before asking vLLM's parser (none is needed to refuse).
    [(_, result)] = P.check_all([preset], "0.17.1", old)
    assert result.startswith("FAIL: preset x: shutdown_timeout needs vLLM >= 0.18.0")


def test_every_shipped_presets_stacks_take_the_shutdown_timeout():
    stacks = P.stack_vllm_versions()
    assert all(P.stack_problems(p, stacks) == [] for p in P.load_all().values())


def test_presets_check_fails_with_one_line_when_a_stacks_release_lacks_the_flag(
    capsys, monkeypatch, tmp_path
):
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(minimal(stacks=["old"], shutdown_timeout=9)))

    def no_vllm() -> str:
        raise ImportError("vllm")

    # the command reads the stacks' versions, the check reads them and the installed vLLM
    monkeypatch.setattr(P.check, "installed_vllm_version", no_vllm)
    for module in (P, P.check):
        monkeypatch.setattr(module, "stack_vllm_versions", lambda: {"old": "0.17.1"})
    argv = ["presets", "--check", "--no-kernels", "--presets-dir", str(tmp_path)]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err == (
        "arcvllm: preset x: shutdown_timeout needs vLLM >= 0.18.0 (--shutdown-timeout); "
        "vLLM 0.17.1 has no such flag (stack old)\n"
    )
    for module in (P, P.check):
        monkeypatch.setattr(module, "stack_vllm_versions", lambda: {"old": "0.20.2"})
    assert cli.main(argv) == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--check", "--stack", "xpu-9.9"], "--stack xpu-9.9: not an XPU stack"),
        (["--check", "--stack", "cpu"], "--stack cpu: not an XPU stack"),
        (["--stack", "xpu-0.33"], "--stack: only with --check"),
        (["--check", "--no-kernels", "--stack", "xpu-0.33"], "--stack: only with --check"),
    ],
)
def test_a_stack_the_check_cannot_ask_is_one_line_and_exit_2(argv, message, capsys):
    assert cli.main(["presets", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


# ---- the installed vLLM's own parser ----


def write_presets_with_a_renamed_flag(directory: Path) -> None:
    """The real presets, plus one whose flag vLLM does not know (a rename, a typo)."""
    directory.mkdir()
    for path in P.presets_dir().glob("*.yaml"):
        (directory / path.name).write_text(path.read_text())
    broken = yaml.safe_load((P.presets_dir() / "qwen3.6-35b-a3b-w4a16-1xb70.yaml").read_text())
    broken["name"] = "zz-renamed-flag"
    broken["stacks"] = ["xpu-0.20", "xpu-0.23", "xpu-0.33"]  # parsed by every installed XPU release
    broken["vllm_args"]["max-seq-len"] = broken["vllm_args"].pop("max-model-len")
    (directory / "zz-renamed-flag.yaml").write_text(yaml.safe_dump(broken))


@pytest.mark.vllm
@pytest.mark.parametrize("version", INSTALLED)
def test_presets_parse_with_the_installed_vllm_and_a_renamed_flag_fails(version, tmp_path):
    env = vllm_env(version)
    write_presets_with_a_renamed_flag(tmp_path / "presets")
    done = env.arcvllm(
        "presets",
        "--check",
        "--no-kernels",
        "--presets-dir",
        str(tmp_path / "presets"),
        cwd=ROOT,
        env={"TMPDIR": str(tmp_path), "VLLM_CACHE_ROOT": str(tmp_path / "cache")},
        timeout=600,
    )
    results = dict(line.split(None, 1) for line in done.stdout.splitlines()[2:] if line.strip())
    assert f"vLLM {version}:" in done.stdout, done.stdout + done.stderr[-3000:]
    stacks = P.stack_vllm_versions()
    for preset in P.load_all().values():
        if P.covers(preset, version, stacks):
            assert results[preset.name] == "ok", done.stdout
        else:
            assert results[preset.name].startswith("skipped"), done.stdout
    assert results["zz-renamed-flag"].startswith("FAIL"), done.stdout
    assert "--max-seq-len" in results["zz-renamed-flag"]
    assert done.returncode == 1


ENGINE_PARSE = """
import json, sys
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
from vllm.engine.arg_utils import EngineArgs
parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
for args in json.loads(sys.argv[1]):
    ns = parser.parse_args(args)
    print(ns.model, ns.language_model_only)
"""


@pytest.mark.vllm
def test_vllm_0_23_0_engine_parser_takes_the_xpu_presets_flags_and_language_model_only():
    """0.23.0's server parser needs fastapi, which the legacy venv lacks; its engine
    arguments (every flag the XPU presets set) parse without it."""
    env = vllm_env("0.23.0")
    xpu = [p for p in P.load_all().values() if "xpu-0.23" in p.stacks]
    # The server's own flags (tool calls) are not engine arguments: 0.23.0's server
    # arguments (FrontendArgs, read as text) must declare them; the rest parse below.
    frontend = {"enable-auto-tool-choice", "tool-call-parser"}
    declared = (release_root("0.23.0") / "vllm/entrypoints/openai/cli_args.py").read_text()
    for flag in frontend:
        assert f"    {flag.replace('-', '_')}: " in declared, flag
    args = [
        [t for key, toks in P.split_flags(P.server_command(p).args) if key not in frontend
         for t in toks]
        for p in xpu
    ]  # fmt: skip
    assert any("--reasoning-parser" in a for a in args)
    done = env.run("-c", ENGINE_PARSE, json.dumps(args), cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()[-len(xpu) :]
    for preset, line in zip(xpu, lines, strict=True):
        model, language_only = line.split()
        assert model == preset.model
        assert language_only == str("language-model-only" in preset.vllm_args)
    bad = env.run("-c", ENGINE_PARSE, json.dumps([["--language-only-model"]]), cwd=ROOT)
    assert bad.returncode != 0


def test_a_presets_reference_exists_and_names_it():
    from arcvllm.bench.reference import load_reference

    named = [p for p in P.load_all().values() if p.reference]
    assert {p.name for p in named} >= {"qwen3.6-35b-a3b-w4a16-1xb70", "tiny-hybrid-cpu"}
    for preset in named:
        reference = load_reference(preset.reference)
        assert reference is not None and reference["name"] == preset.reference
        assert reference["metrics"], preset.name


# ---- checkpoint, config excerpt and memory fit ----


def test_every_xpu_preset_names_its_checkpoint_and_commits_a_config_excerpt():
    for preset in P.load_all().values():
        if preset.flavor != "xpu":
            continue
        assert preset.checkpoint["format"] and "repo" in preset.checkpoint, preset.name
        text = preset.model_config.get("text_config") or preset.model_config
        assert preset.model_config["architectures"], preset.name
        assert len(text["layer_types"]) == text["num_hidden_layers"], preset.name
        assert (text.get("num_experts") or text.get("num_local_experts")) > 0, preset.name


def test_the_old_device_key_is_refused_naming_flavor():
    """Presets and stacks say `flavor` for one concept (cpu, xpu); a preset still saying
    `device` is told so in its one line."""
    old = minimal()
    old["device"] = old.pop("flavor")
    with pytest.raises(ArcvllmError, match=r"^mine.yaml: missing key\(s\): flavor \(`device` is"):
        P.preset_from_mapping(old, "mine.yaml")
    old["flavor"] = "cpu"
    with pytest.raises(ArcvllmError, match=r"unknown key\(s\): device \(`device` is `flavor`"):
        P.preset_from_mapping(old, "mine.yaml")


def test_an_xpu_preset_without_a_config_excerpt_is_refused():
    with pytest.raises(ArcvllmError, match="needs model_config"):
        P.preset_from_mapping(minimal(flavor="xpu", gpus=1, stacks=["xpu-0.23"]))


def test_the_vlm_presets_serve_the_language_model_only():
    for preset in P.load_all().values():
        if "ConditionalGeneration" in str(preset.model_config.get("architectures")):
            assert P.flag_values(P.server_command(preset).args)["language-model-only"] is True


def test_weights_of_the_w4a16_checkpoint_count_experts_at_four_bits():
    config = P.get_preset("qwen3.6-35b-a3b-w4a16-1xb70").model_config
    experts, other = P.parameter_counts(config)
    assert experts == 40 * 256 * 3 * 2048 * 512  # 32.2 G routed-expert parameters
    assert 1.5e9 < other < 3e9
    assert 18 < P.weight_bytes(config) / P.GIB < 21  # the card's 19.43 GB is 18.1 GiB


@pytest.mark.parametrize("name", sorted(n for n, p in P.load_all().items() if p.model_config))
def test_every_preset_fits_its_gpus_and_twice_the_sequences_do_not(name):
    preset = P.get_preset(name)
    fit = P.memory_fit(preset)
    assert fit is not None and fit.ok, fit
    seqs = int(P.flag_values(P.server_command(preset).args)["max-num-seqs"])
    doubled = replace(preset, vllm_args={**preset.vllm_args, "max-num-seqs": 2 * seqs})
    assert not P.memory_fit(doubled).ok


def test_align_mode_keeps_two_state_pages_per_layer_and_request():
    preset = P.get_preset("qwen3.6-35b-a3b-w4a16-1xb70")
    align = P.memory_fit(preset)
    args = {k: v for k, v in preset.vllm_args.items() if k != "mamba-cache-mode"}
    plain = P.memory_fit(replace(preset, vllm_args=args))
    assert align.states_gib == pytest.approx(2 * plain.states_gib)
    # Qwen3.6's GDN state is ~60 MiB a request and layer set: 8 requests, two pages each.
    assert 0.8 < align.states_gib < 1.1, align


def test_the_mtp_twin_fits_with_its_mtp_layer_and_its_kv_cache():
    plain = P.memory_fit(P.get_preset("qwen3.6-35b-a3b-w4a16-1xb70"))
    twin = P.get_preset("qwen3.6-35b-a3b-w4a16-1xb70")
    spec = {"method": "mtp", "num_speculative_tokens": 1}
    mtp = P.memory_fit(replace(twin, vllm_args={**twin.vllm_args, "speculative-config": spec}))
    # One bf16 MoE decoder layer (256 experts x 3 x 2048 x 512: 1.5 GiB) plus one
    # attention layer's KV for 32k x 8 (0.5 GiB).
    assert 1.9 < mtp.draft_gib < 2.3, mtp
    # Align mode keeps 2 + 1 GDN pages per layer per request with one draft, 2 without.
    assert mtp.states_gib == pytest.approx(plain.states_gib * 3 / 2)
    assert mtp.total_gib == pytest.approx(plain.total_gib + mtp.draft_gib + plain.states_gib / 2)
    assert "+ mtp 2.1 + 1)" in mtp.summary() and "mtp" not in plain.summary()
    assert plain.draft_gib == 0.0


def test_speculative_config_is_read_as_a_mapping_or_json():
    preset = P.get_preset("tiny-hybrid-cpu-mtp")
    assert P.speculative_config(preset) == {"method": "mtp", "num_speculative_tokens": 2}
    text = replace(preset, vllm_args={"speculative-config": '{"method": "ngram"}'})
    assert P.speculative_config(text) == {"method": "ngram"}
    assert P.speculative_config(P.get_preset("tiny-hybrid-cpu")) is None
    with pytest.raises(ArcvllmError, match="not JSON"):
        P.speculative_config(replace(preset, vllm_args={"speculative-config": "{"}))


def test_fit_rows_fail_a_preset_that_does_not_fit():
    preset = P.get_preset("qwen3.6-35b-a3b-w4a16-1xb70")
    big = replace(preset, vllm_args={**preset.vllm_args, "max-model-len": 262144})
    rows, failures = P.fit_rows([preset, big])
    assert rows[0][0] == "PRESET" and rows[1][-1] == "ok" and rows[2][-1] == "FAIL"
    assert failures == [preset.name]


def test_a_presets_dir_that_does_not_exist_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["presets", "--presets-dir", "/nonexistent"])
    err = capsys.readouterr().err
    assert done.value.code == 2
    assert err == (
        "arcvllm: presets: argument --presets-dir: no such directory: /nonexistent "
        "(see arcvllm presets --help)\n"
    )


def test_the_json_list_is_the_table(capsys):
    assert cli.main(["presets", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in listed] == list(P.load_all())
    assert {p["name"] for p in listed} >= REQUIRED
    tiny = next(p for p in listed if p["name"] == "tiny-hybrid-cpu")
    assert (tiny["flavor"], tiny["gpus"], tiny["stacks"]) == ("cpu", 0, ["cpu"])


def test_a_checkpoint_pins_a_commit_and_lists_its_patterns_or_is_refused():
    """`arcvllm model fetch` downloads checkpoint.repo at checkpoint.revision: a branch
    name there would give different bytes on different days."""
    good = {"repo": "org/m", "revision": "a" * 40, "allow_patterns": ["*.json"]}
    assert P.preset_from_mapping(minimal(checkpoint=good)).checkpoint["revision"] == "a" * 40
    for bad, said in (
        ({"repo": "org/m", "revision": "main"}, "checkpoint.revision must be a commit"),
        ({"repo": "org/m", "allow_patterns": "*.json"}, "checkpoint.allow_patterns must be"),
    ):
        with pytest.raises(ArcvllmError, match=said):
            P.preset_from_mapping(minimal(checkpoint=bad), "mine.yaml")


# ---- the reasoning and tool-call parsers a preset names exist in its stacks' releases ----

QWEN36 = [n for n in P.load_all() if n.startswith("qwen3.6-")]


@pytest.mark.parametrize("name", QWEN36)
def test_qwen3_6_presets_parse_reasoning_and_tool_calls_as_vllms_recipe_says(name):
    """vLLM's recipes for Qwen3.5/3.6: --reasoning-parser qwen3, and tool calls with
    --enable-auto-tool-choice --tool-call-parser qwen3_coder."""
    args = P.flag_values(P.server_command(P.get_preset(name)).args)
    assert args["reasoning-parser"] == "qwen3"
    assert args["enable-auto-tool-choice"] is True and args["tool-call-parser"] == "qwen3_coder"


def fake_release(tmp_path: Path, reasoning: dict, tools: dict) -> Path:
    """A vllm/ package with the two registries, laid out as 0.20 .. 0.33 lay them out."""
    for package, variable, table in (
        ("reasoning", "_REASONING_PARSERS_TO_REGISTER", reasoning),
        ("tool_parsers", "_TOOL_PARSERS_TO_REGISTER", tools),
    ):
        folder = tmp_path / "vllm" / package
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text(f"{variable} = {table!r}\n")
        for module, _ in table.values():
            (folder / f"{module}.py").write_text("")
    return tmp_path / "vllm"


def test_a_parser_the_release_lacks_is_named_with_what_it_has(tmp_path):
    release = fake_release(
        tmp_path,
        {"qwen3": ("qwen3_reasoning_parser", "Qwen3ReasoningParser")},
        {"hermes": ("hermes_tool_parser", "Hermes2ProToolParser")},
    )
    (release / "tool_parsers" / "hermes_tool_parser.py").unlink()  # registered, not shipped
    parsers = P.release_parsers(release)
    assert parsers == {"reasoning-parser": {"qwen3"}, "tool-call-parser": frozenset()}
    preset = P.get_preset("qwen3.6-35b-a3b-w4a16-1xb70")
    assert P.parser_problems(preset, "9.9.9", parsers) == [
        "preset qwen3.6-35b-a3b-w4a16-1xb70: --tool-call-parser qwen3_coder is not one of "
        "vLLM 9.9.9's ()"
    ]
    with pytest.raises(ArcvllmError, match="cannot read vLLM's --reasoning-parser registry"):
        P.release_parsers(tmp_path / "nowhere")


@pytest.mark.vllm
def test_every_parser_a_preset_names_is_in_each_of_its_stacks_releases():
    """Read from each release's own files (the test venvs' packages, 0.33.0's sdist)."""
    versions = P.stack_vllm_versions()
    problems, read = [], {}
    for preset in P.load_all().values():
        for stack in preset.stacks:
            version = versions[stack]
            if version not in read:
                read[version] = P.release_parsers(release_root(version) / "vllm")
            problems += P.parser_problems(preset, f"{version} ({stack})", read[version])
    assert not problems, "\n".join(problems)
    assert {"0.23.0", "0.33.0"} <= set(read)  # the Qwen3.6 presets' releases were read


DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
MODEL_NAMED = re.compile(r"""["']model["']\s*:\s*["']([^"']+)["']|model=["']([^"']+)["']""")


def test_the_docs_chat_with_the_qwen3_6_preset_by_its_served_name():
    """Clients name the model by the preset's served_model_name (/v1/models lists it), not
    by its folder or its hub repository; the docs show a chat call, thinking and tool calls."""
    served = {p.served_model_name for p in P.load_all().values()}
    named = {
        (doc.name, next(g for g in match.groups() if g))
        for doc in DOCS
        for match in MODEL_NAMED.finditer(doc.read_text())
    }
    assert {name for _, name in named} <= served, named
    chat = (ROOT / "docs" / "deploy.md").read_text()
    assert "/v1/chat/completions" in chat and '"model": "qwen3.6-35b-a3b"' in chat
    assert '"tools"' in chat and "message.reasoning" in chat
