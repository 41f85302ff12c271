"""The one percentile of the package: smoke and bench report the same p99 for the same data."""

from __future__ import annotations

from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """Percentile Q (0-100) with linear interpolation between the closest ranks (numpy's
    default, and statistics.quantiles' "inclusive" method); None for no data."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not within 0-100")
    ordered = sorted(float(v) for v in values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
