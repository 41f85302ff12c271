"""The model as its own oracle: the plain model's greedy choice at every position.

A sequence a server produced (prompt + output) is sent back once as a prompt, with
`prompt_logprobs` and a fresh prefix-cache namespace (cache_salt): one cold prefill, no
decode, no speculation, nothing resumed. At each output position its top token is what the
plain model chooses; the produced token must be that one, or within a bf16 tie of it.
Used by the smoke test's decode checks and by every row of `arcvllm verify`.

Ranks alone pass a shifted distribution that keeps its top token. Where the path's own
top-K logprobs were asked for, each token also records how far the path's logprob of it is
from the plain model's (|Δ logprob|, nats) and how many of the path's top K are the plain
model's top K (as vLLM's own tests compare two runs, tests/models/utils.py
check_logprobs_close): the drift, summarised per row and judged against a threshold.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from arcvllm.client.api import Client, token_id
from arcvllm.client.stats import percentile
from arcvllm.errors import ArcvllmError

# A token is the plain model's greedy choice when it is the top token of the plain model's
# prediction at its position, or within this many nats of it. Another path computes the
# same math in another order (decode against prefill, a recompute after preemption, a
# batch of another shape, several tokens verified per step): near-ties flip. Measured on
# the tiny model over every row of `arcvllm verify`: healthy paths are off by up to 0.5
# nats, rarely; a state spoiled at a block boundary puts most tokens after it 1 to 9 nats
# below the plain model's choice.
TIE_NATS = 1.0

# The top logprobs the path and the plain model are asked for, compared token by token; and
# how far (nats) the path's logprob of a token may be from the plain model's. Measured on the
# tiny model: see docs/verify.md. On another model or device, calibrate it with a record of
# a healthy run (`arcvllm verify --record`, `--drift-nats`).
TOP_K = 5
DRIFT_NATS = 1.0

Logprobs = list[dict[int, float] | None]
# How many of the last position's top tokens a sequence of max-model-len tokens is judged
# against (vLLM's default max_logprobs): where the model is unsure its top tokens are
# within hundredths of a nat, and a token outside a short list would read as a miss.
LAST_TOP = 20

# Text the prompts are made of; its token ids are tiled to exact lengths.
PROMPT_TEXT = (
    "The mamba state of each request is copied when its length crosses a block boundary. "
    "A block holds the attention keys and values of a fixed number of tokens, and the "
    "recurrent state of the linear attention layers at the end of that block. "
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 alpha beta gamma delta epsilon. "
)


@dataclass(frozen=True)
class GreedyCheck:
    """How decoded sequences compare with the plain model's greedy choice per position."""

    tokens: int = 0
    ties: tuple[float, ...] = ()  # gaps (nats) of tokens that were a tie, not the top one
    misses: tuple[tuple[str, int, float], ...] = ()  # (sequence, output index, gap)
    drift: tuple[float, ...] = ()  # |path logprob - plain logprob| of each token compared
    overlap: tuple[float, ...] = ()  # share of the path's top K in the plain model's
    drifted: tuple[tuple[str, int, float], ...] = ()  # (sequence, index, drift) > threshold

    def __add__(self, other: GreedyCheck) -> GreedyCheck:
        return GreedyCheck(
            self.tokens + other.tokens,
            self.ties + other.ties,
            self.misses + other.misses,
            self.drift + other.drift,
            self.overlap + other.overlap,
            self.drifted + other.drifted,
        )

    def drift_summary(self) -> dict[str, float | int | None]:
        """p50/p99/max of |Δ logprob| (nats) and the mean top-K overlap, rounded."""

        def r(value: float | None) -> float | None:
            return None if value is None else round(value, 4)

        return {
            "tokens": len(self.drift),
            "p50": r(percentile(self.drift, 50)),
            "p99": r(percentile(self.drift, 99)),
            "max": r(max(self.drift, default=None)),
            "overlap": r(sum(self.overlap) / len(self.overlap) if self.overlap else None),
        }

    def summary(self, drift_nats: float | None = None) -> str:
        """'N of M tok' with the ties and the first miss, for a check's 'seen' column; the
        drift, when measured (against DRIFT_NATS, when given)."""
        seen = f"{self.tokens - len(self.misses)} of {self.tokens} tok"
        if self.ties:
            seen += f" ({len(self.ties)} bf16 ties, max {max(self.ties):.3f} nats)"
        if self.misses:
            name, index, gap = self.misses[0]
            seen += f"; {len(self.misses)} off, first: {name} token {index} by {gap:.2f} nats"
        if self.drift:
            d = self.drift_summary()
            seen += f"; drift p50/p99/max {d['p50']:.3f}/{d['p99']:.3f}/{d['max']:.3f} nats"
            seen += f" (<= {drift_nats:g})" if drift_nats is not None else ""
        if self.drifted:
            name, index, gap = self.drifted[0]
            seen += f", {len(self.drifted)} drifted, first: {name} token {index} by {gap:.2f}"
        return seen

    def to_dict(self) -> dict:
        return {
            "tokens": self.tokens,
            "ties": list(self.ties),
            "misses": [list(miss) for miss in self.misses],
            "drift": self.drift_summary(),
            "drifted": [list(d) for d in self.drifted],
        }


