"""The smoke test's checks, and the plan of token positions they are made of.

Planning and judging are pure functions; the server is reached through arcvllm.client.api,
subprocesses and the log stay at the edges.
"""

from __future__ import annotations

import statistics
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Protocol

from arcvllm.client import metrics as m
from arcvllm.client.api import Client, Stream, WaitTimeout
from arcvllm.client.discovery import discover, requested_model
from arcvllm.client.log import LOG_TAIL_LINES, find_crash
from arcvllm.client.oracle import PROMPT_TEXT, TIE_NATS, check_against_plain, tokens_of
from arcvllm.client.report import Check, Report
from arcvllm.client.server import ServerOptions
from arcvllm.client.stats import percentile
from arcvllm.errors import ArcvllmError, Unavailable
from arcvllm.text import error_line

CONCURRENT_STREAMS = 8
PREFIX_HIT_FRACTION = 0.9


# ---------------------------------------------------------------- pure parts


@dataclass(frozen=True)
class CheckPlan:
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


def plan_checks(block_size: int, max_model_len: int, max_prefix_tokens: int = 16384) -> CheckPlan:
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
    return CheckPlan(
        block_size=block_size,
        max_model_len=max_model_len,
        decode_prompt=decode_prompt,
        decode_tokens=decode_tokens,
        prefix_blocks=blocks,
        prefix_prompt=blocks * block_size + 1,
        prefix_tokens=prefix_tokens,
    )


def boundary_tokens(prompt_len: int, completion_tokens: int, block_size: int) -> list[int]:
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


def expected_prefix_hits(blocks: int, block_size: int, speculative: bool) -> int:
    """Tokens the repeat of a prompt of BLOCKS full blocks + 1 must hit.

    Every full block, or with EAGLE/MTP speculation one block less: vLLM keeps the mamba
    checkpoint of such a prompt only at the block below its last full one (the block the
    drafter's lookahead may have polluted is dropped: `replay_boundaries` in
    vllm/v1/core/kv_cache_coordinator.py).
    """
    full = blocks - 1 if speculative else blocks
    return int(PREFIX_HIT_FRACTION * full * block_size)


# ---------------------------------------------------------------- the edges


class Lifecycle(Protocol):
    """A server the smoke test starts before its checks and stops after them, pass or fail:
    shell commands (ShellLifecycle), or a compose project (arcvllm.operate.deployment)."""

    def start(self) -> None:
        """Start the server detached; Unavailable when it cannot be started."""

    def stop(self) -> None:
        """Stop what start began, also after a start that failed half-way."""


@dataclass(frozen=True)
class ShellLifecycle:
    """`--start-cmd` / `--stop-cmd`: shell commands, e.g. `docker run -d` / `docker rm -f`."""

    start_cmd: str
    stop_cmd: str | None = None

    def start(self) -> None:
        try:
            subprocess.run(self.start_cmd, shell=True, check=True)
        except subprocess.CalledProcessError as exc:
            raise Unavailable(f"--start-cmd failed with exit code {exc.returncode}") from exc

    def stop(self) -> None:
        if self.stop_cmd:
            subprocess.run(self.stop_cmd, shell=True, check=False)


@dataclass(frozen=True)
class SmokeOptions(ServerOptions):
    """What `arcvllm smoke` was asked: the server, the model, the log, the start/stop."""

    lifecycle: Lifecycle | None = None  # None: the server runs already
    health_timeout: float = 300.0
    request_timeout: float = 300.0
    metrics_urls: tuple[str, ...] = ()


def expects_speculation(preset: str | None) -> bool:
    """Whether PRESET serves with a speculative-config: then a server that does not
    speculate is the wrong server (e.g. started with another preset)."""
    if preset is None:
        return False
    from arcvllm.presets import get_preset, speculative_config

    return speculative_config(get_preset(preset)) is not None


