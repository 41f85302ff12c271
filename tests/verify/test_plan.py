"""`arcvllm verify` without a server: the rows planned from a server's geometry, the pure
judgements, the command line. The rows against real servers, each shown failing, are in
test_verify_server.py."""

from __future__ import annotations

import math

import pytest

from arcvllm import cli
from arcvllm.errors import ArcvllmError
from arcvllm.verify import plan as P

B70 = P.Geometry(block_size=1088, max_model_len=32768, chunk_tokens=8192, kv_tokens=None)
CPU = P.Geometry(block_size=256, max_model_len=1536, chunk_tokens=1024, kv_tokens=3072)


def test_the_decode_crosses_two_boundaries_from_just_before_the_first():
    p = P.plan_rows(B70)
    assert p.decode_prompt == 1080
    assert P.boundaries_crossed(p.decode_prompt, p.decode_prompt + p.decode_tokens, 1088) == 2


def test_the_chunked_prefill_runs_past_the_chunk_and_one_more_block():
    p = P.plan_rows(CPU)
    assert p.chunked_total == 1024 + 256 + 16
    assert P.boundaries_crossed(1024, p.chunked_total, 256) >= 1
    assert p.chunked_prompt < 1024


@pytest.mark.parametrize(
    "geometry",
    [
        P.Geometry(256, 1536, None, 3072),  # the chunk is not known
        P.Geometry(256, 1536, 2048, 3072),  # no prompt the context holds is chunked
    ],
)
def test_no_chunked_prefill_row_where_nothing_is_chunked(geometry):
    assert not P.plan_rows(geometry).chunked


def test_the_resumed_request_shares_a_cached_block_and_decodes_inside_the_next():
    p = P.plan_rows(CPU)
    assert p.resume_shared // 256 * 256 == 512 < p.resume_shared < p.resume_prompt
    end = p.resume_shared + p.resume_extension + p.resume_tokens
    assert P.boundaries_crossed(p.resume_shared, end, 256) == 0


@pytest.mark.parametrize("geometry", [CPU, B70])
def test_the_mixed_prompts_outgrow_one_chunk_and_each_decodes_inside_its_last_block(geometry):
    p = P.plan_rows(geometry)
    longs = [p.mixed_prompt - i for i in range(P.STREAMS - 1)]
    # Beyond the chunk even after the short prompt took its share of the first step.
    assert sum(longs) >= 1.25 * geometry.chunk_tokens > geometry.chunk_tokens + p.mixed_short
    b = geometry.block_size
    assert all(P.boundaries_crossed(n, n + p.mixed_tokens, b) == 0 for n in longs)
    assert P.boundaries_crossed(p.mixed_short, p.mixed_short + p.mixed_tokens, b) == 0
    # The short one decodes over more steps than the longs' prefill can take.
    assert p.mixed_tokens > sum(longs) / geometry.chunk_tokens + 1
    # One block each where that is enough: the requests fit a small KV cache (CI's).
    assert geometry is B70 or p.mixed_prompt + p.mixed_tokens < b


def test_preemption_asks_for_twice_the_kv_cache_or_is_not_planned():
    p = P.plan_rows(CPU)
    assert P.STREAMS * p.preempt_tokens >= 2 * 3072
    assert p.preempt_prompt + p.preempt_tokens <= 1536
    # A B70's KV cache holds eight requests of max-model-len: nothing to run out.
    big = P.Geometry(1088, 32768, 8192, 400_000)
    assert P.plan_rows(big).preempt_tokens == 0
    assert P.plan_rows(B70).preempt_tokens == 0  # the server does not say


def test_a_context_too_short_for_two_blocks_is_refused():
    with pytest.raises(ArcvllmError, match="too short to cross two blocks"):
        P.plan_rows(P.Geometry(1088, 2048, 8192, None))


def test_longest_run_counts_one_token_repeated():
    assert P.longest_run([]) == 0
    assert P.longest_run([1, 2, 3]) == 1
    assert P.longest_run([5, 7, 7, 7, 2, 7]) == 3


def test_top_entropy_of_a_spike_is_zero_and_of_an_even_split_is_log_k():
    assert P.top_entropy({"a": 0.0}) == 0.0
    even = {str(i): math.log(0.25) for i in range(4)}
    assert P.top_entropy(even) == pytest.approx(math.log(4))


