"""A run of `arcvllm verify` recorded and a later one held to it (arcvllm.verify.record):
the comparison of one row, and the records refused. End to end on a real server in
test_verify_server.py."""

from __future__ import annotations

import json
import re

import pytest

from arcvllm import cli
from arcvllm.errors import UsageError
from arcvllm.verify import record as R

SERVER = {
    "model": "tiny-hybrid",
    "vllm_version": "0.32.0",
    "block_size": 256,
    "max_model_len": 1536,
    "chunk_tokens": 1024,
    "kv_tokens": 3072,
    "corpus": "abc",
    "drift_nats": 1.0,
}


def row(tokens: list[int], tops: list[set[int]], p99: float = 0.05, prompt=(1, 2, 3)) -> dict:
    return {"drift": {"p99": p99}, "sequences": {"decode": R.sequence(prompt, tokens, tops)}}


WAS = row([5, 6, 7, 8], [{5, 1}, {6, 2}, {7, 3}, {8, 4}])


def test_the_same_tokens_and_drift_hold():
    ok, seen = R.compare(WAS, row([5, 6, 7, 8], [{5}, {6}, {7}, {8}], p99=0.2))
    assert ok is True
    assert seen == "4 tok as recorded; drift p99 0.200 nats, the record's 0.050"


def test_a_token_outside_the_others_top_k_fails_and_says_which():
    ok, seen = R.compare(WAS, row([5, 6, 9, 8], [{5}, {6}, {9, 0}, {8}]))
    assert ok is False
    assert "2 tok as recorded; 1 differ, first: decode token 2 is 9, the record's 7" in seen


def test_a_near_tie_that_flipped_parts_the_sequences_and_holds():
    # token 2: now 3 (the record's second choice there), and the record's 7 is in now's top
    ok, seen = R.compare(WAS, row([5, 6, 3, 0], [{5}, {6}, {3, 7}, {0}]))
    assert ok is True and seen.startswith("2 tok as recorded, 1 parted at a near tie")


def test_drift_beyond_the_records_and_the_margin_fails_by_how_much():
    ok, seen = R.compare(WAS, row([5, 6, 7, 8], [{5}, {6}, {7}, {8}], p99=0.9), margin=0.25)
    assert ok is False and seen.endswith(
        "drift p99 0.900 nats, the record's 0.050 + 0.25: 0.600 over"
    )


def test_a_sequence_of_another_prompt_is_not_compared():
    ok, seen = R.compare(WAS, row([5, 6, 7, 8], [{5}, {6}, {7}, {8}], prompt=(9, 9)))
    assert ok is None and "1 not compared (another prompt)" in seen


def test_a_record_of_another_model_geometry_or_corpus_is_refused_in_one_line():
    record = R.make(SERVER, {})
    R.refuse_other(record, SERVER, "r.json")
    for key, value, said in [
        ("model", "qwen3.6", "recorded on model tiny-hybrid, this server serves qwen3.6"),
        ("block_size", 128, "recorded on another geometry (block_size 256"),
        ("corpus", "def", "recorded with another prompt corpus"),
    ]:
        with pytest.raises(UsageError, match=re.escape(said)) as error:
            R.refuse_other(record, {**SERVER, key: value}, "r.json")
        assert "\n" not in str(error.value)
    # another stack of the same model and geometry: that is what a record is for
    R.refuse_other(record, {**SERVER, "vllm_version": "0.33.0"}, "r.json")


def test_against_a_file_that_is_no_record_is_a_usage_error_exit_2(tmp_path, capsys):
    (tmp_path / "x.json").write_text(json.dumps({"verdict": "pass"}))
    code = cli.main(
        ["verify", "--base-url", "http://127.0.0.1:9", "--against", str(tmp_path / "x.json")]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "not a verify record" in err and err.count("\n") == 1
    assert (
        cli.main(["verify", "--base-url", "http://127.0.0.1:9", "--against", str(tmp_path / "no")])
        == 2
    )


def test_a_record_keeps_what_it_was_made_on():
    record = R.make(SERVER, {"boundary decode": WAS})
    assert record["kind"] == R.KIND and record["vllm"] == "0.32.0"
    assert record["geometry"] == {"block_size": 256, "max_model_len": 1536, "chunk_tokens": 1024}
    assert record["rows"]["boundary decode"]["sequences"]["decode"]["top"][0] == [1, 5]
