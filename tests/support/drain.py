"""A stream in flight across a stop: what a draining server must deliver, measured by the
server's own log, not by this client's clock."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

DRAIN_SECONDS = 10  # of decode after the stop: a third of the CPU preset's 30 s drain


def drain_tokens(url: str, model: str, key: str, verify) -> int:
    """Tokens this server decodes in DRAIN_SECONDS now, under whatever else the machine
    runs: the faster of two 64-token requests through the same URL (the first may pay a
    warm-up; each one's prefill counts against the rate, so the stream errs short). At least
    200, so the stop still lands mid-stream; at most 2000, inside the tiny presets' 2048."""
    body = {"model": model, "prompt": "rate", "max_tokens": 64, "ignore_eos": True}
    rates = []
    for _ in range(2):
        started = time.monotonic()
        response = httpx.post(
            f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"},
            verify=verify, timeout=120,
        )  # fmt: skip
        assert response.status_code == 200, response.text[:500]
        rates.append(response.json()["usage"]["completion_tokens"] / (time.monotonic() - started))
    return min(2000, max(200, int(max(rates) * DRAIN_SECONDS)))


def drain_stream(url: str, model: str, key: str, verify, stop: Callable[[], None]) -> dict:
    """Stream DRAIN_SECONDS of tokens (ignore_eos) from URL; once its first token has
    arrived (the request is in the engine), STOP runs in a thread (a stop of the server).
    Returns what the stream got, when each chunk arrived, when things happened and, if the
    stream was cut, how."""
    tokens = drain_tokens(url, model, key, verify)
    body = {
        "model": model, "prompt": "drain", "max_tokens": tokens, "temperature": 0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    seen: dict[str, Any] = {"tokens": tokens, "chunks": 0, "usage": None, "finish": None}
    arrivals: list[float] = []

    def stopping() -> None:
        seen["stop_asked"] = time.monotonic()
        try:
            stop()
        except Exception as exc:  # the assertion fails the test in assert_drained
            seen["stop_error"] = repr(exc)
        seen["stop_done"] = time.monotonic()

    stopper = threading.Thread(target=stopping)
    headers = {"Authorization": f"Bearer {key}"}
    seen["stream_start"] = time.monotonic()
    with httpx.stream(
        "POST", f"{url}/v1/completions", json=body, headers=headers, verify=verify, timeout=120
    ) as response:
        assert response.status_code == 200, response.read()[:500]
        try:
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                arrivals.append(time.monotonic() - seen["stream_start"])
                doc = json.loads(line.removeprefix("data: "))
                seen["usage"] = doc.get("usage") or seen["usage"]
                for choice in doc.get("choices", []):
                    seen["finish"] = choice.get("finish_reason") or seen["finish"]
                seen["chunks"] += 1
                if seen["chunks"] == 1:
                    stopper.start()
        except httpx.TransportError as exc:  # assert_drained says so, with the timings
            seen["stream_cut"] = repr(exc)
    seen["stream_end"] = time.monotonic()
    seen["arrivals"] = arrivals
    if stopper.ident is not None:
        stopper.join(timeout=300)
    return seen


# What vLLM's engine logs when a stop (SIGTERM) finds requests still being generated and
# its shutdown_timeout lets them finish (vllm/v1/engine/core.py, _handle_shutdown).
DRAINING = "[shutdown] EngineCore: draining in-flight requests count="


# What it logs when the stop finds nothing in flight (the same function): on a machine
# whose API process got no CPU while the engine decoded, the SIGTERM reached the engine only
# after the last token. The drain was not exercised, not broken.
DRAIN_START = "[shutdown] EngineCore: start mode=drain"


def nothing_in_flight(seen: dict, server_log: str) -> bool:
    """Whether the server says its stop came after the stream was generated (it started a
    drain with nothing to drain) while the client got every token: a run to repeat."""
    lines = server_log.splitlines()
    whole = bool(seen.get("usage")) and seen["usage"]["completion_tokens"] == seen["tokens"]
    return (
        whole
        and "stream_cut" not in seen
        and any(DRAIN_START in line for line in lines)
        and not any(DRAINING in line for line in lines)
    )


def assert_drained(seen: dict, server_log: str | None = None) -> None:
    """All the tokens asked for came, the stop returned only after the stream had ended (the
    server waited for it) and, by the server's own log (SERVER_LOG, where the caller has
    it), the stop found the request still being generated: no clock of this client, whose
    view of the stream may lag the server's (a loaded machine reads chunks late)."""
    assert "stream_cut" not in seen, ("the stream was cut", timings(seen))
    assert "stop_error" not in seen and "stop_asked" in seen, timings(seen)
    assert seen["usage"] and seen["usage"]["completion_tokens"] == seen["tokens"], timings(seen)
    assert seen["finish"] == "length", timings(seen)
    assert seen["stop_done"] >= seen["stream_end"], timings(seen)
    if server_log is not None:
        said = [line for line in server_log.splitlines() if DRAINING in line]
        assert said, ("the stop found nothing being generated", timings(seen))


def delivery(seen: dict) -> str:
    """How the stream's chunks arrived here: first, last, and the share that came less than
    1 ms after the chunk before (bench's measure of a stream delivered in bulk)."""
    from arcvllm.bench.measurements import bulk_share
    from arcvllm.client.api import Chunk, Stream

    at = seen.get("arrivals") or []
    if not at:
        return "no chunk arrived"
    share = bulk_share(Stream(0, [Chunk(1, t) for t in at]))
    return f"{len(at)} chunks from {at[0]:.2f} s to {at[-1]:.2f} s, {share:.0%} < 1 ms apart"


def timings(seen: dict) -> dict:
    """SEEN with its clock readings as seconds after the stream started, and its chunks'
    arrival summed up."""
    start = seen["stream_start"]
    clocks = ("stream_start", "stop_asked", "stop_done", "stream_end")
    out = {k: round(v - start, 1) if k in clocks else v for k, v in seen.items()}
    out["arrivals"] = delivery(seen)
    return out