class Smoke:
    """One run of the checks against one server."""

    def __init__(
        self,
        client: Client,
        model: str,
        p: CheckPlan,
        report: Report,
        expect_speculation: bool = False,
    ) -> None:
        self.expect_speculation = expect_speculation  # the preset has a speculative-config
        self.client = client
        self.model = model
        self.plan = p
        self.report = report
        self.salt = uuid.uuid4().hex  # a fresh prefix-cache namespace per run
        self.base = client.tokenize(model, PROMPT_TEXT * 4)
        # Speculative decoding: the server's counters before the run (None: it does not
        # speculate), and every decoded sequence, to check against the plain model.
        try:
            self.spec_before = m.spec_decode(client.metrics(), model)
        except Exception:  # no /metrics: the checks that read it say so themselves
            self.spec_before = None
        self.decoded: list[tuple[str, list[int], list[int]]] = []

    def add(self, name: str, expected: str, seen: str, ok: bool | None) -> bool | None:
        self.report.checks.append(Check(name, expected, seen, ok))
        return ok

    def complete(self, prompt: list[int], max_tokens: int) -> Stream:
        return self.client.stream(self.model, prompt, max_tokens, salt=self.salt)

    def boundary_decode(self) -> None:
        p = self.plan
        prompt = tokens_of(self.base, p.decode_prompt)
        at_boundary = boundary_tokens(p.decode_prompt, p.decode_tokens, p.block_size)
        expected = (
            f"{p.decode_prompt} + {p.decode_tokens} tok, crossing "
            f"{p.block_size}, {2 * p.block_size}"
        )
        try:
            out = self.complete(prompt, p.decode_tokens)
        except Exception as exc:
            self.add("boundary decode", expected, error_line(exc), False)
            return
        total = out.prompt_tokens + out.completion_tokens
        crossed = sum(1 for k in (1, 2) if total > k * p.block_size)
        self.report.outputs["decode"] = out.output()
        self.decoded.append(("decode", prompt, out.token_ids))
        # Counting the tokens proves nothing: each must be the plain model's greedy choice
        # (a state spoiled at the crossing decodes fluent, finite, wrong tokens).
        try:
            sequence = [("decode", prompt, out.token_ids)]
            greedy = check_against_plain(self.client, self.model, sequence)
            tokens_seen = greedy.summary() + " = plain greedy"
        except Exception as exc:
            greedy, tokens_seen = None, f"plain greedy not read: {error_line(exc)}"
        kept, must_hit = self._states_kept(prompt, out)
        gaps = out.token_gaps()
        if gaps:
            median = statistics.median(gaps)
            boundary_gaps = [gaps[i - 1] for i in at_boundary if i - 1 < len(gaps)]
            self.report.measurements.update(
                itl_median_ms=round(median * 1e3, 2),
                itl_p99_ms=round(percentile(gaps, 99) * 1e3, 2),  # type: ignore[operator]  # gaps: not empty
                itl_boundary_ms=[round(g * 1e3, 2) for g in boundary_gaps],
                itl_boundary_max_over_median=(
                    round(max(boundary_gaps) / median, 2) if boundary_gaps and median else None
                ),
                decode_tok_per_s=round(len(gaps) / max(sum(gaps), 1e-9), 1),
            )
        ok = (
            out.completion_tokens == p.decode_tokens
            and out.prompt_tokens == p.decode_prompt
            and crossed == 2
            and (must_hit == 0 or (kept is not None and kept >= must_hit))
            and greedy is not None
            and greedy.tokens == p.decode_tokens
            and not greedy.misses
        )
        expected += "; each = plain greedy"
        seen = f"{out.prompt_tokens} + {out.completion_tokens} = {total} tok, {crossed} crossed"
        seen += f"; {tokens_seen}"
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
            metrics = self.client.metrics()
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
            self.complete(prompt + out.token_ids, 1)
            after = self.client.prefix_cache_after(before, self.model)
        except Exception:
            return None, must_hit
        hits = int((after - before).hits)
        self.report.measurements["boundary_resend_hit_tokens"] = hits
        return hits, must_hit

    def still_healthy(self) -> None:
        expected = "/health 200, +8 tok"
        if not self.client.healthy():
            self.add("healthy after crossing", expected, "/health does not answer 200", False)
            return
        try:
            out = self.complete(tokens_of(self.base, 16, 3), 8)
        except Exception as exc:
            self.add("healthy after crossing", expected, error_line(exc), False)
            return
        ok = out.completion_tokens == 8
        self.add("healthy after crossing", expected, f"200, {out.completion_tokens} tokens", ok)

    def prefix_cache(self) -> None:
        p = self.plan
        speculative = self.spec_before is not None
        prompt = tokens_of(self.base, p.prefix_prompt, 11)
        must_hit = expected_prefix_hits(p.prefix_blocks, p.block_size, speculative)
        exp_hits = f">= {must_hit} of {p.prefix_blocks * p.block_size} tok hit"
        if speculative:
            exp_hits += " by send 3"
        exp_equal = "cached == uncached"
        try:
            before = m.prefix_cache(self.client.metrics(), self.model)
            cold = self.complete(prompt, p.prefix_tokens)
            middle = self.client.prefix_cache_after(before, self.model)
            warm = self.complete(prompt, p.prefix_tokens)
            after = self.client.prefix_cache_after(middle, self.model)
            if speculative and (after - middle).hits < must_hit:
                # With EAGLE/MTP vLLM stores the replay checkpoint when a prompt is
                # seen again: the third send is the first that can hit it.
                middle = after
                warm = self.complete(prompt, p.prefix_tokens)
                after = self.client.prefix_cache_after(middle, self.model)
        except Exception as exc:
            self.add("prefix cache hits", exp_hits, error_line(exc), False)
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
            f"{hits.hits:.0f} of {hits.queries:.0f} tok hit (before: "
            f"{(after - before).hits - hits.hits:.0f})",
            hits.hits >= must_hit,
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
                out = self.complete(prompt, p.decode_tokens)
            except Exception as exc:
                with lock:
                    errors.append(f"stream {i}: {error_line(exc)}")
                return 0
            if out.completion_tokens != p.decode_tokens:
                with lock:
                    errors.append(f"stream {i}: {out.completion_tokens} tokens")
            with lock:
                self.decoded.append((f"stream {i}", prompt, out.token_ids))
            return out.completion_tokens

        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=n) as pool:
            done = sum(pool.map(one, range(n)))
        elapsed = time.perf_counter() - start
        self.report.measurements["concurrent_tok_per_s"] = round(done / elapsed, 1)
        seen = f"{len(errors)} errors" + (f"; {errors[0]}" if errors else "")
        self.add("concurrent streams", expected, seen, not errors)

    def speculation(self) -> None:
        """With speculative decoding: every decoded token is the plain model's greedy
        choice, and how many drafts the server accepted (its own counters)."""
        if self.spec_before is None:
            if self.expect_speculation:
                self.add(
                    "speculation",
                    "the preset's speculative-config served",
                    "the server does not speculate (no vllm:spec_decode_* in /metrics)",
                    False,
                )
            return
        n = len(self.decoded)
        expected = f"{n} seq: each token = plain greedy (ties <= {TIE_NATS:g} nats)"
        try:
            after = m.spec_decode(self.client.metrics(), self.model)
            decoded = sorted(self.decoded, key=lambda d: d[0])
            result = check_against_plain(self.client, self.model, decoded)
        except Exception as exc:
            self.add("speculative == plain", expected, error_line(exc), False)
            return
        if not n or not result.tokens:
            self.add("speculative == plain", expected, "no decoded tokens to check", False)
            return
        self.add("speculative == plain", expected, result.summary(), not result.misses)
        self.report.outputs["greedy_check"] = result.to_dict()
        run = (after or self.spec_before) - self.spec_before
        rate, length = run.acceptance_rate, run.mean_accepted_length
        self.report.measurements.update(
            spec_draft_tokens=int(run.draft_tokens),
            spec_accepted_tokens=int(run.accepted),
            spec_acceptance_rate=None if rate is None else round(rate, 4),
            spec_mean_accepted_length=None if length is None else round(length, 3),
        )
        self.report.server["speculative"] = True
        self.add(
            "speculation",
            "read from the server",
            f"{run.accepted:.0f} of {run.draft_tokens:.0f} drafted tok accepted"
            + (f" ({rate:.1%}), mean accepted length {length:.2f}" if rate is not None else ""),
            None,
        )

    def run(self) -> None:
        self.boundary_decode()
        self.still_healthy()
        self.prefix_cache()
        self.concurrency()
        self.speculation()
        # The last word: a dead engine after the concurrency run is a failure too.
        if not self.client.healthy():
            self.add("healthy at the end", "/health 200", "no answer", False)


