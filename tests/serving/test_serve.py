"""`arcvllm serve`: the rendered command, dry run, refusals. The real server of the CPU
preset, and `arcvllm bench` against it, are in tests/serving/test_emulation_server.py (its
`stock` server)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
from support import ROOT
from support.venvs import vllm_env

from arcvllm import cli
from arcvllm.presets import SERVER_MODULE, get_preset, server_command
from arcvllm.serving import serve


def test_dry_run_prints_env_and_the_exact_command_with_extra_args_winning(capsys, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    rc = cli.main(
        ["serve", "--preset", "tiny-hybrid-cpu", "--dry-run", "--", "--max-model-len", "512"]
    )
    assert rc == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "VLLM_CPU_KVCACHE_SPACE=1" in lines
    argv = shlex.split(lines[-1])
    assert argv[1:3] == ["-m", SERVER_MODULE]
    assert argv.count("--max-model-len") == 1
    assert argv[argv.index("--max-model-len") + 1] == "512"
    assert "--" not in argv


def test_the_operators_environment_wins_over_the_presets(capsys, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    assert cli.main(["serve", "--preset", "tiny-hybrid-cpu", "--dry-run"]) == 0
    assert "VLLM_CPU_KVCACHE_SPACE=4  # preset says 1" in capsys.readouterr().out
    command = server_command(get_preset("tiny-hybrid-cpu"))
    assert (
        serve.effective_env(command, {"VLLM_CPU_KVCACHE_SPACE": "4"})["VLLM_CPU_KVCACHE_SPACE"]
        == "4"
    )


TWO_GPUS = "qwen3.6-35b-a3b-w4a16-2xb70"
SETTINGS_FILE = ROOT / "docker" / "arcvllm.env"


def dry_run_with_settings(extra: dict[str, str]) -> list[str]:
    """`arcvllm serve --dry-run` in a process whose environment is the settings file, as
    compose's env_file hands it to the container."""
    from arcvllm.operate.settings import load

    env = {"PATH": os.environ["PATH"], **load(SETTINGS_FILE), **extra}
    done = subprocess.run(
        [sys.executable, "-m", "arcvllm", "serve", "--preset", TWO_GPUS, "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_tp2_preset_sees_both_gpus_with_the_shipped_settings_file():
    assert "ZE_AFFINITY_MASK=0,1" in dry_run_with_settings({})


def test_a_gpu_choice_set_on_purpose_still_wins():
    lines = dry_run_with_settings({"ZE_AFFINITY_MASK": "2,3"})
    assert "ZE_AFFINITY_MASK=2,3  # preset says 0,1; the environment wins" in lines


def test_an_empty_value_leaves_the_presets_and_other_keys_pass_through():
    command = server_command(get_preset(TWO_GPUS))
    env = serve.effective_env(command, {"ZE_AFFINITY_MASK": "", "VLLM_API_KEY": ""})
    assert env["ZE_AFFINITY_MASK"] == "0,1"
    assert env["VLLM_API_KEY"] == ""


def test_tp_presets_exchange_ipc_handles_over_sockets():
    """compose drops every capability, and oneCCL's default pidfd exchange needs
    CAP_SYS_PTRACE under Docker's seccomp profile: every TP>1 preset must pick sockets."""
    from arcvllm.presets import load_all

    tp = [p for p in load_all().values() if p.gpus > 1]
    assert tp, "no multi-GPU preset"
    for preset in tp:
        assert preset.env.get("CCL_ZE_IPC_EXCHANGE") == "sockets", preset.name
        assert preset.env.get("ZE_AFFINITY_MASK") == ",".join(map(str, range(preset.gpus)))


def test_a_model_folder_the_preset_cannot_serve_is_refused_in_one_line(
    capsys, monkeypatch, tmp_path
):
    """Before any exec: the tiny MTP preset on a folder without mtp.* weights."""
    monkeypatch.setattr(serve, "installed_vllm", lambda: ("vllm-cpu", "0.32.0"))
    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail("vLLM was started"))
    model = model_folder(tmp_path / "model")
    assert cli.main(["serve", "--preset", "tiny-hybrid-cpu-mtp", "--", "--model", str(model)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot serve tiny-hybrid-cpu-mtp" in err and "mtp.*" in err


def test_missing_model_path_is_one_line_and_a_non_zero_exit(capsys, tmp_path):
    rc = cli.main(
        ["serve", "--preset", "tiny-hybrid-cpu", "--", "--model", str(tmp_path / "absent")]
    )
    assert rc == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err and str(tmp_path / "absent") in err


@pytest.mark.parametrize("preset", ["tiny-hybrid-cpu", "tiny-hybrid-cpu-mtp"])
def test_resolve_refuses_what_serve_refuses_before_vllm_is_imported(
    capsys, monkeypatch, tmp_path, preset
):
    """--resolve (the image build's) stops where serve would: a missing model folder (exit
    3), one the preset cannot serve (exit 1), never reaching vLLM's parser."""
    monkeypatch.setattr(serve, "installed_vllm", lambda: ("vllm-cpu", "0.32.0"))
    monkeypatch.setattr("arcvllm.presets.vllm_server_parser", lambda: pytest.fail("vLLM read"))
    absent = ["serve", "--preset", preset, "--resolve", "--", "--model", str(tmp_path / "no")]
    assert cli.main(absent) == 3
    assert capsys.readouterr().err.count("\n") == 1
    if preset.endswith("-mtp"):
        model = str(model_folder(tmp_path / "model"))
        assert cli.main(["serve", "--preset", preset, "--resolve", "--", "--model", model]) == 1
        assert "mtp.*" in capsys.readouterr().err
    assert cli.main(["serve", "--preset", preset, "--resolve", "--dry-run"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_preset_for_another_device_or_release_is_refused_in_one_line(
    capsys, monkeypatch, tmp_path
):
    model = tmp_path / "model"
    model.mkdir()
    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail("must not exec"))
    monkeypatch.setattr(serve, "installed_vllm", lambda: ("vllm-cpu", "0.32.0"))
    rc = cli.main(["serve", "--preset", TWO_GPUS, "--", "--model", str(model)])
    err = capsys.readouterr().err
    assert rc == 3 and err.count("\n") == 1
    assert f"preset {TWO_GPUS} is for xpu, but this is vllm-cpu 0.32.0" in err
    monkeypatch.setattr(serve, "installed_vllm", lambda: ("vllm", "0.17.0"))
    rc = cli.main(["serve", "--preset", TWO_GPUS, "--", "--model", str(model)])
    assert rc == 3 and "but this is vllm 0.17.0: use the image of" in capsys.readouterr().err


def test_a_vllm_without_the_shutdown_timeout_flag_is_refused_in_one_line(
    capsys, monkeypatch, tmp_path
):
    """A preset that drains on stop must not run where the flag is unknown (the server
    would reject it) or silently dropped (every request aborted on stop)."""
    presets = tmp_path / "presets"
    presets.mkdir()
    text = (ROOT / "configs" / "presets" / "tiny-hybrid-cpu.yaml").read_text()
    (presets / "tiny-hybrid-cpu.yaml").write_text(text.replace("stacks: [cpu]", "stacks: [old]"))
    stacks = {"old": "0.17.1", "cpu": "0.32.0"}
    monkeypatch.setattr(serve, "stack_vllm_versions", lambda: stacks)
    monkeypatch.setattr(serve, "installed_vllm", lambda: ("vllm-cpu", "0.17.1"))
    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail("must not exec"))
    model = tmp_path / "model"
    model.mkdir()
    argv = ["serve", "--preset", "tiny-hybrid-cpu", "--presets-dir", str(presets)]
    rc = cli.main([*argv, "--", "--model", str(model)])
    err = capsys.readouterr().err
    assert rc == 3 and err.count("\n") == 1
    assert "shutdown_timeout needs vLLM >= 0.18.0 (--shutdown-timeout); vLLM 0.17.1" in err


def test_no_vllm_is_an_environment_error_and_only_a_warning_in_a_dry_run(
    capsys, monkeypatch, tmp_path
):
    model = tmp_path / "model"
    model.mkdir()
    monkeypatch.setattr(serve, "installed_vllm", lambda: None)
    rc = cli.main(["serve", "--preset", "tiny-hybrid-cpu", "--", "--model", str(model)])
    assert rc == 3 and "no vLLM in this Python" in capsys.readouterr().err
    monkeypatch.setattr(serve, "installed_vllm", lambda: ("vllm-cpu", "0.32.0"))
    assert cli.main(["serve", "--preset", TWO_GPUS, "--dry-run"]) == 0
    assert "warning: preset" in capsys.readouterr().err


@pytest.mark.vllm
def test_installed_vllm_reads_package_metadata():
    """The 0.32.0 test venv carries the vllm-cpu distribution (no `vllm` metadata)."""
    env = vllm_env("0.32.0")
    done = env.run(
        "-c", "from arcvllm.serving.serve import installed_vllm; print(installed_vllm())"
    )
    assert done.stdout.strip() == "('vllm-cpu', '0.32.0')", done.stderr


def test_hub_model_ids_are_not_checked_as_paths():
    command = server_command(
        get_preset("tiny-hybrid-cpu"), ["--model", "ibm-granite/granite-4.0-h-tiny"]
    )
    assert serve.model_path_problem(command) is None


def test_mamba_block_size_in_align_mode_is_refused_before_anything_runs(capsys):
    rc = cli.main(["serve", "--preset", "tiny-hybrid-cpu", "--", "--mamba-block-size", "64"])
    assert rc == 1
    assert "vLLM ignores it" in capsys.readouterr().err


def model_folder(path):
    """A folder `arcvllm model check` accepts for the tiny CPU preset: config, one
    safetensors file (the documented header and its bytes), tokenizer, chat template."""
    import json
    import struct

    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["Qwen3NextForCausalLM"]}))
    head = {
        "model.layers.0.mlp.gate.weight": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}
    }
    text = json.dumps(head).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + b"\0\0")
    (path / "tokenizer.json").write_text("{}")
    (path / "chat_template.jinja").write_text("{{ messages }}")
    return path