def test_degeneration_is_a_long_run_a_collapsed_entropy_or_a_nan():
    spread = [{"1": math.log(0.5), "2": math.log(0.5)}] * 20
    assert not P.degeneration(list(range(20)), spread).degenerate
    assert P.degeneration([0] * 20, spread).degenerate  # "!!!!"
    spike = [{"1": 0.0, "2": -30.0}] * 20
    assert P.degeneration(list(range(20)), spike).degenerate
    nan = [*spread[:19], {"1": float("nan")}]
    assert P.degeneration(list(range(20)), nan).degenerate
    assert not P.degeneration([], []).degenerate


def test_finite_takes_none_as_the_first_positions_and_refuses_nan_and_inf():
    assert P.finite([None, -1.0, -0.5])
    assert not P.finite([-1.0, float("nan")])
    assert not P.finite([float("-inf")])


def test_an_unknown_row_is_a_usage_error_naming_the_rows(capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["verify", "--base-url", "http://127.0.0.1:9", "--rows", "boundary decode,nope"])
    assert exit.value.code == 2
    assert "unknown row 'nope'" in capsys.readouterr().err


def test_no_server_is_one_line_and_exit_3(capsys):
    code = cli.main(["verify", "--base-url", "http://127.0.0.1:9"])
    assert code == 3
    err = capsys.readouterr().err
    assert err.startswith("arcvllm: no vLLM server answers http://127.0.0.1:9/health")
    assert err.count("\n") == 1


# ---- rows that did not exercise their path: INCOMPLETE, with how to make them run


def test_the_chunked_row_is_incomplete_without_a_chunk_or_room_past_it():
    unknown = P.plan_rows(P.Geometry(256, 1536, None, 3072))
    assert "--max-num-batched-tokens N" in P.unexercised(P.CHUNKED, unknown)
    no_room = P.plan_rows(P.Geometry(256, 1536, 2048, 3072))
    how = P.unexercised(P.CHUNKED, no_room)
    assert how.endswith("--max-num-batched-tokens 1256 or less")
    # ... and at that chunk the row runs
    assert P.plan_rows(P.Geometry(256, 1536, 1256, 3072)).chunked
    assert P.unexercised(P.CHUNKED, P.plan_rows(CPU)) == ""


def test_the_mixed_row_is_incomplete_when_the_chunk_is_unknown():
    how = P.unexercised(P.MIXED, P.plan_rows(P.Geometry(256, 1536, None, 3072)))
    assert "prefill in one step" in how and "--max-num-batched-tokens N" in how
    assert P.unexercised(P.MIXED, P.plan_rows(CPU)) == ""


def test_preemption_is_incomplete_with_a_kv_cache_too_large_or_nothing_preempted():
    big = P.plan_rows(P.Geometry(1088, 32768, 8192, 400_000))
    how = P.unexercised(P.PREEMPTION, big)
    assert "KV cache of 400000 tokens holds 8 requests" in how
    assert "at most 126720 tokens" in how and "--num-gpu-blocks-override" in how
    # the KV cache it names is one the row runs out
    assert P.plan_rows(P.Geometry(1088, 32768, 8192, P.kv_room(big.geometry))).preempt_tokens
    assert "of unknown size" in P.unexercised(P.PREEMPTION, P.plan_rows(B70))
    cpu = P.plan_rows(CPU)
    assert P.unexercised(P.PREEMPTION, cpu, preempted=0).startswith(
        "nothing was preempted in 3 rounds"
    )
    assert P.unexercised(P.PREEMPTION, cpu, preempted=2) == ""


def test_the_resumed_prefix_is_incomplete_when_less_than_a_block_was_resumed():
    cpu = P.plan_rows(CPU)
    assert "--enable-prefix-caching" in P.unexercised(P.RESUME, cpu, resumed=0)
    assert P.unexercised(P.RESUME, cpu, resumed=255) != ""
    assert P.unexercised(P.RESUME, cpu, resumed=512) == ""


@pytest.mark.parametrize("row", [P.DECODE, P.MAX_LEN, P.RESIDUES, P.DEGENERATION])
def test_the_other_rows_always_exercise_their_path(row):
    assert P.unexercised(row, P.plan_rows(P.Geometry(256, 1536, None, None))) == ""


def test_a_row_that_failed_stays_failed_though_its_path_did_not_run():
    from arcvllm.client.report import Check
    from arcvllm.verify.suite import _unless_unexercised

    failed = Check(P.RESUME, "...", "1 of 4 tok", False)
    assert _unless_unexercised(failed, "start it so") is failed
    passed = Check(P.RESUME, "...", "4 of 4 tok", True)
    check = _unless_unexercised(passed, "start it so")
    assert (check.ok, check.result, check.how) == (None, "INCOMPLETE", "start it so")
    assert _unless_unexercised(passed, "") is passed
