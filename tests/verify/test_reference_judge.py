"""The reference's judge (tests/support/reference.py): a token off and a drifted
distribution each fail it, a healthy near-copy passes."""

from __future__ import annotations

import pytest
from support.reference import DRIFT_P99_LIMIT, GAP_LIMIT, judge

HEALTHY = [{"lp": -1.0, "rank": 0, "top_lp": -1.0}] * 100


def test_a_near_copy_passes():
    verdict = judge([[-1.01] * 100], [HEALTHY])
    assert verdict.ok and verdict.off == 0 and verdict.drift_max == pytest.approx(0.01)


def test_one_token_below_the_references_best_fails_and_is_named():
    off = [*HEALTHY[:50], {"lp": -1.0 - GAP_LIMIT - 0.1, "rank": 3, "top_lp": -1.0}, *HEALTHY[51:]]
    verdict = judge([[-1.0] * 100], [off])
    assert not verdict.ok and verdict.off == 1 and verdict.worst_at == (0, 50)
    assert "1 off" in verdict.line()


def test_a_distribution_shifted_with_the_same_top_token_fails():
    verdict = judge([[-1.0 - DRIFT_P99_LIMIT - 0.1] * 100], [HEALTHY])
    assert verdict.off == 0 and not verdict.ok


def test_sequences_of_other_lengths_are_refused():
    with pytest.raises(ValueError, match="differ in length"):
        judge([[-1.0] * 99], [HEALTHY])
