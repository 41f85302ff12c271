"""What `arcvllm verify` sends, derived from what the server is, and how it judges what
comes back: pure functions, no server.

Every row is planned from the server's geometry (its block size, context length, prefill
chunk and KV cache), so the same rows cross the same kinds of boundary on a tiny CPU model
(256-token blocks) and on Qwen3.6 on a B70 (1088-token blocks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from arcvllm.errors import ArcvllmError

# The rows, in the order they run and are shown. Each names the path it proves.
DECODE = "boundary decode"
CHUNKED = "chunked prefill"
RESUME = "cached prefix resumed"
MIXED = "mixed batches"
PREEMPTION = "preemption"
MAX_LEN = "max-model-len"
RESIDUES = "prompt residues mod 64"
DEGENERATION = "degeneration"
ROWS = (DECODE, CHUNKED, RESUME, MIXED, PREEMPTION, MAX_LEN, RESIDUES, DEGENERATION)

# A row judged against another path's output, or whose own requests take another row's
# path too, is not judged when that path failed: what it saw would be that row's defect,
# not its own. The chunked prefill is checked against the decode path (no prefill longer
# than the chunk is unchunked); preemption and a request to max-model-len decode across
# block boundaries; preemption happens in batches that mix prefill and decode; the
# max-model-len reference is a prefill in chunks; half the residue prompts resume a cached
# prefix. The other rows stay off the other paths by their shapes: the resumed and the
# mixed requests decode inside one block.
NEEDS = {
    CHUNKED: (DECODE,),
    RESIDUES: (RESUME,),  # half its prompts resume a cached prefix
    PREEMPTION: (DECODE, MIXED),
    MAX_LEN: (DECODE, CHUNKED),
}

# Degeneration: a healthy model sampling from open prompts neither repeats one token this
# many times in a row nor puts nearly all its probability on one token at every step. Both
# are what NaN or a lost state looks like from outside ("!!!!" with HTTP 200).
MAX_RUN = 16
ENTROPY_FLOOR = 0.02  # nats, mean over the sampled tokens of the top-k entropy
TOP_LOGPROBS = 5
OPEN_PROMPTS = (
    "The lighthouse keeper climbed the stairs one last time and",
    "Here is a recipe for bread that anyone can bake at home:",
    "Q: Why do leaves change colour in autumn?\nA:",
    "def merge_sorted(a, b):\n",
)
# Requests at once in the mixed-batch and preemption rows (vLLM's max-num-seqs must allow
# them; the rows say what they saw).
STREAMS = 8
# Decodes batched together across the boundary decode row's two block boundaries, beside
# its single stream: each crosses at its own step, while the others decode.
DECODE_STREAMS = 3
# Tokens decoded after each residue prompt: enough for a lost state to show in the greedy
# tokens, few enough that 128 of them stay cheap (one batched request each way).
RESIDUE_TOKENS = 8


@dataclass(frozen=True)
class Geometry:
    """What the rows are planned from, all read from the server (or given)."""

    block_size: int
    max_model_len: int
    chunk_tokens: int | None  # max-num-batched-tokens: a longer prompt is prefilled in chunks
    kv_tokens: int | None  # the KV cache's size in tokens (None: the server does not say)


@dataclass(frozen=True)
class Plan:
    """Token counts of every row."""

    geometry: Geometry
    decode_prompt: int  # ends 8 tokens before the first boundary
    decode_tokens: int  # crosses two boundaries
    chunked_prompt: int  # a short prompt decoded past the chunk ...
    chunked_total: int  # ... to this length, then prefilled whole (in chunks)
    resume_prompt: int  # cached first: ends mid-block
    resume_shared: int  # its first tokens, just past the cached block boundary ...
    resume_extension: int  # ... extended: resumed from the boundary's state
    resume_tokens: int  # and decoded right after it (inside the block)
    mixed_short: int  # sent first, prefilled at once: it decodes while the others ...
    mixed_prompt: int  # ... (the longest of them) together more than one chunk, prefill
    mixed_tokens: int  # (each decode inside the prompt's last block)
    preempt_prompt: int
    preempt_tokens: int  # per request; 0: the KV cache is too large to run out
    max_len_prompt: int
    residue_base: int  # prompts of residue_base + r tokens, r = 0..63, each decoded ...
    residue_tokens: int  # ... this many tokens, fresh and on top of a cached prefix of
    residue_prefix: int  # this many tokens (a block: the prefix cache keeps its state)
    open_tokens: int

    @property
    def chunked(self) -> bool:
        """Whether this server chunks any prompt it can hold."""
        return self.chunked_total > 0

    def prompt_lengths(self) -> dict[str, list[int]]:
        """The length of every prompt each row sends (its own text, not the plain model's
        prefill of what came back), by row: what the prompt corpus must hold."""
        return {
            DECODE: [self.decode_prompt],
            CHUNKED: [self.chunked_prompt] if self.chunked else [],
            RESUME: [self.resume_prompt, self.resume_shared + self.resume_extension],
            MIXED: [self.mixed_short] + [self.mixed_prompt - i for i in range(STREAMS - 1)],
            PREEMPTION: [self.preempt_prompt + i for i in range(STREAMS)]
            if self.preempt_tokens
            else [],
            MAX_LEN: [self.max_len_prompt],
            RESIDUES: [self.residue_base + r for r in range(64)]
            + [self.residue_prefix + self.residue_base],
            DEGENERATION: [],  # the open prompts, text of their own
        }

    def longest_prompt(self, rows: Sequence[str] = ROWS) -> int:
        return max((n for row in rows for n in self.prompt_lengths()[row]), default=0)


def plan_rows(g: Geometry) -> Plan:
    """The rows' token counts; an ArcvllmError when the context cannot hold them."""
    b, n, c = g.block_size, g.max_model_len, g.chunk_tokens
    if b <= 16:
        raise ArcvllmError(f"block size {b} is too small for a hybrid model")
    if 2 * b + 16 + 8 > n:
        raise ArcvllmError(
            f"max_model_len {n} is too short to cross two blocks of {b} tokens (needs {2 * b + 24})"
        )
    # The chunked prefill: past the chunk and across at least one more block after it.
    chunked_total = c + b + 16 if c is not None and c + b + 16 + 8 <= n else 0
    return Plan(
        geometry=g,
        decode_prompt=b - 8,
        decode_tokens=b + 24,
        chunked_prompt=b // 2,
        chunked_total=chunked_total,
        resume_prompt=2 * b + b // 2,
        resume_shared=2 * b + 4,
        resume_extension=4,
        resume_tokens=b // 8,
        mixed_short=16,
        mixed_prompt=mixed_prompt(g),
        mixed_tokens=b // 8,
        preempt_prompt=b // 2,
        preempt_tokens=preempt_tokens(g),
        max_len_prompt=b // 2,
        residue_base=64,
        residue_tokens=RESIDUE_TOKENS,
        residue_prefix=b,
        open_tokens=min(128, n - 64),
    )


