"""`arcvllm smoke`: prove a running vLLM server decodes a hybrid model across mamba blocks.

The checks target the path of the original XPU crash: with prefix caching in align mode,
vLLM copies each request's mamba state when its length crosses a block boundary. The smoke
test reads the block size from the server (never assumes it), decodes across two
boundaries, checks the server survives, that a long prompt sent twice hits the prefix
cache and gives the same greedy text, and that 8 concurrent streams crossing boundaries
all complete. It works against any OpenAI-compatible vLLM server; optionally it starts
and stops the server itself (`--start-cmd` / `--stop-cmd`), e.g. a container.

Planning and judging are pure functions; HTTP, subprocesses and files stay at the edges.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from arcvllm import metrics as m
from arcvllm.errors import ArcvllmError

LOG_TAIL_LINES = 50
CONCURRENT_STREAMS = 8
PREFIX_HIT_FRACTION = 0.9
# Text the prompts are made of; its token ids are tiled to exact lengths.
PROMPT_TEXT = (
    "The mamba state of each request is copied when its length crosses a block boundary. "
    "A block holds the attention keys and values of a fixed number of tokens, and the "
    "recurrent state of the linear attention layers at the end of that block. "
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 alpha beta gamma delta epsilon. "
)
_SETTING_BLOCK = re.compile(r"Setting attention block size to (\d+) tokens")
_GROUP_SIZES = re.compile(r"kv cache group sizes \(([\d, ]+)\)")
# An exception line, possibly behind vLLM's "(EngineCore pid=N) ERROR date time [file:line]".
_EXCEPTION = re.compile(
    r"^(?:\(\S+ pid=\d+\)\s+)?(?:[A-Z]+ \S+ \S+ \[\S+\]\s+)?"
    r"([A-Za-z_][\w.]*(?:Error|Exception|Exit)): (.+)$"
)


# ---------------------------------------------------------------- pure parts


@dataclass(frozen=True)
class Plan:
    """Request shapes derived from the server's block size and context length."""

    block_size: int
    max_model_len: int
    decode_prompt: int  # tokens: ends just before the first boundary
    decode_tokens: int  # crosses two boundaries
    prefix_blocks: int  # full blocks in the long prompt
    prefix_prompt: int  # prefix_blocks * block_size + 1
    prefix_tokens: int
    streams: int = CONCURRENT_STREAMS

    @property
    def prefix_expected_hits(self) -> int:
        return int(PREFIX_HIT_FRACTION * self.prefix_blocks * self.block_size)