def run(opts: SmokeOptions) -> Report:
    """Start the server if asked, run the checks, stop what was started."""
    t0 = time.perf_counter()
    report = Report()
    client = Client(
        opts.base_url, opts.api_key, opts.request_timeout, opts.metrics_urls, opts.ca_cert
    )
    model = requested_model(opts.model, opts.preset)  # a bad preset stops here, nothing started
    started = False
    try:
        if opts.lifecycle is not None:
            started = True  # a start that fails half-way still gets its stop
            if not _start(opts, opts.lifecycle, client, report, t0):
                return _finish(report, opts, t0)
        elif not client.healthy():
            raise Unavailable(f"no vLLM server answers {client.root}/health")
        served = discover(client, model, log=opts.log)
        p = plan_checks(served.block_size, served.max_model_len)
        report.server = {
            "base_url": client.root,
            "model": served.model,
            "block_size": served.block_size,
            "block_size_source": served.block_size_source,
            "max_model_len": served.max_model_len,
            "plan": asdict(p),
        }
        # Information the checks are planned from, not a check: it cannot fail.
        seen = f"{served.block_size} (from {served.block_size_source})"
        report.checks.append(Check("block size", "read from the server", seen, None))
        Smoke(client, served.model, p, report, expects_speculation(opts.preset)).run()
        return _finish(report, opts, t0)
    finally:
        if started and opts.lifecycle is not None:
            opts.lifecycle.stop()


def _start(
    opts: SmokeOptions, server: Lifecycle, client: Client, report: Report, t0: float
) -> bool:
    """Start the server and wait for /health: the "server start" check."""
    server.start()
    try:
        client.wait_healthy(opts.health_timeout)
        ok = True
    except WaitTimeout:
        ok = False
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
    return ok


def _finish(report: Report, opts: SmokeOptions, t0: float) -> Report:
    report.failed = [c.name for c in report.checks if c.ok is False]
    report.verdict = "fail" if report.failed else "pass"
    if report.failed:
        lines = opts.log.lines()
        report.crash = find_crash(lines)
        report.log_tail = lines[-LOG_TAIL_LINES:]
    report.measurements["time_to_verdict_s"] = round(time.perf_counter() - t0, 1)
    return report
