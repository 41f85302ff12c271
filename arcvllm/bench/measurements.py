"""What vLLM's benchmark does not measure for hybrids, against the same running server.

- inter-token latency on the decode steps that cross a mamba block boundary (where align
  mode copies the recurrent state) against all other steps, with exact-length token-id
  prompts and the block size the server reports on /metrics;
- the prefix cache on a long shared prefix: TTFT cold vs warm and the hit rate, from the
  server's own counters.
The position arithmetic and the statistics are pure; the server is arcvllm.client.api's.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from arcvllm.client import metrics as m
from arcvllm.client.api import Client, Stream
from arcvllm.client.stats import percentile
from arcvllm.errors import ArcvllmError


@dataclass(frozen=True)
class TokenStep:
    """One inter-token gap: the first position its tokens were computed from, and its ITL."""

    position: int
    tokens: int
    itl_ms: float
    crosses: bool


def token_steps(stream: Stream, block: int) -> list[TokenStep]:
    """Inter-token gaps placed at the positions the engine computed.

    Output token k (0-based) comes from the step that computes position prompt_len + k - 1
    (token 0 comes from prefill). Align mode checkpoints the mamba state when a step starts
    a new block: a step crosses when one of its positions is a multiple of BLOCK. A chunk
    of several tokens is one step here, its gap spread over its tokens.
    """
    out = []
    produced = stream.chunks[0].tokens
    for chunk, before in zip(stream.chunks[1:], stream.chunks[:-1], strict=True):
        first = stream.prompt_len + produced - 1
        # A chunk of several tokens (a loaded client reads them together) crosses at the
        # block's first position inside it: that is the step's position then.
        at = next((p for p in range(first, first + chunk.tokens) if p % block == 0), first)
        crosses = at % block == 0
        out.append(
            TokenStep(at, chunk.tokens, 1000 * (chunk.at - before.at) / chunk.tokens, crosses)
        )
        produced += chunk.tokens
    return out


def boundary_summary(steps: Sequence[TokenStep]) -> dict[str, Any]:
    cross = [s.itl_ms for s in steps if s.crosses]
    other = [s.itl_ms for s in steps if not s.crosses]
    p50c, p50o = percentile(cross, 50), percentile(other, 50)
    return {
        "boundary_steps": len(cross),
        "other_steps": len(other),
        "itl_ms_boundary_p50": p50c,
        "itl_ms_boundary_p99": percentile(cross, 99),
        "itl_ms_boundary_max": max(cross) if cross else None,
        "itl_ms_other_p50": p50o,
        "itl_ms_other_p99": percentile(other, 99),
        "boundary_over_other_p50": (p50c / p50o) if p50c and p50o else None,
        "boundary_positions": sorted({s.position for s in steps if s.crosses}),
    }


def boundary_lengths(block: int, max_model_len: int, crossings: int) -> tuple[int, int]:
    """(prompt length, tokens to decode) so decode crosses CROSSINGS block boundaries."""
    prompt = max(block // 2, 1)
    end = min(crossings * block + 2, max_model_len - 1)
    if end <= block:
        raise ArcvllmError(
            f"max-model-len {max_model_len} leaves no room to decode past block {block}"
        )
    return prompt, end - prompt


def prefix_length(block: int, max_model_len: int) -> int:
    """Length of the shared-prefix prompt: whole blocks + 1, so align mode can hit them all."""
    blocks = min(12, (max_model_len * 3 // 4) // block)
    if blocks < 1:
        raise ArcvllmError(f"max-model-len {max_model_len} holds no full block of {block}")
    return blocks * block + 1


# ---- the edges: the server


def token_pool(client: Client, model: str) -> list[int]:
    """Real token ids of the served tokenizer, to draw exact-length prompts from."""
    text = " ".join(f"block {i} prefix cache decode state copy" for i in range(200))
    return sorted(set(client.tokenize(model, text)))


def stream(client: Client, model: str, prompt: list[int], max_tokens: int) -> Stream:
    """A greedy completion, timed chunk by chunk; one that brings no token is an error."""
    out = client.stream(model, prompt, max_tokens)
    if not out.chunks:
        raise ArcvllmError("the server streamed no tokens (or no usage in its chunks)")
    return out


def measure_boundaries(
    client: Client,
    model: str,
    block: int,
    max_len: int,
    crossings: int,
    runs: int,
    rng: random.Random,
) -> tuple[list[Stream], dict[str, Any]]:
    pool = token_pool(client, model)
    prompt_len, decode = boundary_lengths(block, max_len, crossings)
    streams = [
        stream(client, model, [rng.choice(pool) for _ in range(prompt_len)], decode)
        for _ in range(runs)
    ]
    summary = boundary_summary([s for st in streams for s in token_steps(st, block)])
    summary.update(prompt_len=prompt_len, decode_tokens=decode, runs=runs)
    return streams, summary


def measure_prefix(
    client: Client,
    model: str,
    block: int,
    max_len: int,
    runs: int,
    rng: random.Random,
    speculative: bool = False,
) -> dict[str, Any]:
    """TTFT cold vs warm and the warm hit rate. SPECULATIVE (EAGLE/MTP): vLLM stores the
    replay checkpoint of a prompt when it sees it again, so the third send is the warm
    one (docs/smoke.md, Speculative decoding)."""
    pool = token_pool(client, model)
    length = prefix_length(block, max_len)
    cold, warm, rates, hits_total, queries_total = [], [], [], 0.0, 0.0
    for _ in range(runs):
        prompt = [rng.choice(pool) for _ in range(length)]  # fresh prefix: truly cold
        base = m.prefix_cache(client.metrics())
        first = stream(client, model, prompt, 2)
        before = client.prefix_cache_after(base)  # the cold request's queries are counted
        if speculative:
            stream(client, model, prompt, 2)
            before = client.prefix_cache_after(before)
        second = stream(client, model, prompt, 2)
        delta = client.prefix_cache_after(before) - before
        cold.append(first.ttft * 1000)
        warm.append(second.ttft * 1000)
        rates.append(delta.hits / delta.queries if delta.queries else 0.0)
        hits_total += delta.hits
        queries_total += delta.queries
    cold_p50 = percentile(cold, 50)
    return {
        "prompt_len": length,
        "runs": runs,
        "ttft_ms_cold": cold_p50,
        "ttft_ms_warm": percentile(warm, 50),
        "warm_hit_rate": percentile(rates, 50),
        "warm_hits": hits_total,
        "warm_queries": queries_total,
        "prefill_tok_s": length / (cold_p50 / 1000) if cold_p50 else None,
    }


# ---- delivery: did the tokens reach this client as the server made them?

# No decode step of any server here takes under a millisecond (the tiny CPU model's ~6 ms
# is the fastest): chunks that arrive closer together were held back on the way and let go
# together. A stream most of whose tokens came so is delivered in bulk: its inter-token
# latencies measure the hold, not the server, and only a wall-time rate means anything.
BULK_GAP_S = 0.001
BULK_SHARE = 0.5


def bulk_share(stream: Stream) -> float:
    """The share of the tokens after the first chunk that arrived less than BULK_GAP_S
    after the chunk before them (0.0 for a stream of one chunk)."""
    after = stream.tokens - (stream.chunks[0].tokens if stream.chunks else 0)
    if after <= 0:
        return 0.0
    bunched = sum(
        chunk.tokens
        for before, chunk in zip(stream.chunks, stream.chunks[1:], strict=False)
        if chunk.at - before.at < BULK_GAP_S
    )
    return bunched / after


def in_bulk(stream: Stream) -> bool:
    """Most of the stream's tokens arrived bunched (bulk_share >= BULK_SHARE)."""
    return bulk_share(stream) >= BULK_SHARE


