"""The model as its own oracle (arcvllm.client.oracle): its pure parts. Against real servers
it runs in the smoke and verify tests."""

from __future__ import annotations

import pytest

from arcvllm.client import oracle as O


def test_tokens_of_tiles_to_the_exact_length():
    assert O.tokens_of([1, 2, 3], 7) == [1, 2, 3, 1, 2, 3, 1]
    assert O.tokens_of([1, 2, 3], 4, shift=1) == [2, 3, 1, 2]


def _logprobs(prompt_len: int, chosen: list[dict[int, float]]) -> list[dict[int, float] | None]:
    return [None] + [{0: -1.0}] * (prompt_len - 1) + chosen


def test_greedy_check_passes_the_top_token_and_a_bf16_tie_and_fails_a_real_miss():
    logprobs = _logprobs(3, [{7: -0.5}, {8: -1.0, 9: -0.99}, {4: -2.0, 5: -0.1}])
    result = O.greedy_check("decode", 3, [7, 8, 4], logprobs)
    assert result.tokens == 3
    assert [round(g, 3) for g in result.ties] == [0.01]  # 8 is a tie with the top 9
    assert [(n, i, round(g, 2)) for n, i, g in result.misses] == [("decode", 2, 1.9)]


def test_greedy_check_counts_a_token_without_logprobs_as_a_miss():
    result = O.greedy_check("s", 2, [1, 2], _logprobs(2, [{1: -0.1}]))
    assert [m[:2] for m in result.misses] == [("s", 1)]


def test_greedy_checks_add_up():
    a = O.GreedyCheck(3, (0.01,), (("a", 1, 2.0),))
    b = O.GreedyCheck(2, (), (("b", 0, 1.0),))
    assert a + b == O.GreedyCheck(5, (0.01,), (("a", 1, 2.0), ("b", 0, 1.0)))


def test_the_summary_names_the_first_miss_and_the_ties():
    result = O.GreedyCheck(10, (0.01,), (("decode", 4, 1.5), ("decode", 9, 2.0)))
    assert result.summary() == (
        "8 of 10 tok (1 bf16 ties, max 0.010 nats); 2 off, first: decode token 4 by 1.50 nats"
    )


def test_the_drift_is_the_paths_logprob_of_each_token_against_the_plain_models():
    plain = _logprobs(2, [{7: -0.5, 1: -2.0}, {8: -0.2, 9: -3.0}, {4: -0.1, 5: -4.0}])
    path = [{7: -0.6, 1: -1.9}, {8: -1.7, 3: -0.9}, {4: -0.1, 5: -4.0}]
    result = O.greedy_check("decode", 2, [7, 8, 4], plain, path=path, drift_nats=1.0)
    assert [round(d, 3) for d in result.drift] == [0.1, 1.5, 0.0]
    assert result.overlap == (1.0, 0.5, 1.0)  # top-2 sets: {8, 3} against {8, 9}
    assert [(n, i, round(d, 2)) for n, i, d in result.drifted] == [("decode", 1, 1.5)]
    assert not result.misses  # every token is the plain model's top one: ranks pass it
    summary = result.drift_summary()
    assert (summary["tokens"], summary["p50"], summary["max"]) == (3, 0.1, 1.5)
    assert summary["p99"] == pytest.approx(1.472)
    assert "drift p50/p99/max 0.100/1.472/1.500 nats, 1 drifted" in result.summary()
    assert "1.500 nats (<= 1), 1 drifted, first: decode token 1 by 1.50" in result.summary(1.0)


def test_no_path_logprobs_no_drift():
    result = O.greedy_check("s", 1, [5], _logprobs(1, [{5: -0.1}]))
    assert result.drift == () and result.drift_summary()["p99"] is None
    assert "drift" not in result.summary()


def test_top_k_takes_the_k_most_likely():
    assert O.top_k({1: -0.1, 2: -3.0, 3: -0.5, 4: -9.0}, 2) == {1, 3}
