"""The text verify's prompts are cut from: a small shipped corpus of natural passages
(prose in English, German, French and Spanish, Python, shell), no 8-gram of it repeated.

A real model continues a periodic text by copying it through its attention layers: a
lost, stale or zeroed recurrent state would still yield the same continuation. Text that
never repeats itself leaves the model no such shortcut, so what the GatedDeltaNet state
carries shows in the tokens. Each prompt is a window of the corpus's token ids, read
cyclically (the last passage runs into the first), at most the corpus long: no window
holds any 8-gram twice, of words or of the server's tokens (`Prompts` checks every
prompt it hands out against the tokenizer it was given).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

from arcvllm.errors import ArcvllmError

NGRAM = 8
# Between consecutive prompts of a run: far enough apart that prompts sent together share
# no prefix block (nothing cached between them), and a prime, so 64 residue prompts and
# the batches land all over the corpus.
STRIDE = 389
HEADER_END = "---\n"


@dataclass(frozen=True)
class Passage:
    name: str
    source: str  # where the text comes from, and its licence (the file's header)
    text: str


def passages() -> list[Passage]:
    """The corpus's passages in order (arcvllm/verify/corpus/*.txt, by name), each file a
    header (`source:`, `licence:`) then `---` then the text."""
    folder = resources.files("arcvllm.verify") / "corpus"
    out = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".txt"):
            continue
        header, sep, text = entry.read_text(encoding="utf-8").partition(HEADER_END)
        if not sep:
            raise ArcvllmError(f"corpus passage {entry.name} has no '---' header line")
        out.append(Passage(entry.name, header.strip(), text))
    return out


def corpus_text() -> str:
    """Every passage, in order, one after the other (each ends with a newline)."""
    return "\n".join(p.text for p in passages())


def corpus_digest() -> str:
    """A short digest of the corpus: two runs with the same one cut the same prompts."""
    return hashlib.sha256(corpus_text().encode()).hexdigest()[:16]


def repeated(items: Sequence, n: int = NGRAM, cyclic: bool = False) -> int | None:
    """The start of the first N-gram of ITEMS that occurred before in it (CYCLIC: ITEMS
    read round, the end running into the start); None when no N-gram repeats."""
    length = len(items)
    ring = list(items) + (list(items[: n - 1]) if cyclic and length >= n else [])
    seen: set[tuple] = set()
    for i in range(len(ring) - n + 1):
        gram = tuple(ring[i : i + n])
        if gram in seen:
            return i
        seen.add(gram)
    return None


def words(text: str) -> list[str]:
    return text.split()


def reach(tokens: Sequence[int], n: int = NGRAM) -> int:
    """The longest window of TOKENS, read round, that holds no N-gram twice: the closest
    two occurrences of one N-gram, N - 1 tokens added (at most TOKENS' length)."""
    length = len(tokens)
    ring = [*tokens, *tokens, *tokens[: n - 1]]  # twice round: pairs across the end too
    last: dict[tuple, int] = {}
    best = length
    for i in range(len(ring) - n + 1):
        gram = tuple(ring[i : i + n])
        if gram in last:
            best = min(best, i - last[gram] + n - 1)
        last[gram] = i
    return best


@dataclass
class Prompts:
    """Prompts of exact lengths cut from the corpus's TOKENS (its ids in the server's
    tokenizer), each window starting STRIDE tokens after the last one's start."""

    tokens: list[int]
    offset: int = 0

    def __post_init__(self) -> None:
        if len(self.tokens) < 2 * NGRAM:
            raise ArcvllmError("the server's tokenizer returned almost nothing for the corpus")
        self.reach = reach(self.tokens)

    def refuse_beyond(self, length: int) -> None:
        """An ArcvllmError, in one line, when a prompt of LENGTH tokens would hold some
        8-gram of the corpus twice."""
        if length > self.reach:
            raise ArcvllmError(
                f"a prompt of {length} tokens is longer than verify's corpus holds without "
                f"repeating an {NGRAM}-gram ({self.reach} of its {len(self.tokens)} tokens in "
                "this tokenizer)"
            )

    def seek(self, part: int, parts: int) -> None:
        """Start the next window at the PART-th of PARTS equal places of the corpus (a
        row's own: its prompts do not depend on which rows ran before it)."""
        self.offset = part * len(self.tokens) // parts

    def take(self, length: int) -> list[int]:
        """LENGTH token ids of the corpus, from the current offset (read round)."""
        self.refuse_beyond(length)
        n = len(self.tokens)
        start = self.offset
        self.offset = (self.offset + STRIDE) % n
        return [self.tokens[(start + i) % n] for i in range(length)]


def fresh(prompt: Sequence[int]) -> None:
    """Refuse a prompt put together from windows that repeats an 8-gram of tokens (an
    ArcvllmError saying where)."""
    at = repeated(prompt)
    if at is not None:
        raise ArcvllmError(
            f"a prompt of {len(prompt)} tokens repeats the {NGRAM}-gram at token {at}"
        )
