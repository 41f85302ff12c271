"""`arcvllm model check`: a model folder held to its preset, files only."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path

import pytest

from arcvllm import cli
from arcvllm import model as M
from arcvllm import presets as P
from arcvllm.errors import CheckFailed, UsageError

MTP = P.get_preset("tiny-hybrid-cpu-mtp")
PLAIN = P.get_preset("tiny-hybrid-cpu")
QWEN = P.get_preset("qwen3.6-35b-a3b-w4a16-1xb70")
# An MTP twin of the production preset (the shipped ones went: no checkpoint shown to
# carry mtp.* in a scheme an XPU stack passes, docs/operate.md).
QWEN_MTP = replace(
    QWEN,
    vllm_args={
        **QWEN.vllm_args,
        "speculative-config": {"method": "mtp", "num_speculative_tokens": 1},
    },
)


def write_safetensors(path: Path, names: list[str]) -> None:
    """A safetensors file in the documented layout: 8-byte header length, JSON, data."""
    header = {
        n: {"dtype": "BF16", "shape": [2], "data_offsets": [4 * i, 4 * i + 4]}
        for i, n in enumerate(names)
    }
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(4 * len(names)))


def folder(
    tmp_path: Path,
    names: list[str],
    config: dict | None = None,
    index: bool = False,
    tokenizer: bool = True,
    template: bool = True,
) -> Path:
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps(config or {"architectures": ["Qwen3NextForCausalLM"]})
    )
    if index:
        half = len(names) // 2
        write_safetensors(d / "model-00001-of-00002.safetensors", names[:half])
        write_safetensors(d / "model-00002-of-00002.safetensors", names[half:])
        weight_map = {
            n: f"model-0000{1 if i < half else 2}-of-00002.safetensors" for i, n in enumerate(names)
        }
        (d / M.INDEX).write_text(json.dumps({"weight_map": weight_map}))
    else:
        write_safetensors(d / "model.safetensors", names)
    if tokenizer:
        (d / "tokenizer.json").write_text("{}")
    tok_config = {"chat_template": "{{ messages }}"} if template else {}
    (d / "tokenizer_config.json").write_text(json.dumps(tok_config))
    return d


LAYERS = ["model.layers.0.self_attn.q_proj.weight", "model.embed_tokens.weight"]
MTP_TENSORS = ["mtp.fc.weight", "mtp.layers.0.self_attn.q_proj.weight"]


def failed(findings: list[M.Finding]) -> dict[str, str]:
    return {f.check: f.seen for f in findings if not f.ok}


def test_the_mtp_preset_needs_mtp_tensors_and_the_plain_one_does_not(tmp_path):
    without = folder(tmp_path, LAYERS)
    assert "no mtp.* tensors" in failed(M.check(MTP, without))["tensors"]
    assert failed(M.check(PLAIN, without)) == {}
    with pytest.raises(CheckFailed) as refused:
        M.refuse(MTP, without)
    assert str(refused.value).startswith(f"model {without} cannot serve tiny-hybrid-cpu-mtp: ")
    assert "\n" not in str(refused.value)


def test_the_mtp_tensors_are_read_from_the_index_and_each_file_it_names_must_exist(tmp_path):
    d = folder(tmp_path, LAYERS + MTP_TENSORS, index=True)
    assert failed(M.check(MTP, d)) == {}
    (d / "model-00002-of-00002.safetensors").unlink()
    assert "names files that are not there" in failed(M.check(MTP, d))["tensors"]


def test_a_file_that_is_not_safetensors_fails_the_tensor_check(tmp_path):
    d = folder(tmp_path, LAYERS + MTP_TENSORS)
    (d / "model.safetensors").write_bytes(b"\xff" * 8 + b"junk")
    assert "not a safetensors file" in failed(M.check(MTP, d))["tensors"]


def test_a_missing_tokenizer_or_chat_template_fails(tmp_path):
    (tmp_path / "a").mkdir()
    no_tok = folder(tmp_path / "a", LAYERS, tokenizer=False)
    assert "tokenizer" in failed(M.check(PLAIN, no_tok))
    (tmp_path / "b").mkdir()
    no_template = folder(tmp_path / "b", LAYERS, template=False)
    assert set(failed(M.check(PLAIN, no_template))) == {"chat template"}


def qwen_config(**weights) -> dict:
    config = json.loads(json.dumps(dict(QWEN.model_config)))
    config["quantization_config"]["config_groups"]["group_0"]["weights"].update(weights)
    return config


def test_architecture_and_quantization_are_held_to_the_presets_excerpt(tmp_path):
    names = ["model.language_model.layers.0.mlp.experts.0.weight_packed"]
    (tmp_path / "a").mkdir()
    good = folder(tmp_path / "a", names, config=qwen_config())
    assert failed(M.check(QWEN, good)) == {}
    (tmp_path / "b").mkdir()
    group32 = folder(tmp_path / "b", names, config=qwen_config(group_size=32))
    assert "kernel verdict is for" in failed(M.check(QWEN, group32))["quantization"]
    (tmp_path / "c").mkdir()
    other = folder(tmp_path / "c", names, config={**qwen_config(), "architectures": ["X"]})
    assert "config.json says ['X']" in failed(M.check(QWEN, other))["architecture"]
    (tmp_path / "d").mkdir()
    bf16 = {k: v for k, v in qwen_config().items() if k != "quantization_config"}
    assert (
        "none (unquantized)"
        in failed(M.check(QWEN, folder(tmp_path / "d", names, bf16)))["quantization"]
    )
    mtp = failed(M.check(QWEN_MTP, good))
    assert set(mtp) == {"tensors"} and "no mtp.*" in mtp["tensors"]


def test_weights_larger_than_the_gpus_fail_the_size_check():
    assert M.check_size(QWEN, int(20 * P.GIB)).ok
    assert not M.check_size(QWEN, int(29 * P.GIB)).ok  # 0.90 x 32 GiB = 28.8 GiB
    assert M.check_size(P.get_preset("qwen3.6-35b-a3b-w4a16-2xb70"), int(40 * P.GIB)).ok


def test_a_folder_that_is_no_model_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        M.check(PLAIN, tmp_path / "nope")
    with pytest.raises(UsageError, match=r"has no config\.json"):
        M.check(PLAIN, tmp_path)


def test_the_command_exits_1_on_a_mismatch_2_on_a_bad_preset_or_folder(tmp_path, capsys):
    without = folder(tmp_path, LAYERS)
    assert cli.main(["model", "check", "tiny-hybrid-cpu-mtp", str(without)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("arcvllm: model ") and "mtp.*" in err
    assert cli.main(["model", "check", "tiny-hybrid-cpu", str(without), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and {r["check"] for r in doc["rows"]} >= {"tensors", "size"}
    assert cli.main(["model", "check", "nope", str(without)]) == 2
    assert cli.main(["model", "check", "tiny-hybrid-cpu", str(tmp_path / "x")]) == 2


def test_the_served_folder_is_the_one_extra_args_name():
    assert M.model_dir(PLAIN) == Path(PLAIN.model)
    assert M.model_dir(PLAIN, ["--model", "/else"]) == Path("/else")
    assert M.model_dir(PLAIN, ["--model", "org/name"]) is None