def test_serve_execs_the_server_module_with_the_presets_env(monkeypatch, tmp_path):
    model = model_folder(tmp_path / "model")
    seen = {}

    def fake_execve(path, argv, env):
        seen.update(path=path, argv=argv, env=env)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execve", fake_execve)
    monkeypatch.setattr(serve, "installed_vllm", lambda: ("vllm-cpu", "0.32.0"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(SystemExit):
        cli.main(["serve", "--preset", "tiny-hybrid-cpu", "--", "--model", str(model)])
    assert seen["argv"][1:3] == ["-m", SERVER_MODULE]
    assert seen["argv"][seen["argv"].index("--model") + 1] == str(model)
    assert seen["env"]["HF_HUB_OFFLINE"] == "1"


PROBE = """
import os, sys
from arcvllm import cli

def execve(path, argv, env):
    heavy = sorted({m.split(".")[0] for m in sys.modules} & {"vllm", "torch", "transformers"})
    print(" ".join(heavy) or "none")
    sys.exit(0)

os.execve = execve
sys.exit(cli.main(["serve", "--preset", sys.argv[1], "--", "--model", sys.argv[2]]))
"""


@pytest.mark.vllm
@pytest.mark.parametrize("preset", ["tiny-hybrid-cpu", "tiny-hybrid-cpu-compiled"])
def test_serve_execs_the_server_without_importing_vllm_first(tmp_path, preset):
    """The container's start is the server's own: `arcvllm serve` validates the preset
    and checks the model folder from files and package metadata, and imports neither vLLM
    nor torch before its exec (in a Python where both are installed, so an import would
    succeed)."""
    env = vllm_env("0.32.0")
    model = model_folder(tmp_path / "model")
    root = ROOT
    done = subprocess.run(
        [str(env.python), "-c", PROBE, preset, str(model)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "none"


# ---- VLLM_EXTRA_ARGS: the settings file's extra arguments ----


def test_the_settings_files_extra_arguments_win_over_the_preset_and_lose_to_the_command_line(
    capsys, monkeypatch
):
    monkeypatch.setenv("VLLM_EXTRA_ARGS", "--max-model-len 1024 --max-num-seqs 2")
    given = ["--", "--max-num-seqs", "3"]
    assert cli.main(["serve", "--preset", "tiny-hybrid-cpu", "--dry-run", *given]) == 0
    argv = shlex.split(capsys.readouterr().out.strip().splitlines()[-1])
    assert argv.count("--max-model-len") == 1 and argv[argv.index("--max-model-len") + 1] == "1024"
    assert argv.count("--max-num-seqs") == 1 and argv[argv.index("--max-num-seqs") + 1] == "3"


def test_extra_arguments_that_would_move_the_deployment_are_refused(capsys, monkeypatch):
    monkeypatch.setenv("VLLM_EXTRA_ARGS", "--served-model-name other")
    assert cli.main(["serve", "--preset", "tiny-hybrid-cpu", "--dry-run"]) == 2
    assert "VLLM_EXTRA_ARGS: --served-model-name is the deployment's" in capsys.readouterr().err


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("value", "verdict"),
    [
        ("--max-model-len 1024 --max-num-seqs 2", None),
        ("--max-model-len lots", "argument --max-model-len"),
        ("--no-such-flag 3", "unrecognized arguments: --no-such-flag"),
    ],
)
def test_extra_arguments_are_checked_by_the_installed_vllms_own_parser(tmp_path, value, verdict):
    """In the image: a flag or value vLLM refuses stops `arcvllm serve` in one line naming
    the setting, before the server starts (and in a dry run, which shows the verdict)."""
    env = vllm_env("0.32.0")
    done = subprocess.run(
        [str(env.python), "-m", "arcvllm", "serve", "--preset", "tiny-hybrid-cpu", "--dry-run"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "VLLM_EXTRA_ARGS": value},
    )  # fmt: skip
    if verdict is None:
        assert done.returncode == 0, done.stderr[-2000:]
        return
    assert done.returncode == 2, done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("arcvllm:")]
    assert len(said) == 1 and said[0].startswith(f"arcvllm: VLLM_EXTRA_ARGS={value}: vLLM 0.32.0")
    assert verdict in said[0]