def mixed_prompt(g: Geometry) -> int:
    """The length of the longest of the mixed row's STREAMS - 1 long prompts (the others one
    token shorter each). They go in one request after the short one and together need 1.25
    prefill chunks: whatever steps the engine splits them into, some of their prefill runs
    beside the short one's decode. Each prompt and its decode (an eighth of a block) stay
    inside one block where that is enough, else the decode stays inside the prompt's last
    block."""
    chunk = g.chunk_tokens or g.block_size
    longs = STREAMS - 1
    need = math.ceil(1.25 * chunk / longs) + longs
    if need + g.block_size // 8 + 16 <= g.block_size:
        return need
    return math.ceil(need / g.block_size) * g.block_size + 16 + longs


def preempt_tokens(g: Geometry) -> int:
    """Tokens each of STREAMS requests decodes so that together they need twice the KV
    cache (the scheduler must preempt some and recompute them); 0 when even STREAMS
    requests of max-model-len fit (a server with a large KV cache: nothing to run out)."""
    if g.kv_tokens is None:
        return 0
    per_request = math.ceil(2 * g.kv_tokens / STREAMS)
    if per_request + g.block_size > g.max_model_len:
        return 0
    return per_request


# ---- rows that did not exercise their path (INCOMPLETE), and how to make them run

