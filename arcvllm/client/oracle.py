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

from arcvllm.client.api import Client
from arcvllm.errors import ArcvllmError

# A token is the plain model's greedy choice when it is the top token of the plain model's
# prediction at its position, or within this many nats of it. Another path computes the
# same math in another order (decode against prefill, a recompute after preemption, a
# batch of another shape, several tokens verified per step): near-ties flip. Measured on
# the tiny model over every row of `arcvllm verify`: healthy paths are off by up to 0.5
# nats, rarely; a state spoiled at a block boundary puts most tokens after it 1 to 9 nats
# below the plain model's choice.
TIE_NATS = 1.0

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


def plain_logprobs(
    client: Client, model: str, sequence: Sequence[int], salt: str, max_model_len: int | None = None
) -> Logprobs:
    """The plain model's logprobs at every position of SEQUENCE (None at the first): one
    cold prefill. A sequence of MAX_MODEL_LEN tokens has no room for the one token a
    request must generate: all but its last token are sent, and the generated token's own
    top logprobs are the last position's."""
    if max_model_len is None or len(sequence) < max_model_len:
        return client.prompt_logprobs(model, sequence, salt)
    body = {
        "model": model,
        "prompt": list(sequence[:-1]),
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 1,
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


def token_id(token: str) -> int:
    """The id of a token vLLM names 'token_id:N' (return_tokens_as_token_ids)."""
    return int(token.rpartition(":")[2])


def check_against_plain(
    client: Client,
    model: str,
    sequences: Sequence[tuple[str, Sequence[int], Sequence[int]]],
    max_model_len: int | None = None,
) -> GreedyCheck:
    """Each (name, prompt, output) of SEQUENCES against one cold prefill of prompt + output
    (a fresh cache_salt for the whole call: nothing of the produced run is reused)."""
    salt = uuid.uuid4().hex
    result = GreedyCheck()
    for name, prompt, output in sequences:
        logprobs = plain_logprobs(client, model, [*prompt, *output], salt, max_model_len)
        result += greedy_check(name, len(prompt), output, logprobs)
    return result


def tokens_of(base: Sequence[int], length: int, shift: int = 0) -> list[int]:
    """LENGTH token ids: BASE tiled, rotated by SHIFT (distinct prompts, same vocabulary)."""
    if not base:
        raise ArcvllmError("the server's tokenizer returned no tokens for the prompt text")
    n = len(base)
    return [base[(i + shift) % n] for i in range(length)]
