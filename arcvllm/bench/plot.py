"""The bench's picture: inter-token latency over the decoded position, boundaries marked.

matplotlib is the optional 'bench' extra: the image may lack it, and the JSON carries
every step, so `arcvllm bench replot bench.json` draws the same PNG anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from arcvllm.bench.measurements import TokenStep
from arcvllm.client.stats import percentile
from arcvllm.options import require


def plot(runs: Sequence[Sequence[TokenStep]], block: int, title: str, path: Path) -> None:
    """Inter-token latency over position, one line per run, block boundaries dashed."""
    matplotlib = require("matplotlib", "bench")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5), dpi=110)
    every = [s.itl_ms for run in runs for s in run]
    # Stalls of a shared host (seconds) would flatten the plot: clip, and say so.
    ceiling = max(1.5 * (percentile(every, 99) or 1.0), 5 * (percentile(every, 50) or 1.0))
    top = 0
    for i, run in enumerate(runs):
        ax.plot(
            [s.position for s in run],
            [s.itl_ms for s in run],
            lw=0.8,
            alpha=0.7,
            label=f"run {i + 1} (prompt {run[0].position if run else '?'})",
        )
        cross = [s for s in run if s.crosses]
        ax.scatter(
            [s.position for s in cross],
            [min(s.itl_ms, ceiling * 0.98) for s in cross],
            color="red",
            zorder=3,
            s=22,
            label="block-boundary step" if i == 0 else None,
        )
        top = max([top, *(s.position for s in run)])
    for b in range(block, top + 1, block):
        ax.axvline(b, color="grey", ls="--", lw=0.8)
    off = [s for run in runs for s in run if s.itl_ms > ceiling]
    if off:
        ax.scatter(
            [s.position for s in off],
            [ceiling * 0.98] * len(off),
            marker="^",
            color="black",
            s=18,
            label=f"{len(off)} steps off scale (max {max(s.itl_ms for s in off):.0f} ms)",
        )
    ax.set_xlabel(f"position (tokens computed); dashed lines: mamba block boundaries ({block})")
    ax.set_ylabel("inter-token latency (ms)")
    ax.set_title(title)
    ax.set_ylim(0, ceiling)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_report(report: Mapping[str, Any], path: Path) -> None:
    """The plot of a bench.json: it carries every step, so the PNG can be drawn anywhere."""
    runs = [[TokenStep(**step) for step in run] for run in report["runs"]]
    title = f"{report['model']}: inter-token latency over position (block {report['block_size']})"
    plot(runs, int(report["block_size"]), title, path)
