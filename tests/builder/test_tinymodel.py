"""The tiny hybrid model: deterministic, offline, the geometry vLLM's CPU kernels accept."""

from __future__ import annotations

import hashlib
import json

import pytest
from support.venvs import vllm_env

from arcvllm import cli
from arcvllm.builder import tinymodel as T
from arcvllm.errors import UsageError


def test_corpus_is_deterministic_per_seed():
    assert T.corpus(0) == T.corpus(0)
    assert T.corpus(0) != T.corpus(1)


def test_geometry_fits_the_cpu_kernels():
    """Linear-attention head dims of 64 or 128 only; a hybrid of both layer kinds; MoE."""
    assert T.CONFIG["linear_key_head_dim"] in (64, 128)
    assert T.CONFIG["linear_value_head_dim"] in (64, 128)
    assert set(T.CONFIG["layer_types"]) == {"linear_attention", "full_attention"}
    assert T.CONFIG["num_experts"] > T.CONFIG["num_experts_per_tok"] > 0


def test_build_is_listed_in_the_cli(capsys):
    with pytest.raises(SystemExit):
        cli.main(["tinymodel", "build", "--help"])
    assert "--seed" in capsys.readouterr().out


def _digests(path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


@pytest.mark.vllm
def test_build_is_deterministic_and_loads_offline(tmp_path):
    env = vllm_env("0.32.0")
    offline = {"TMPDIR": str(tmp_path), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    for name, seed in (("a", "0"), ("b", "0"), ("c", "1")):
        out = env.arcvllm(
            "tinymodel", "build", str(tmp_path / name), "--seed", seed, "--json",
            env=offline, timeout=300,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        summary = json.loads(out.stdout)
        assert (summary["dir"], summary["seed"]) == (str(tmp_path / name), int(seed))
        assert summary == {
            "dir": summary["dir"],
            **json.loads((tmp_path / name / "arcvllm-tinymodel.json").read_text()),
        }
    a, b, c = (_digests(tmp_path / n) for n in "abc")
    assert a == b
    assert a["model.safetensors"] != c["model.safetensors"]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(a)
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3NextForCausalLM"]
    assert config["dtype"] == "bfloat16"
    # One MTP layer in Qwen3-Next's format: what vLLM's Qwen3NextMTP reads.
    assert config["num_nextn_predict_layers"] == 1
    keys = env.run(
        "-c",
        "import sys; from safetensors import safe_open;"
        "print(' '.join(safe_open(sys.argv[1], 'pt').keys()))",
        str(tmp_path / "a" / "model.safetensors"),
        timeout=120,
    ).stdout.split()
    mtp = {k for k in keys if k.startswith("mtp.")}
    assert {"mtp.fc.weight", "mtp.norm.weight", "mtp.pre_fc_norm_hidden.weight"} <= mtp
    assert "mtp.layers.0.self_attn.q_proj.weight" in mtp
    assert "mtp.layers.0.mlp.experts.3.down_proj.weight" in mtp
    assert summary["mtp_parameters"] > 0
    # Readable by the unprivileged user an image serves as.
    assert all(p.stat().st_mode & 0o044 == 0o044 for p in (tmp_path / "a").iterdir())
    load = env.run(
        "-c",
        "import sys, torch, transformers as t;"
        "m = t.AutoModelForCausalLM.from_pretrained(sys.argv[1]);"
        "k = t.AutoTokenizer.from_pretrained(sys.argv[1]);"
        "ids = k('the block state cache')['input_ids'];"
        "assert k.decode(ids) == 'the block state cache';"
        "assert next(m.parameters()).dtype == torch.bfloat16;"
        "print(sum(p.numel() for p in m.parameters()))",
        str(tmp_path / "a"),
        env=offline,
        timeout=300,
    )
    assert load.returncode == 0, load.stderr[-2000:]
    assert 1_000_000 < int(load.stdout.strip().splitlines()[-1]) < 2_000_000


def test_build_refuses_a_folder_with_files(tmp_path):
    (tmp_path / "x").write_text("keep me")
    with pytest.raises(UsageError, match="not empty") as raised:
        T.build(tmp_path)
    assert raised.value.exit_code == 2