def top_k(entry: dict[int, float], k: int = TOP_K) -> set[int]:
    """The K most likely token ids of ENTRY (ties broken by id, as a stable order)."""
    return {t for t, _ in sorted(entry.items(), key=lambda kv: (-kv[1], kv[0]))[:k]}


def greedy_check(
    name: str,
    prompt_len: int,
    output: Sequence[int],
    logprobs: Logprobs,
    tie: float = TIE_NATS,
    offset: int = 0,
    path: Sequence[dict[int, float]] = (),
    drift_nats: float = DRIFT_NATS,
) -> GreedyCheck:
    """Whether each OUTPUT token is the greedy choice of the plain model whose per-position
    LOGPROBS (prompt_logprobs of prompt + output, one prefill) are given, and, where the
    PATH's own top-K logprobs per token are given, how far they drifted from the plain
    model's (a token more than DRIFT_NATS off is named). Misses are named by index in
    OUTPUT plus OFFSET."""
    ties, misses, drift, overlap, drifted = [], [], [], [], []
    for i, token in enumerate(output):
        entry = logprobs[prompt_len + i] if prompt_len + i < len(logprobs) else None
        if not entry:
            misses.append((name, i + offset, float("inf")))
            continue
        gap = max(entry.values()) - entry.get(token, float("-inf"))
        if gap > tie:
            misses.append((name, i + offset, gap))
        elif gap > 0:
            ties.append(gap)
        own = path[i] if i < len(path) else None
        if own and token in own and token in entry:
            d = abs(own[token] - entry[token])
            drift.append(d)
            if d > drift_nats:
                drifted.append((name, i + offset, d))
            k = min(len(top_k(own)), len(top_k(entry)))
            overlap.append(len(top_k(own) & top_k(entry)) / k if k else 1.0)
    return GreedyCheck(
        len(output), tuple(ties), tuple(misses), tuple(drift), tuple(overlap), tuple(drifted)
    )


def plain_logprobs(
    client: Client,
    model: str,
    sequence: Sequence[int],
    salt: str,
    max_model_len: int | None = None,
    top: int = 1,
) -> Logprobs:
    """The plain model's logprobs at every position of SEQUENCE (None at the first): one
    cold prefill. A sequence of MAX_MODEL_LEN tokens has no room for the one token a
    request must generate: all but its last token are sent, and the generated token's own
    top logprobs are the last position's."""
    if max_model_len is None or len(sequence) < max_model_len:
        return client.prompt_logprobs(model, sequence, salt, top)
    body = {
        "model": model,
        "prompt": list(sequence[:-1]),
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": top,
        "logprobs": LAST_TOP,
        "return_tokens_as_token_ids": True,
        "cache_salt": salt,
    }
    choice = client.completion(body)["choices"][0]
    entries: Logprobs = [
        None if e is None else {int(k): float(v["logprob"]) for k, v in e.items()}
        for e in choice["prompt_logprobs"]
    ]
    last = choice["logprobs"]["top_logprobs"][0]
    entries.append({token_id(k): float(v) for k, v in last.items()})
    return entries


def check_against_plain(
    client: Client,
    model: str,
    sequences: Sequence[tuple[str, Sequence[int], Sequence[int]]],
    max_model_len: int | None = None,
    paths: Sequence[Sequence[dict[int, float]]] = (),
    drift_nats: float = DRIFT_NATS,
) -> GreedyCheck:
    """Each (name, prompt, output) of SEQUENCES against one cold prefill of prompt + output
    (a fresh cache_salt for the whole call: nothing of the produced run is reused); with
    PATHS (each sequence's own top-K logprobs per token) its drift too."""
    salt = uuid.uuid4().hex
    result = GreedyCheck()
    top = TOP_K if paths else 1
    for i, (name, prompt, output) in enumerate(sequences):
        seq = [*prompt, *output]
        logprobs = plain_logprobs(client, model, seq, salt, max_model_len, top)
        path = paths[i] if i < len(paths) else ()
        result += greedy_check(
            name, len(prompt), output, logprobs, path=path, drift_nats=drift_nats
        )
    return result


def tokens_of(base: Sequence[int], length: int, shift: int = 0) -> list[int]:
    """LENGTH token ids: BASE tiled, rotated by SHIFT (distinct prompts, same vocabulary)."""
    if not base:
        raise ArcvllmError("the server's tokenizer returned no tokens for the prompt text")
    n = len(base)
    return [base[(i + shift) % n] for i in range(length)]
