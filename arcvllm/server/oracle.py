"""The model as its own oracle: the plain model's greedy choice at every position.

A sequence a server produced (prompt + output) is sent back once as a prompt, with
`prompt_logprobs` and a fresh prefix-cache namespace (cache_salt): one cold prefill, no
decode, no speculation, nothing resumed. At each output position its top token is what the
plain model chooses; the produced token must be that one, or within a bf16 tie of it.
Used by the smoke test's decode checks and by every row of `arcvllm verify`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from arcvllm.errors import ArcvllmError
from arcvllm.server.client import Client

# A token is the plain model's greedy choice when it is the top token of the plain model's
# prediction at its position, or within this many nats of it: a bf16 tie (one bf16 step at
# |logit| 8-16). Verifying several tokens per step, or a batch of another shape, computes
# the same math in another order, which flips near-ties of a random-weight model (measured
# on the tiny model: 4 of 280 tokens, gaps <= 0.016 nats); a corrupted state is off by far
# more.
TIE_NATS = 0.0625

Logprobs = list[dict[int, float] | None]


@dataclass(frozen=True)
class GreedyCheck:
    """How decoded sequences compare with the plain model's greedy choice per position."""

    tokens: int = 0
    ties: tuple[float, ...] = ()  # gaps (nats) of tokens that were a tie, not the top one
    misses: tuple[tuple[str, int, float], ...] = ()  # (sequence, output index, gap)

    def __add__(self, other: GreedyCheck) -> GreedyCheck:
        return GreedyCheck(
            self.tokens + other.tokens, self.ties + other.ties, self.misses + other.misses
        )

    def summary(self) -> str:
        """'N of M tok' with the ties and the first miss, for a check's 'seen' column."""
        seen = f"{self.tokens - len(self.misses)} of {self.tokens} tok"
        if self.ties:
            seen += f" ({len(self.ties)} bf16 ties, max {max(self.ties):.3f} nats)"
        if self.misses:
            name, index, gap = self.misses[0]
            seen += f"; {len(self.misses)} off, first: {name} token {index} by {gap:.2f} nats"
        return seen

    def to_dict(self) -> dict:
        return {
            "tokens": self.tokens,
            "ties": list(self.ties),
            "misses": [list(miss) for miss in self.misses],
        }


def greedy_check(
    name: str,
    prompt_len: int,
    output: Sequence[int],
    logprobs: Logprobs,
    tie: float = TIE_NATS,
    offset: int = 0,
) -> GreedyCheck:
    """Whether each OUTPUT token is the greedy choice of the plain model whose per-position
    LOGPROBS (prompt_logprobs of prompt + output, one prefill) are given. Misses are named
    by index in OUTPUT plus OFFSET."""
    ties, misses = [], []
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
    return GreedyCheck(len(output), tuple(ties), tuple(misses))


def check_against_plain(
    client: Client, model: str, sequences: Sequence[tuple[str, Sequence[int], Sequence[int]]]
) -> GreedyCheck:
    """Each (name, prompt, output) of SEQUENCES against one cold prefill of prompt + output
    (a fresh cache_salt for the whole call: nothing of the produced run is reused)."""
    salt = uuid.uuid4().hex
    result = GreedyCheck()
    for name, prompt, output in sequences:
        logprobs = client.prompt_logprobs(model, [*prompt, *output], salt)
        result += greedy_check(name, len(prompt), output, logprobs)
    return result


def tokens_of(base: Sequence[int], length: int, shift: int = 0) -> list[int]:
    """LENGTH token ids: BASE tiled, rotated by SHIFT (distinct prompts, same vocabulary)."""
    if not base:
        raise ArcvllmError("the server's tokenizer returned no tokens for the prompt text")
    n = len(base)
    return [base[(i + shift) % n] for i in range(length)]