PREEMPT_ROUNDS = 3
CHUNK_SOURCES = "--max-num-batched-tokens N, --preset, or the server's log (--log-file/--log-cmd)"


def chunk_room(g: Geometry) -> int:
    """The largest prefill chunk the chunked row can go past within max-model-len."""
    return g.max_model_len - g.block_size - 24


def kv_room(g: Geometry) -> int:
    """The largest KV cache (tokens) STREAMS requests within max-model-len run out twice."""
    return STREAMS // 2 * (g.max_model_len - g.block_size)


def unexercised(
    row: str, plan: Plan, preempted: float | None = None, resumed: float | None = None
) -> str:
    """How to make ROW exercise its path on this server when, by the plan or by what the
    server counted (PREEMPTED requests, tokens RESUMED from the prefix cache), it did not;
    '' when it did."""
    g = plan.geometry
    if row == CHUNKED and not plan.chunked:
        if g.chunk_tokens is None:
            return f"the prefill chunk is unknown: give it ({CHUNK_SOURCES})"
        return (
            f"max-model-len {g.max_model_len} has no room past the chunk of {g.chunk_tokens}: "
            f"start the server with --max-num-batched-tokens {chunk_room(g)} or less"
        )
    if row == MIXED and g.chunk_tokens is None:
        return (
            "the prefill chunk is unknown, so the long prompts may all prefill in one step "
            f"with nothing decoding beside them: give it ({CHUNK_SOURCES})"
        )
    smaller_kv = (
        f"start the server with a KV cache of at most {kv_room(g)} tokens (vLLM's "
        "--num-gpu-blocks-override or --kv-cache-memory-bytes) and --max-num-seqs "
        f"{STREAMS} or more"
    )
    if row == PREEMPTION and not plan.preempt_tokens:
        kv = "of unknown size" if g.kv_tokens is None else f"of {g.kv_tokens} tokens"
        return f"the KV cache {kv} holds {STREAMS} requests of max-model-len: {smaller_kv}"
    if row == PREEMPTION and preempted is not None and preempted <= 0:
        return f"nothing was preempted in {PREEMPT_ROUNDS} rounds: {smaller_kv}"
    if row == RESUME and resumed is not None and resumed < g.block_size:
        return (
            f"{resumed:.0f} tokens were resumed from the prefix cache, less than a block: "
            "start the server with --enable-prefix-caching"
        )
    return ""


def boundaries_crossed(start: int, end: int, block_size: int) -> int:
    """Block boundaries between positions START and END (a sequence grown from START to
    END tokens)."""
    return end // block_size - start // block_size


def longest_run(tokens: Sequence[int]) -> int:
    """The longest run of one token repeated."""
    best = run = 0
    previous = None
    for token in tokens:
        run = run + 1 if token == previous else 1
        previous = token
        best = max(best, run)
    return best


def top_entropy(top: dict[str, float] | None) -> float:
    """The entropy (nats) of one step's top-k logprobs (a lower bound of the step's)."""
    if not top:
        return 0.0
    return -sum(math.exp(lp) * lp for lp in top.values() if math.isfinite(lp))


def finite(values: Sequence[float | None]) -> bool:
    """Every value a finite float (a logprob of None is the first prompt position's)."""
    return all(v is None or math.isfinite(v) for v in values)


@dataclass(frozen=True)
class Degeneration:
    """What one sampled answer to an open prompt looks like."""

    tokens: int
    longest_run: int
    mean_entropy: float
    finite: bool

    @property
    def degenerate(self) -> bool:
        return (
            not self.finite
            or self.longest_run >= MAX_RUN
            or (self.tokens > 0 and self.mean_entropy < ENTROPY_FLOOR)
        )


def degeneration(token_ids: Sequence[int], tops: Sequence[dict[str, float] | None]) -> Degeneration:
    """Judge one sampled answer from its token ids and its per-step top-k logprobs."""
    values = [lp for top in tops if top for lp in top.values()]
    entropies = [top_entropy(top) for top in tops]
    return Degeneration(
        tokens=len(token_ids),
        longest_run=longest_run(token_ids),
        mean_entropy=sum(entropies) / len(entropies) if entropies else 0.0,
        finite=finite(values),
    )
