"""A healthy run of `arcvllm verify`, recorded (`--record FILE`), and a later run compared
with it (`--against FILE`): an upgrade, another stack on the same host, or the canary
against the day it was deployed.

A record holds, per row that passed, each sequence's prompt (its fingerprint), the tokens
the path produced and the path's top-K token ids at each of them, and the row's drift
(|Δ logprob| against the plain model: p50/p99/max); beside them the model, the vLLM it ran
on, the geometry the rows were planned from and the corpus the prompts were cut from.
Compared, a row fails when a token differs and the two runs' tokens are not in each
other's top K at that position (a near tie may flip, and the sequences then part: they
are compared up to there, as vLLM's check_logprobs_close does), or when its drift p99
exceeds the record's by more than a margin. A record of another model or geometry plans
other prompts: it is refused, in one line (exit 2).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from arcvllm.errors import UsageError

KIND = "arcvllm verify record"
# How much (nats) a row's drift p99 may exceed the record's: the runs of a batch of another
# shape move logprobs by hundredths of a nat on the tiny model (docs/verify.md).
MARGIN = 0.25
# What must be equal for two runs to send the same prompts.
GEOMETRY = ("block_size", "max_model_len", "chunk_tokens")


def fingerprint(ids: Sequence[int]) -> str:
    """A short digest of a token-id sequence (two runs sent the same prompt)."""
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:16]


def sequence(prompt: Sequence[int], tokens: Sequence[int], tops: Sequence[set[int]]) -> dict:
    return {"prompt": fingerprint(prompt), "tokens": list(tokens), "top": [sorted(t) for t in tops]}


def make(server: dict[str, Any], rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The record of a run: SERVER (what the report says of it) and ROWS (per row that
    passed: its drift summary and its sequences by name)."""
    return {
        "kind": KIND,
        "model": server.get("model"),
        "vllm": server.get("vllm_version"),
        "geometry": {key: server.get(key) for key in GEOMETRY},
        "kv_tokens": server.get("kv_tokens"),
        "corpus": server.get("corpus"),
        "drift_nats": server.get("drift_nats"),
        "rows": rows,
    }


def write(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record) + "\n")


def load(path: str) -> dict[str, Any]:
    """The record at PATH; a UsageError in one line when it is none."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"--against {path}: not a verify record ({exc})") from exc
    if not isinstance(record, dict) or record.get("kind") != KIND:
        raise UsageError(f"--against {path}: not a verify record (no kind {KIND!r})")
    return record


def refuse_other(record: dict[str, Any], server: dict[str, Any], path: str) -> None:
    """A UsageError when RECORD was made on another model, geometry or corpus than the run
    of SERVER: its prompts would not be this run's."""
    if record.get("model") != server.get("model"):
        raise UsageError(
            f"--against {path}: recorded on model {record.get('model')}, this server serves "
            f"{server.get('model')}"
        )
    now = {key: server.get(key) for key in GEOMETRY}
    if record.get("geometry") != now:
        was = ", ".join(f"{k} {record.get('geometry', {}).get(k)}" for k in GEOMETRY)
        raise UsageError(
            f"--against {path}: recorded on another geometry ({was}; this server: "
            f"{', '.join(f'{k} {v}' for k, v in now.items())})"
        )
    if record.get("corpus") != server.get("corpus"):
        raise UsageError(f"--against {path}: recorded with another prompt corpus: record again")


def compare(
    was: dict[str, Any], now: dict[str, Any], margin: float = MARGIN
) -> tuple[bool | None, str]:
    """A row of this run (NOW) against the record's (WAS): whether it holds (None: no
    sequence of the record's was sent again, and the drift holds), and what was seen."""
    compared, parted, wrong, other = 0, 0, [], []
    for name, rec in was.get("sequences", {}).items():
        cur = now.get("sequences", {}).get(name)
        if cur is None or cur["prompt"] != rec["prompt"]:
            other.append(name)
            continue
        for i, (a, b) in enumerate(zip(rec["tokens"], cur["tokens"], strict=False)):
            if a == b:
                compared += 1
                continue
            if a in cur["top"][i] and b in rec["top"][i]:
                parted += 1  # a near tie flipped: the sequences part here
            else:
                wrong.append(f"{name} token {i} is {b}, the record's {a}, not in its top")
            break
        else:
            if len(rec["tokens"]) != len(cur["tokens"]):
                wrong.append(f"{name}: {len(cur['tokens'])} tok, the record's {len(rec['tokens'])}")
    seen = f"{compared} tok as recorded"
    if parted:
        seen += f", {parted} parted at a near tie"
    if other:
        seen += f", {len(other)} not compared (another prompt)"
    if wrong:
        seen += f"; {len(wrong)} differ, first: {wrong[0]}"
    d_was, d_now = was.get("drift", {}).get("p99"), now.get("drift", {}).get("p99")
    over = 0.0
    if d_was is not None and d_now is not None:
        over = d_now - (d_was + margin)
        seen += f"; drift p99 {d_now:.3f} nats, the record's {d_was:.3f}"
        if over > 0:
            seen += f" + {margin:g}: {over:.3f} over"
    if wrong or over > 0:
        return False, seen
    return (True if compared + parted else None), seen