def plan(block_size: int, max_model_len: int, max_prefix_tokens: int = 16384) -> Plan:
    """Shapes that cross boundaries in decode and fill the prompt with full blocks.

    Decode starts 8 tokens before the first boundary and stops 16 after the second, so
    the decode crosses exactly two boundaries at minimal cost (on XPU a block is ~2k
    tokens). The long prompt has up to 12 full blocks (capped by MAX_PREFIX_TOKENS and the
    context) plus one token, which is where align mode keeps its checkpoints.
    """
    if block_size <= 16:
        raise ArcvllmError(f"block size {block_size} is too small for a hybrid model")
    decode_prompt = block_size - 8
    decode_tokens = block_size + 24
    if decode_prompt + decode_tokens > max_model_len:
        raise ArcvllmError(
            f"max_model_len {max_model_len} is too short to cross two blocks of "
            f"{block_size} tokens (needs {decode_prompt + decode_tokens})"
        )
    prefix_tokens = 32
    room = (max_model_len - prefix_tokens - 1) // block_size
    blocks = min(12, max_prefix_tokens // block_size, room)
    if blocks < 2:
        raise ArcvllmError(
            f"max_model_len {max_model_len} is too short for a prompt of 2 blocks of {block_size}"
        )
    return Plan(
        block_size=block_size,
        max_model_len=max_model_len,
        decode_prompt=decode_prompt,
        decode_tokens=decode_tokens,
        prefix_blocks=blocks,
        prefix_prompt=blocks * block_size + 1,
        prefix_tokens=prefix_tokens,
    )


def boundary_steps(prompt_len: int, completion_tokens: int, block_size: int) -> list[int]:
    """Indices of the output tokens whose decode step copies the mamba state.

    Output token i (i >= 1) is computed in the step that schedules position
    prompt_len + i - 1; align mode moves the running state to a new block when that
    position is the first one of a block.
    """
    return [i for i in range(1, completion_tokens) if (prompt_len + i - 1) % block_size == 0]


def decode_checkpoint_tokens(cache_config: dict[str, str], block_size: int) -> int:
    """Tokens a re-send of the boundary decode's sequence (2 blocks + 16) must hit.

    vLLM emits no counter or log line for the mamba state copy at a block boundary (0.32:
    none in its metrics or worker code). What shows the copy from the server's side is
    the prefix cache: in align mode a block is a hit only if the recurrent state at its
    end was kept, and the state at a boundary reached in decode is the one copied there.
    The server keeps such decode checkpoints only if `prefix_cache_retention_interval`
    asks for them (its label on vllm:cache_config_info): "None" keeps every boundary, N
    every N tokens; 0 (vLLM's default) keeps none, and then there is no evidence to read.
    """
    interval = cache_config.get("prefix_cache_retention_interval", "0")
    if interval == "None":
        return 2 * block_size
    if not interval.isdigit() or int(interval) == 0:
        return 0
    return 2 * block_size // int(interval) * int(interval)


def tokens_of(base: list[int], length: int, shift: int = 0) -> list[int]:
    """LENGTH token ids: BASE tiled, rotated by SHIFT (distinct prompts, same vocabulary)."""
    if not base:
        raise ArcvllmError("the server's tokenizer returned no tokens for the prompt text")
    n = len(base)
    return [base[(i + shift) % n] for i in range(length)]


def block_size_from_log(lines: list[str]) -> int | None:
    """The block size vLLM reports in its log (last start-up wins)."""
    found = None
    for line in lines:
        if match := _SETTING_BLOCK.search(line):
            found = int(match.group(1))
        elif match := _GROUP_SIZES.search(line):
            sizes = {int(s) for s in match.group(1).replace(" ", "").split(",") if s}
            if len(sizes) == 1:
                found = sizes.pop()
    return found


# Exceptions that only echo a crash reported earlier in the log: the engine re-raises a
# worker's error as "RuntimeError: Worker failed with error '...', please check the stack
# trace above for the root cause", the API server as EngineDeadError.
_ECHOES = ("EngineDeadError", "EngineGenerateError", "CancelledError")
_ECHO_WORDS = ("root cause", "stack trace above", "see stack trace")


def find_crash(lines: list[str]) -> str | None:
    """The exception a server process died with, e.g. `OverflowError: Python int ...`.

    The last exception line that ends a traceback, skipping the echoes of a crash that
    was already reported (they would hide the root cause).
    """
    found: list[str] = []
    in_traceback = False
    for line in lines:
        if "Traceback (most recent call last)" in line:
            in_traceback = True
            continue
        if in_traceback and (match := _EXCEPTION.match(line.strip())):
            found.append(f"{match.group(1)}: {match.group(2).strip()}")
            in_traceback = False
    roots = [
        f
        for f in found
        if not any(echo in f.split(":")[0] for echo in _ECHOES)
        and not any(word in f.lower() for word in _ECHO_WORDS)
    ]
    return (roots or found or [None])[-1]


@dataclass
class Check:
    name: str
    expected: str
    seen: str
    ok: bool | None  # None: information (e.g. the block size read), neither PASS nor FAIL

    @property
    def result(self) -> str:
        return "INFO" if self.ok is None else "PASS" if self.ok else "FAIL"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def render_table(checks: list[Check], width: int | None = None) -> str:
    """One screen: check, expected, seen, PASS/FAIL/INFO."""
    if width is None:
        import shutil

        width = max(100, shutil.get_terminal_size((120, 24)).columns)
    rows = [("check", "expected", "seen", "result")] + [
        (c.name, c.expected, c.seen, c.result) for c in checks
    ]
    name_w = max(len(r[0]) for r in rows)
    rest = max(20, width - name_w - 12)
    exp_w = min(max(len(r[1]) for r in rows), rest // 2)
    seen_w = rest - exp_w

    def cut(text: str, n: int) -> str:
        return text if len(text) <= n else text[: n - 1] + "…"

    lines = [
        f"{cut(a, name_w):<{name_w}}  {cut(b, exp_w):<{exp_w}}  {cut(c, seen_w):<{seen_w}}  {d}"
        for a, b, c, d in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


# ---------------------------------------------------------------- the edges


@dataclass
class LogSource:
    """Where the server's log comes from: a file, a command (e.g. `docker logs`), or none."""

    file: str | None = None
    cmd: str | None = None

    def lines(self) -> list[str]:
        try:
            if self.file:
                return Path(self.file).read_text(errors="replace").splitlines()
            if self.cmd:
                out = subprocess.run(
                    self.cmd, shell=True, capture_output=True, text=True, timeout=60
                )
                return (out.stdout + out.stderr).splitlines()
        except (OSError, subprocess.TimeoutExpired) as exc:
            return [f"(could not read the server log: {exc})"]
        return []


@dataclass
class Server:
    """The HTTP side of one vLLM server."""

    base_url: str
    api_key: str | None
    timeout: float
    # Behind a router, /metrics is one replica's: the replicas' own URLs, summed, say what
    # the whole deployment did (counters add up; info gauges are read from the first).
    metrics_urls: tuple[str, ...] = ()

    @property
    def root(self) -> str:
        url = self.base_url.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def healthy(self, timeout: float = 5.0) -> bool:
        import httpx

        try:
            return httpx.get(f"{self.root}/health", timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def get_json(self, path: str) -> Any:
        import httpx

        response = httpx.get(f"{self.root}{path}", headers=self._headers(), timeout=self.timeout)
        response.raise_for_status()
        return response.json()

    def tokenize(self, model: str, text: str) -> list[int]:
        import httpx

        response = httpx.post(
            f"{self.root}/tokenize",
            json={"model": model, "prompt": text, "add_special_tokens": False},
            headers=self._headers(),
            timeout=self.timeout,
        )
        response.raise_for_status()
        return list(response.json()["tokens"])

    def metrics(self) -> m.Metrics:
        urls = self.metrics_urls or (self.root,)
        scrapes = [m.fetch(url, timeout=self.timeout, api_key=self.api_key) for url in urls]
        return m.Metrics(tuple(sample for one in scrapes for sample in one.samples))

    def client(self):
        from openai import OpenAI

        return OpenAI(
            base_url=f"{self.root}/v1",
            api_key=self.api_key or "EMPTY",
            timeout=self.timeout,
            max_retries=0,
        )


@dataclass
class Stream:
    """One greedy streamed completion: text, token ids, usage and token arrival times."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    completion_tokens: int = 0
    prompt_tokens: int = 0
    ttft: float = 0.0
    gaps: list[float] = field(default_factory=list)

    def output(self) -> dict[str, Any]:
        """What two runs must agree on: the greedy token ids (if served) and the text."""
        return {"text": self.text, "token_ids": self.token_ids}


def complete(client, model: str, prompt: list[int], max_tokens: int, salt: str) -> Stream:
    """Greedy, ignore_eos, streamed, with usage in the last chunk."""
    start = time.perf_counter()
    last = None
    out = Stream()
    parts = []
    stream = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, "cache_salt": salt, "return_token_ids": True},
    )
    for chunk in stream:
        now = time.perf_counter()
        if chunk.choices:
            choice = chunk.choices[0]
            parts.append(choice.text or "")
            ids = list(getattr(choice, "token_ids", None) or [])
            out.token_ids.extend(ids)
            if last is None:
                out.ttft = now - start
            else:
                # Tokens that arrive together share the gap of their chunk.
                out.gaps.extend([now - last] + [0.0] * (max(len(ids), 1) - 1))
            last = now
        if chunk.usage is not None:
            out.completion_tokens = chunk.usage.completion_tokens
            out.prompt_tokens = chunk.usage.prompt_tokens
    out.text = "".join(parts)
    return out


def _err(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300]


@dataclass
class Options:
    base_url: str
    model: str | None = None
    preset: str | None = None
    api_key: str | None = None
    report: str | None = None
    log: LogSource = field(default_factory=LogSource)
    start_cmd: str | None = None
    stop_cmd: str | None = None
    health_timeout: float = 300.0
    request_timeout: float = 300.0
    metrics_urls: tuple[str, ...] = ()


@dataclass
class Report:
    verdict: str = "fail"
    failed: list[str] = field(default_factory=list)
    server: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    measurements: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    crash: str | None = None
    log_tail: list[str] = field(default_factory=list)


def model_name(model: str | None, preset: str | None) -> str | None:
    """The served model name: given, or the preset's (None: the server's only one)."""
    if preset is None:
        return model
    from arcvllm.presets import get_preset

    served = get_preset(preset).served_model_name
    if model is not None and model != served:
        raise ArcvllmError(f"--model {model!r} is not the model of preset {preset!r} ({served!r})")
    return served


def wait_healthy(server: Server, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.healthy():
            return True
        time.sleep(1.0)
    return False


def discover(server: Server, model: str | None, log: LogSource) -> tuple[str, int, str, int]:
    """Model name, block size, where the block size came from, max_model_len.

    Operator mistakes (wrong URL, wrong model, a server that does not tell its block
    size) become one-line errors here, before any check runs.
    """
    import httpx

    try:
        models = server.get_json("/v1/models")["data"]
    except httpx.HTTPStatusError as exc:
        raise ArcvllmError(
            f"{server.root}/v1/models answered {exc.response.status_code} (wrong --api-key?)"
        ) from exc
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        raise ArcvllmError(f"cannot reach a vLLM server at {server.root}: {_err(exc)}") from exc
    names = [entry["id"] for entry in models]
    if model is None:
        if len(names) != 1:
            raise ArcvllmError(f"the server serves {names}; choose one with --model")
        model = names[0]
    elif model not in names:
        raise ArcvllmError(f"model {model!r} is not served at {server.root}; it serves {names}")
    max_len = next(int(e.get("max_model_len") or 0) for e in models if e["id"] == model)
    if max_len <= 0:
        raise ArcvllmError(f"{server.root}/v1/models does not say max_model_len of {model!r}")
    block, source = None, ""
    try:
        block = m.block_size(server.metrics())
        source = "/metrics"
    except httpx.HTTPError:
        block = None
    if block is None:
        block = block_size_from_log(log.lines())
        source = "server log"
    if block is None:
        raise ArcvllmError(
            "cannot determine the server's block size: /metrics has no "
            "vllm:cache_config_info effective_attention_block_size and no server log "
            "(--log-file/--log-cmd) says 'Setting attention block size to N tokens'"
        )
    return model, block, source, max_len


class Smoke:
    """One run of the checks against one server."""

    def __init__(self, server: Server, model: str, p: Plan, report: Report) -> None:
        self.server = server
        self.model = model
        self.plan = p
        self.report = report
        self.client = server.client()
        self.salt = uuid.uuid4().hex  # a fresh prefix-cache namespace per run
        self.base = server.tokenize(model, PROMPT_TEXT * 4)

    def add(self, name: str, expected: str, seen: str, ok: bool) -> bool:
        self.report.checks.append(Check(name, expected, seen, ok))
        return ok

    def boundary_decode(self) -> None:
        p = self.plan
        prompt = tokens_of(self.base, p.decode_prompt)
        steps = boundary_steps(p.decode_prompt, p.decode_tokens, p.block_size)
        expected = (
            f"{p.decode_prompt} + {p.decode_tokens} tok, crossing "
            f"{p.block_size}, {2 * p.block_size}"
        )
        try:
            out = complete(self.client, self.model, prompt, p.decode_tokens, self.salt)
        except Exception as exc:
            self.add("boundary decode", expected, _err(exc), False)
            return
        total = out.prompt_tokens + out.completion_tokens
        crossed = sum(1 for k in (1, 2) if total > k * p.block_size)
        self.report.outputs["decode"] = out.output()
        kept, must_hit = self._states_kept(prompt, out)
        if out.gaps:
            median = statistics.median(out.gaps)
            at_boundary = [out.gaps[i - 1] for i in steps if i - 1 < len(out.gaps)]
            self.report.measurements.update(
                itl_median_ms=round(median * 1e3, 2),
                itl_p99_ms=round(percentile(out.gaps, 0.99) * 1e3, 2),
                itl_boundary_ms=[round(g * 1e3, 2) for g in at_boundary],
                itl_boundary_max_over_median=(
                    round(max(at_boundary) / median, 2) if at_boundary and median else None
                ),
                decode_tok_per_s=round(len(out.gaps) / max(sum(out.gaps), 1e-9), 1),
            )
        ok = (
            out.completion_tokens == p.decode_tokens
            and out.prompt_tokens == p.decode_prompt
            and crossed == 2
            and (must_hit == 0 or (kept is not None and kept >= must_hit))
        )
        seen = f"{out.prompt_tokens} + {out.completion_tokens} = {total} tok, {crossed} crossed"
        if must_hit:
            expected += f"; re-sent: {must_hit} tok hit"
            seen += f"; re-sent: {kept} tok hit" if kept is not None else "; re-send failed"
        else:
            seen += "; no server evidence (it keeps no decode checkpoints)"
        self.add("boundary decode", expected, seen, ok)

    def _states_kept(self, prompt: list[int], out: Stream) -> tuple[int | None, int]:
        """(hit tokens, tokens that must hit) when the decoded sequence is sent again.

        The server's own evidence that the decode crossed the boundaries, where it keeps
        decode checkpoints (see decode_checkpoint_tokens); (None, 0) where it keeps none.
        """
        try:
            metrics = self.server.metrics()
        except Exception:
            return None, 0
        must_hit = decode_checkpoint_tokens(
            metrics.info(m.CACHE_CONFIG) or {}, self.plan.block_size
        )
        if must_hit == 0:
            return None, 0
        if len(out.token_ids) != out.completion_tokens:
            return None, must_hit  # the server did not return the token ids
        try:
            before = m.prefix_cache(metrics, self.model)
            complete(self.client, self.model, prompt + out.token_ids, 1, self.salt)
            after = self._prefix_counters(before)
        except Exception:
            return None, must_hit
        hits = int((after - before).hits)
        self.report.measurements["boundary_resend_hit_tokens"] = hits
        return hits, must_hit

    def still_healthy(self) -> None:
        expected = "/health 200, +8 tok"
        if not self.server.healthy():
            self.add("healthy after crossing", expected, "/health does not answer 200", False)
            return
        try:
            out = complete(self.client, self.model, tokens_of(self.base, 16, 3), 8, self.salt)
        except Exception as exc:
            self.add("healthy after crossing", expected, _err(exc), False)
            return
        ok = out.completion_tokens == 8
        self.add(
            "healthy after crossing",
            expected,
            f"200, {out.completion_tokens} tokens",
            ok,
        )

    def _prefix_counters(self, before: m.PrefixCache) -> m.PrefixCache:
        """Counters after a request; the engine may publish its stats a moment later."""
        for _ in range(20):
            now = m.prefix_cache(self.server.metrics(), self.model)
            if now.queries > before.queries:
                return now
            time.sleep(0.1)
        return now

    def prefix_cache(self) -> None:
        p = self.plan
        prompt = tokens_of(self.base, p.prefix_prompt, 11)
        exp_hits = f">= {p.prefix_expected_hits} of {p.prefix_blocks * p.block_size} tok hit"
        exp_equal = "cached == uncached"
        try:
            before = m.prefix_cache(self.server.metrics(), self.model)
            cold = complete(self.client, self.model, prompt, p.prefix_tokens, self.salt)
            middle = self._prefix_counters(before)
            warm = complete(self.client, self.model, prompt, p.prefix_tokens, self.salt)
            after = self._prefix_counters(middle)
        except Exception as exc:
            self.add("prefix cache hits", exp_hits, _err(exc), False)
            self.add("prefix cache text", exp_equal, "not reached", False)
            return
        hits = after - middle
        self.report.outputs["prefix_cold"] = cold.output()
        self.report.outputs["prefix_warm"] = warm.output()
        self.report.measurements.update(
            prefix_prompt_tokens=p.prefix_prompt,
            ttft_cold_ms=round(cold.ttft * 1e3, 1),
            ttft_warm_ms=round(warm.ttft * 1e3, 1),
            ttft_warm_over_cold=round(warm.ttft / cold.ttft, 3) if cold.ttft else None,
        )
        self.add(
            "prefix cache hits",
            exp_hits,
            f"{hits.hits:.0f} of {hits.queries:.0f} tok hit (1st send: "
            f"{(after - before).hits - hits.hits:.0f})",
            hits.hits >= p.prefix_expected_hits,
        )
        same = cold.output() == warm.output()
        self.add(
            "prefix cache text",
            exp_equal,
            "equal" if same else f"differ: {cold.text[:30]!r} vs {warm.text[:30]!r}",
            same and cold.completion_tokens == p.prefix_tokens,
        )

    def concurrency(self) -> None:
        p = self.plan
        n = p.streams
        expected = f"{n} streams x {p.decode_tokens} tok, 0 errors"
        errors: list[str] = []
        lock = threading.Lock()

        def one(i: int) -> int:
            prompt = tokens_of(self.base, p.decode_prompt - i, 17 * (i + 1))
            try:
                out = complete(self.client, self.model, prompt, p.decode_tokens, self.salt)
            except Exception as exc:
                with lock:
                    errors.append(f"stream {i}: {_err(exc)}")
                return 0
            if out.completion_tokens != p.decode_tokens:
                with lock:
                    errors.append(f"stream {i}: {out.completion_tokens} tokens")
            return out.completion_tokens

        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=n) as pool:
            done = sum(pool.map(one, range(n)))
        elapsed = time.perf_counter() - start
        self.report.measurements["concurrent_tok_per_s"] = round(done / elapsed, 1)
        seen = f"{len(errors)} errors" + (f"; {errors[0]}" if errors else "")
        self.add("concurrent streams", expected, seen, not errors)

    def run(self) -> None:
        self.boundary_decode()
        self.still_healthy()
        self.prefix_cache()
        self.concurrency()
        # The last word: a dead engine after the concurrency run is a failure too.
        if not self.server.healthy():
            self.add("healthy at the end", "/health 200", "no answer", False)


def run(opts: Options) -> Report:
    """Start the server if asked, run the checks, stop what was started."""
    t0 = time.perf_counter()
    report = Report()
    server = Server(opts.base_url, opts.api_key, opts.request_timeout, opts.metrics_urls)
    model = model_name(opts.model, opts.preset)  # a bad preset stops here, nothing started
    started = False
    try:
        if opts.start_cmd:
            started = True  # a start command that fails half-way still gets its stop command
            subprocess.run(opts.start_cmd, shell=True, check=True)
            ok = wait_healthy(server, opts.health_timeout)
            took = time.perf_counter() - t0
            report.measurements["startup_to_healthy_s"] = round(took, 1) if ok else None
            report.checks.append(
                Check(
                    "server start",
                    f"/health 200 within {opts.health_timeout:.0f} s",
                    f"healthy after {took:.1f} s" if ok else "no /health 200 in time",
                    ok,
                )
            )
            if not ok:
                return _finish(report, opts, t0)
        elif not server.healthy():
            raise ArcvllmError(f"no vLLM server answers {server.root}/health")
        model, block, source, max_len = discover(server, model, opts.log)
        p = plan(block, max_len)
        report.server = {
            "base_url": server.root,
            "model": model,
            "block_size": block,
            "block_size_source": source,
            "max_model_len": max_len,
            "plan": asdict(p),
        }
        # Information the checks are planned from, not a check: it cannot fail.
        report.checks.append(
            Check("block size", "read from the server", f"{block} (from {source})", None)
        )
        Smoke(server, model, p, report).run()
        return _finish(report, opts, t0)
    except subprocess.CalledProcessError as exc:
        raise ArcvllmError(f"--start-cmd failed with exit code {exc.returncode}") from exc
    finally:
        if started and opts.stop_cmd:
            subprocess.run(opts.stop_cmd, shell=True, check=False)


def _finish(report: Report, opts: Options, t0: float) -> Report:
    report.failed = [c.name for c in report.checks if c.ok is False]
    report.verdict = "fail" if report.failed else "pass"
    if report.failed:
        lines = opts.log.lines()
        report.crash = find_crash(lines)
        report.log_tail = lines[-LOG_TAIL_LINES:]
    report.measurements["time_to_verdict_s"] = round(time.perf_counter() - t0, 1)
    return report


def render(report: Report) -> str:
    """The one screen an operator reads."""
    out = [render_table(report.checks), ""]
    meas = ", ".join(f"{k}={v}" for k, v in report.measurements.items())
    out.append(f"measured (not asserted): {meas}")
    if report.verdict == "pass":
        passed = sum(1 for c in report.checks if c.ok)
        out.append(f"smoke: PASS ({passed} checks)")
        return "\n".join(out)
    out.append(f"smoke: FAIL: {', '.join(report.failed)}")
    if report.crash:
        out.append(f"server crashed: {report.crash}")
    if report.log_tail:
        out.append(f"--- last {len(report.log_tail)} lines of the server log ---")
        out.extend(report.log_tail)
    else:
        out.append("(no server log: pass --log-file or --log-cmd to see it here)")
    return "\n".join(out)


def _cmd(args: argparse.Namespace) -> int:
    opts = Options(
        base_url=args.base_url,
        model=args.model,
        preset=args.preset,
        api_key=args.api_key,
        report=args.report,
        log=LogSource(file=args.log_file, cmd=args.log_cmd),
        start_cmd=args.start_cmd,
        stop_cmd=args.stop_cmd,
        health_timeout=args.health_timeout,
        request_timeout=args.request_timeout,
        metrics_urls=tuple(args.metrics_url or ()),
    )
    report = run(opts)
    print(render(report))
    if opts.report:
        path = Path(opts.report)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(report), indent=2) + "\n")
        print(f"report: {path}", file=sys.stderr)
    return 0 if report.verdict == "pass" else 1


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "smoke",
        help="check a vLLM server: decode across mamba blocks, prefix cache, concurrency",
        description=__doc__.split("\n\n")[1],
    )
    parser.add_argument("--base-url", required=True, help="server URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", help="served model name (default: the only one served)")
    parser.add_argument("--preset", help="take the served model name from this preset")
    parser.add_argument("--api-key", help="the server's --api-key, if it has one")
    parser.add_argument("--report", help="write the JSON report here")
    logs = parser.add_mutually_exclusive_group()
    logs.add_argument("--log-file", help="the server's log file (tail shown on failure)")
    logs.add_argument("--log-cmd", help="command printing the server log, e.g. 'docker logs X'")
    parser.add_argument("--start-cmd", help="shell command that starts the server (detached)")
    parser.add_argument("--stop-cmd", help="shell command that stops it again (after --start-cmd)")
    parser.add_argument("--health-timeout", type=float, default=300.0, help="seconds (300)")
    parser.add_argument("--request-timeout", type=float, default=300.0, help="seconds (300)")
    parser.add_argument(
        "--metrics-url",
        action="append",
        metavar="URL",
        help="a replica's root URL whose /metrics to read (repeat for each replica behind a "
        "router; their counters are summed); default: --base-url",
    )
    parser.set_defaults(func=_cmd)
