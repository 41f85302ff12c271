"""The one percentile: linear interpolation between closest ranks, as numpy and vLLM's
bench compute it, so smoke's and bench's p99 of the same data agree."""

from __future__ import annotations

import statistics

import pytest

from arcvllm.client.stats import percentile


def test_percentile_of_no_data_is_none_and_of_one_value_is_it():
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0


def test_percentile_interpolates_between_ranks():
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 0) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert percentile([float(i) for i in range(1, 101)], 99) == pytest.approx(99.01)


@pytest.mark.parametrize("n", [2, 3, 7, 50, 101])
def test_percentile_equals_statistics_inclusive_quantiles(n):
    values = [((i * 37) % 11) * 1.5 + i / 7 for i in range(n)]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    for q in (1, 25, 50, 90, 99):
        assert percentile(values, q) == pytest.approx(cuts[q - 1])
    assert percentile(values, 50) == pytest.approx(statistics.median(values))


def test_percentile_refuses_a_q_outside_0_100():
    with pytest.raises(ValueError):
        percentile([1.0], 101)