def bulk_note(streams: int, bulk: int) -> str | None:
    """The report's line when BULK of STREAMS streams arrived in bulk, else None."""
    if not bulk:
        return None
    return (
        f"warning: {bulk} of {streams} streams arrived in bulk (most tokens < "
        f"{BULK_GAP_S * 1000:g} ms apart: held back on the way, e.g. by a buffering proxy or "
        "a loaded client): tokens/s is wall time over the tokens received; the inter-token "
        "latencies of those streams measure the hold, not the server"
    )


# ---- speculative decoding: the same prompts on a plain and a speculative server


def decode_summary(streams: Sequence[Stream]) -> dict[str, Any]:
    """Decode tokens/s (median over streams, each its tokens over its wall time),
    inter-token latency over every gap, and how many streams arrived in bulk."""
    rates = [r for r in (s.decode_tok_s() for s in streams) if r]
    gaps = [g * 1000 for s in streams for g in s.token_gaps()]
    bulk = sum(in_bulk(s) for s in streams)
    return {
        "decode_tok_s": percentile(rates, 50),
        "itl_ms_p50": percentile(gaps, 50),
        "itl_ms_p90": percentile(gaps, 90),
        "itl_ms_p99": percentile(gaps, 99),
        "streams": len(streams),
        "tokens": sum(s.tokens for s in streams),
        "bulk_streams": bulk,
        "bulk_delivery": bulk > 0,
    }


def speculation_summary(run: m.SpecDecode | None) -> dict[str, Any] | None:
    """Acceptance over a run, from the difference of the server's own counters."""
    if run is None:
        return None
    return {
        "draft_tokens": run.draft_tokens,
        "accepted_tokens": run.accepted,
        "acceptance_rate": run.acceptance_rate,
        "mean_accepted_length": run.mean_accepted_length,
    }


def compare_speculation(
    speculative: Client,
    plain: Client,
    model: str,
    block: int,
    max_len: int,
    crossings: int,
    runs: int,
    rng: random.Random,
) -> dict[str, Any]:
    """Decode the same prompts (across CROSSINGS block boundaries) on both servers, one
    stream at a time, alternating; tokens/s, ITL percentiles and the speculative
    server's acceptance over exactly these streams."""
    pool = token_pool(speculative, model)
    prompt_len, decode = boundary_lengths(block, max_len, crossings)
    prompts = [[rng.choice(pool) for _ in range(prompt_len)] for _ in range(runs)]
    before = m.spec_decode(speculative.metrics(), model)
    spec_streams, plain_streams = [], []
    for prompt in prompts:
        plain_streams.append(stream(plain, model, prompt, decode))
        spec_streams.append(stream(speculative, model, prompt, decode))
    after = m.spec_decode(speculative.metrics(), model)
    out: dict[str, Any] = {
        "prompt_len": prompt_len,
        "decode_tokens": decode,
        "runs": runs,
        "plain": decode_summary(plain_streams),
        "speculative": decode_summary(spec_streams),
        "acceptance": speculation_summary(after - before if after and before else None),
        "same_tokens": sum(
            a.token_ids == b.token_ids for a, b in zip(plain_streams, spec_streams, strict=True)
        ),
    }
    plain_rate = out["plain"]["decode_tok_s"]
    spec_rate = out["speculative"]["decode_tok_s"]
    out["speedup"] = spec_rate / plain_rate if plain_rate and spec_rate else None
    return out
