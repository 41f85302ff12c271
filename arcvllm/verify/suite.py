"""The rows of `arcvllm verify` against one server, each a path that touches mamba state,
each judged by the model itself.

The oracle is the plain model: one cold prefill (prompt_logprobs, a fresh cache_salt) of
what a path produced, whose top token at every position must be the token the path chose
(arcvllm.client.oracle). A path that spoils the recurrent state (a lost copy at a block
boundary, a corrupted resume, NaN) produces tokens the plain model would not choose, with
HTTP 200 and finite logprobs: only this comparison shows it. Where no plain prefill can
stand as the reference (a prompt longer than the prefill chunk), a row is judged against
another path (the decode path for the chunked prefill) and says so (plan.NEEDS).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from arcvllm.client import metrics as m
from arcvllm.client.api import Client, Stream, WaitTimeout, token_id, wait_until
from arcvllm.client.discovery import chunk_tokens, discover, requested_model
from arcvllm.client.log import LOG_TAIL_LINES, find_crash
from arcvllm.client.oracle import (
    DRIFT_NATS,
    TOP_K,
    GreedyCheck,
    check_against_plain,
    greedy_check,
    plain_logprobs,
    top_k,
)
from arcvllm.client.report import Check, Report
from arcvllm.client.server import ServerOptions
from arcvllm.errors import ArcvllmError, Unavailable
from arcvllm.text import error_line
from arcvllm.verify import plan as P
from arcvllm.verify import record as R
from arcvllm.verify.prompts import Prompts, corpus_digest, corpus_text, fresh

PREEMPTIONS = "vllm:num_preemptions"
OPEN_TEMPERATURE = 0.8


@dataclass
class Request:
    """One prompt of a batched row: the prompt, then its output or the request's error."""

    name: str
    prompt: list[int]
    stream: Stream | None = None
    error: str | None = None


@dataclass
class Suite:
    """One run of the rows against one server."""

    client: Client
    model: str
    plan: P.Plan
    report: Report
    speculative: bool = False
    rows: tuple[str, ...] = P.ROWS
    broken: set[str] = field(default_factory=set)  # failed, or not judged for a failure
    decoding_prompts: list[int] = field(default_factory=list)
    greedy: dict[str, dict] = field(default_factory=dict)
    drift_nats: float = DRIFT_NATS
    against: dict | None = None  # a record of a healthy run (record.py) to hold rows to
    margin: float = R.MARGIN
    recorded: dict[str, dict] = field(default_factory=dict)  # per row: what a record keeps
    _expected: str = ""

    def __post_init__(self) -> None:
        # Natural text, cut from the corpus in the server's own tokenizer; refused in one
        # line before anything runs when a row's prompt would repeat an 8-gram of it.
        self.prompts = Prompts(self.client.tokenize(self.model, corpus_text()))
        self.prompts.refuse_beyond(self.plan.longest_prompt(self.rows))
        self.report.server["corpus_tokens"] = len(self.prompts.tokens)
        self.report.server["corpus_reach"] = self.prompts.reach

    # ---- helpers

    @property
    def block(self) -> int:
        return self.plan.geometry.block_size

    def tokens(self, length: int) -> list[int]:
        """A prompt of LENGTH tokens of natural text, unlike every other prompt of the run."""
        return self.prompts.take(length)

    def stream(self, prompt: list[int], n: int, salt: str | None = None) -> Stream:
        """A greedy completion of N tokens (a fresh cache namespace unless SALT is given),
        with the path's own top-K logprobs of each token."""
        if n > 1:
            self.decoding_prompts.append(len(prompt))
        return self.client.stream(
            self.model, prompt, n, salt=salt or uuid.uuid4().hex, logprobs=TOP_K
        )

    def judge(self, row: str, outs: list[tuple[str, list[int], Stream]]) -> GreedyCheck:
        """What each path produced (name, prompt, output) against the plain model, its
        tokens and its drift; kept for the report (and a record) under ROW."""
        sequences = [(name, prompt, out.token_ids) for name, prompt, out in outs]
        result = check_against_plain(
            self.client,
            self.model,
            sequences,
            self.plan.geometry.max_model_len,
            paths=[out.top for _, _, out in outs],
            drift_nats=self.drift_nats,
        )
        self.keep(row, result, outs)
        return result

    def keep(self, row: str, result: GreedyCheck, outs: list[tuple[str, list[int], Stream]]):
        """RESULT for the report, and what a record of ROW holds."""
        self.greedy[row] = result.to_dict()
        self.recorded[row] = {
            "drift": result.drift_summary(),
            "sequences": {
                name: R.sequence(prompt, out.token_ids, [top_k(t) for t in out.top])
                for name, prompt, out in outs
            },
        }

    def summary(self, greedy: GreedyCheck) -> str:
        return greedy.summary(self.drift_nats)

    def expect(self, text: str) -> None:
        self._expected = text

    def preemptions(self) -> float:
        return self.client.metrics().total(PREEMPTIONS)

    def preemptions_after(self, before: float, timeout: float = 5.0) -> float:
        """Preemptions since BEFORE, once the counter moved (the engine publishes its
        stats a moment after the responses); 0 if it never moves."""
        last = before

        def moved() -> bool:
            nonlocal last
            last = self.preemptions()
            return last > before

        with contextlib.suppress(WaitTimeout):
            wait_until(moved, timeout, 0.2, "the preemption counter")
        return last - before

    # ---- the rows

    def decode(self) -> Check:
        p = self.plan
        kind = "speculative decode" if self.speculative else "decode"
        self.expect(
            f"{p.decode_prompt} + {p.decode_tokens} tok ({kind}) across {self.block}, "
            f"{2 * self.block}; each = plain greedy"
        )
        prompt = self.tokens(p.decode_prompt)
        out = self.stream(prompt, p.decode_tokens)
        crossed = P.boundaries_crossed(len(prompt), len(prompt) + out.completion_tokens, self.block)
        # Then DECODE_STREAMS decodes in one batch, each prompt a token shorter than the
        # last: each crosses the boundaries at its own step while the others decode.
        batched = self._batch(
            [
                Request(f"batched {i}", self.tokens(p.decode_prompt - i))
                for i in range(P.DECODE_STREAMS)
            ],
            p.decode_tokens,
        )
        errors = [f"{t.name}: {t.error}" for t in batched if t.error]
        outs = [("decode", prompt, out)] + [
            (t.name, t.prompt, t.stream) for t in batched if t.stream
        ]
        both = min(
            P.boundaries_crossed(len(q), len(q) + s.completion_tokens, self.block)
            for _, q, s in outs
        )
        greedy = self.judge(P.DECODE, outs)
        seen = f"{crossed} crossed, {P.DECODE_STREAMS} batched >= {both}; {self.summary(greedy)}"
        if errors:
            seen = f"{errors[0]}; {seen}"
        lengths = all(s.completion_tokens == p.decode_tokens for _, _, s in outs)
        ok = not errors and lengths and both >= 2 and _clean(greedy)
        return Check(P.DECODE, self._expected, seen, ok)

    def chunked(self) -> Check:
        p, g = self.plan, self.plan.geometry
        if not p.chunked:
            expected = f"a prompt longer than the prefill chunk ({g.chunk_tokens} tok)"
            how = P.unexercised(P.CHUNKED, p)
            return Check(P.CHUNKED, expected, "not exercised", None, how)
        chunk = g.chunk_tokens or 1
        chunks = -(-p.chunked_total // chunk)
        self.expect(
            f"{p.chunked_total} tok prefilled in {chunks} chunks of <= {g.chunk_tokens}: "
            "each position = the decode path's token"
        )
        # The decode path grows a short prompt past the chunk; a prefill of the whole
        # sequence, in chunks, must predict every token it chose.
        prompt = self.tokens(p.chunked_prompt)
        out = self.stream(prompt, p.chunked_total - len(prompt))
        sequence = prompt + out.token_ids
        salt = uuid.uuid4().hex
        logprobs = plain_logprobs(self.client, self.model, sequence, salt, g.max_model_len, TOP_K)
        greedy = greedy_check(
            "chunked",
            len(prompt),
            out.token_ids,
            logprobs,
            path=out.top,
            drift_nats=self.drift_nats,
        )
        self.keep(P.CHUNKED, greedy, [("chunked", prompt, out)])
        crossed = P.boundaries_crossed(chunk, p.chunked_total, self.block)
        seen = f"{crossed} blocks crossed after the first chunk; {self.summary(greedy)}"
        return Check(P.CHUNKED, self._expected, seen, crossed >= 1 and _clean(greedy))

    def resume(self) -> Check:
        p = self.plan
        self.expect(
            f"{p.resume_prompt} tok cached; its first {p.resume_shared} + {p.resume_extension} "
            f"resumed, + {p.resume_tokens} decoded; each = plain greedy"
        )
        salt = uuid.uuid4().hex
        first = self.tokens(p.resume_prompt)
        # Twice: with EAGLE/MTP speculation vLLM keeps a prompt's checkpoint on its repeat.
        self.stream(first, 1, salt)
        self.stream(first, 1, salt)
        before = m.prefix_cache(self.client.metrics(), self.model)
        second = first[: p.resume_shared] + self.tokens(p.resume_extension)
        fresh(second)
        out = self.stream(second, p.resume_tokens, salt)
        hits = (self.client.prefix_cache_after(before, self.model) - before).hits
        greedy = self.judge(P.RESUME, [("resumed", second, out)])
        seen = f"resumed at {hits:.0f} of {len(second)} tok; {self.summary(greedy)}"
        ok = out.completion_tokens == p.resume_tokens and _clean(greedy)
        return _unless_unexercised(
            Check(P.RESUME, self._expected, seen, ok), P.unexercised(P.RESUME, p, resumed=hits)
        )

    def mixed(self) -> Check:
        p, g = self.plan, self.plan.geometry
        longs = P.STREAMS - 1
        self.expect(
            f"{p.mixed_short} tok, then {longs} x ~{p.mixed_prompt} tok (more than the chunk "
            f"of {g.chunk_tokens}) in one request: the first decodes while the others "
            "prefill; each = plain greedy"
        )
        before = self.preemptions()
        streams = [Request("short prompt", self.tokens(p.mixed_short))] + [
            Request(f"long prompt {i}", self.tokens(p.mixed_prompt - i)) for i in range(longs)
        ]
        # One request: the engine takes its prompts in order, at once. The short one is
        # prefilled in its first step; the long ones need more than one chunk, so some of
        # their prefill runs in a later step, beside its decode, however the steps fall.
        # (Sent as separate requests, a loaded server may take each only once the one
        # before it has finished; prompts of one length may all finish prefill together.)
        check = self._judge_streams(P.MIXED, self._batch(streams, p.mixed_tokens), before)
        return _unless_unexercised(check, P.unexercised(P.MIXED, p))

    def preemption(self) -> Check:
        p, g = self.plan, self.plan.geometry
        if not p.preempt_tokens:
            expected = "requests beyond the KV cache preempted and recomputed"
            how = P.unexercised(P.PREEMPTION, p)
            return Check(P.PREEMPTION, expected, "not exercised", None, how)
        self.expect(
            f"{P.STREAMS} x {p.preempt_prompt + p.preempt_tokens} tok > the KV cache's "
            f"{g.kv_tokens}: preempted, recomputed, each = plain greedy"
        )
        # Whether the scheduler preempts depends on when each request arrives: more rounds
        # (three at most) while one preempted nothing.
        for rounds in range(1, P.PREEMPT_ROUNDS + 1):
            self.report.measurements["preemption_rounds"] = rounds
            before = self.preemptions()
            streams = [
                Request(f"prompt {i}", self.tokens(p.preempt_prompt + i)) for i in range(P.STREAMS)
            ]
            # One request, as in the mixed row: the engine has them all at once.
            done = self._batch(streams, p.preempt_tokens)
            check = self._judge_streams(P.PREEMPTION, done, before, must_preempt=True)
            if check.ok is not None:
                break
        return check

    def max_len(self) -> Check:
        p, g = self.plan, self.plan.geometry
        n = g.max_model_len - p.max_len_prompt
        self.expect(
            f"{p.max_len_prompt} + {n} tok = max-model-len {g.max_model_len}; each = plain greedy"
        )
        prompt = self.tokens(p.max_len_prompt)
        out = self.stream(prompt, n)
        greedy = self.judge(P.MAX_LEN, [("max-len", prompt, out)])
        seen = f"{out.completion_tokens} tok, finish {out.finish_reason}; {self.summary(greedy)}"
        return Check(P.MAX_LEN, self._expected, seen, out.completion_tokens == n and _clean(greedy))

    def residues(self) -> Check:
        p = self.plan
        n, base = p.residue_tokens, p.residue_base
        self.expect(
            f"prompts of {base}..{base + 63} tok, fresh and after a cached {p.residue_prefix} "
            f"tok, + {n} decoded: each = plain greedy"
        )
        # Every length mod 64 (vllm-xpu-kernels#548 broke one), each decoded a few tokens
        # after its prefill, in one batched request: the state a prefill of that length
        # leaves is what the decode reads. Then the same lengths on top of a prefix the
        # cache holds (resumed from its block's state, the rest prefilled on top).
        fresh_prompts = [Request(f"{base + r} tok", self.tokens(base + r)) for r in range(64)]
        salt = uuid.uuid4().hex
        cached = self.tokens(p.residue_prefix + base)
        # Twice, as the resume row: with speculation vLLM keeps a checkpoint on the repeat.
        self.stream(cached, 1, salt)
        self.stream(cached, 1, salt)
        prefix = cached[: p.residue_prefix]
        on_prefix = [
            Request(f"{p.residue_prefix} cached + {base + r} tok", self._after(prefix, base + r))
            for r in range(64)
        ]
        done = self._batch(fresh_prompts, n) + self._batch(on_prefix, n, salt)
        errors = [f"{t.name}: {t.error}" for t in done if t.error]
        outs = [(t.name, t.prompt, t.stream) for t in done if t.stream]
        greedy = self.judge(P.RESIDUES, outs) if outs else GreedyCheck()
        lengths = {len(t.prompt) % 64 for t in done if t.stream}
        seen = f"{len(lengths)} of 64 residues decoded; {self.summary(greedy)}"
        if errors:
            seen = f"{errors[0]}; {len(errors)} errors; {seen}"
        self.report.outputs["residues"] = {"errors": errors}
        ok = not errors and len(lengths) == 64 and _clean(greedy)
        return Check(P.RESIDUES, self._expected, seen, ok)

    def _after(self, prefix: list[int], length: int) -> list[int]:
        """PREFIX, then LENGTH tokens of the corpus that repeat none of its 8-grams (the
        next window that does not, when one overlaps the prefix's place in the corpus)."""
        for _ in range(8):
            prompt = prefix + self.tokens(length)
            with contextlib.suppress(ArcvllmError):
                fresh(prompt)
                return prompt
        fresh(prompt)  # the refusal, in one line
        return prompt

    def degeneration(self) -> Check:
        p = self.plan
        self.expect(
            f"{len(P.OPEN_PROMPTS)} open prompts sampled: no run of {P.MAX_RUN} of one token, "
            f"mean top-{P.TOP_LOGPROBS} entropy >= {P.ENTROPY_FLOOR} nats"
        )
        judged = []
        for i, text in enumerate(P.OPEN_PROMPTS):
            body = {
                "model": self.model,
                "prompt": text,
                "max_tokens": p.open_tokens,
                "temperature": OPEN_TEMPERATURE,
                "seed": 1000 + i,
                "logprobs": P.TOP_LOGPROBS,
                "return_tokens_as_token_ids": True,
                "cache_salt": uuid.uuid4().hex,
            }
            answer = self.client.completion(body)
            self.decoding_prompts.append(answer["usage"]["prompt_tokens"])
            logprobs = answer["choices"][0]["logprobs"]
            ids = [token_id(t) for t in logprobs["tokens"]]
            tops = [
                None if top is None else {k: float(v) for k, v in top.items()}
                for top in logprobs["top_logprobs"]
            ]
            judged.append(P.degeneration(ids, tops))
        self.report.outputs["degeneration"] = {"answers": [asdict(d) for d in judged]}
        run = max(d.longest_run for d in judged)
        entropy = min(d.mean_entropy for d in judged)
        self.report.measurements.update(
            degeneration_longest_run=run, degeneration_min_entropy=round(entropy, 3)
        )
        bad = sum(d.degenerate for d in judged)
        seen = f"longest run {run}, lowest mean entropy {entropy:.3f} nats; {bad} degenerate"
        if not all(d.finite for d in judged):
            seen += "; a logprob is not finite"
        return Check(P.DEGENERATION, self._expected, seen, bad == 0)

    # ---- concurrency

    def _batch(self, requests: list[Request], n: int, salt: str | None = None) -> list[Request]:
        """REQUESTS' prompts in one greedy completion request of N tokens each (a fresh
        cache namespace unless SALT is given): their outputs, or the request's error in
        each."""
        self.decoding_prompts += [len(t.prompt) for t in requests]
        try:
            prompts = [t.prompt for t in requests]
            outs = self.client.batch(self.model, prompts, n, salt or uuid.uuid4().hex, TOP_K)
            for t, out in zip(requests, outs, strict=True):
                t.stream = out
        except Exception as exc:
            for t in requests:
                t.error = error_line(exc)
        return requests

    def _judge_streams(
        self,
        row: str,
        done: list[Request],
        preempted_before: float,
        must_preempt: bool = False,
    ) -> Check:
        preempted = (
            self.preemptions_after(preempted_before)
            if must_preempt
            else self.preemptions() - preempted_before
        )
        errors = [f"{t.name}: {t.error}" for t in done if t.error]
        outs = [(t.name, t.prompt, t.stream) for t in done if t.stream]
        greedy = self.judge(row, outs) if outs else GreedyCheck()
        seen = f"{len(errors)} errors; {self.summary(greedy)}; {preempted:.0f} preempted"
        if errors:
            seen = f"{errors[0]}; {seen}"
        check = Check(row, self._expected, seen, not errors and _clean(greedy) and bool(outs))
        if must_preempt:
            return _unless_unexercised(check, P.unexercised(row, self.plan, preempted=preempted))
        return check

    # ---- the run

    def run(self) -> None:
        spec_before = _spec(self.client, self.model)
        rows: dict[str, Callable[[], Check]] = {
            P.DECODE: self.decode,
            P.CHUNKED: self.chunked,
            P.RESUME: self.resume,
            P.MIXED: self.mixed,
            P.PREEMPTION: self.preemption,
            P.MAX_LEN: self.max_len,
            P.RESIDUES: self.residues,
            P.DEGENERATION: self.degeneration,
        }
        for name in P.ROWS:
            if name in self.rows:
                self.report.checks.append(self._row(name, rows[name]))
        spec_after = _spec(self.client, self.model)
        if spec_before is not None and spec_after is not None:
            run = spec_after - spec_before
            rate = run.acceptance_rate
            self.report.measurements.update(
                spec_draft_tokens=int(run.draft_tokens),
                spec_accepted_tokens=int(run.accepted),
                spec_acceptance_rate=None if rate is None else round(rate, 4),
            )
            seen = f"{run.accepted:.0f} of {run.draft_tokens:.0f} drafted tok accepted"
            self.report.checks.append(Check("speculation", "read from the server", seen, None))
        self.report.outputs["greedy"] = self.greedy
        self.report.server["decoding_prompt_lengths"] = sorted(set(self.decoding_prompts))
        if not self.client.healthy():
            self.report.checks.append(
                Check("healthy at the end", "/health 200", "no answer", False)
            )

    def _row(self, name: str, row: Callable[[], Check]) -> Check:
        failed = [need for need in P.NEEDS.get(name, ()) if need in self.broken]
        if failed:
            self.broken.add(name)
            seen = f"not judged: {failed[0]} failed"
            return Check(name, "its path's other rows pass", seen, None)
        else:
            self._expected = name
            self.prompts.seek(P.ROWS.index(name), len(P.ROWS))
            start = time.perf_counter()
            try:
                check = row()
            except Exception as exc:
                check = Check(name, self._expected, error_line(exc), False)
            key = name.replace(" ", "_").replace("-", "_")
            self.report.measurements[f"{key}_s"] = round(time.perf_counter() - start, 1)
            check = self._against(check)
        if check.ok is False:
            self.broken.add(name)
        return check

    def _against(self, check: Check) -> Check:
        """CHECK held to the record's row, when there is one and the row was judged (a
        row that failed stays failed, and says what the record saw too)."""
        was = (self.against or {}).get("rows", {}).get(check.name)
        now = self.recorded.get(check.name)
        if check.ok is None or was is None or now is None:
            return check
        ok, seen = R.compare(was, now, self.margin)
        held = check.ok and ok is not False
        return Check(check.name, check.expected, f"{check.seen}; record: {seen}", held)


def _unless_unexercised(check: Check, how: str) -> Check:
    """CHECK, or INCOMPLETE with HOW when its path did not run: a row that failed still
    fails (what it saw is wrong whether or not its path ran); one that passed did not
    prove its path."""
    if not how or check.ok is False:
        return check
    return Check(check.name, check.expected, f"not exercised; {check.seen}", None, how)


def _clean(greedy: GreedyCheck) -> bool:
    return greedy.tokens > 0 and not greedy.misses and not greedy.drifted


def _version(client: Client) -> str | None:
    """The server's vLLM version (/version), if it says (a gateway may not serve it)."""
    for root in (client.metrics_urls or ()) + (client.root,):
        with contextlib.suppress(Exception):
            return str(
                Client(root, client.api_key, 30, ca_cert=client.ca_cert).get_json("/version")[
                    "version"
                ]
            )
    return None


def _spec(client: Client, model: str) -> m.SpecDecode | None:
    try:
        return m.spec_decode(client.metrics(), model)
    except Exception:
        return None


@dataclass(frozen=True)
class VerifyOptions(ServerOptions):
    """What `arcvllm verify` was asked: the server, the model, what it cannot read."""

    chunk_tokens: int | None = None
    rows: tuple[str, ...] = P.ROWS
    request_timeout: float = 600.0
    metrics_urls: tuple[str, ...] = ()  # the server's own root behind a gateway
    drift_nats: float = DRIFT_NATS  # a token's |Δ logprob| beyond this fails its row
    record: str | None = None  # write the run here (when nothing failed)
    against: str | None = None  # hold the run to this record
    margin: float = R.MARGIN  # drift p99 allowed beyond the record's


def run(opts: VerifyOptions) -> Report:
    """Discover the server, plan the rows from it, run them: the report."""
    start = time.perf_counter()
    report = Report()
    against = R.load(opts.against) if opts.against else None  # a bad file stops here
    client = Client(
        opts.base_url, opts.api_key, opts.request_timeout, opts.metrics_urls, opts.ca_cert
    )
    model = requested_model(opts.model, opts.preset)  # a bad preset stops here
    if not client.healthy():
        raise Unavailable(f"no vLLM server answers {client.root}/health")
    served = discover(client, model, log=opts.log)
    chunk, chunk_source = chunk_tokens(opts.chunk_tokens, opts.preset, opts.log)
    geometry = P.Geometry(
        block_size=served.block_size,
        max_model_len=served.max_model_len,
        chunk_tokens=chunk,
        kv_tokens=m.kv_tokens(client.metrics()),
    )
    plan = P.plan_rows(geometry)
    speculative = _spec(client, served.model) is not None
    report.server = {
        "base_url": client.root,
        "model": served.model,
        "block_size": served.block_size,
        "block_size_source": served.block_size_source,
        "max_model_len": served.max_model_len,
        "chunk_tokens": chunk,
        "chunk_tokens_source": chunk_source,
        "kv_tokens": geometry.kv_tokens,
        "speculative": speculative,
        "vllm_version": _version(client),
        "corpus": corpus_digest(),
        "drift_nats": opts.drift_nats,
        "plan": asdict(plan),
    }
    if against is not None and opts.against:
        R.refuse_other(against, report.server, opts.against)
        report.server["against"] = {"path": opts.against, "vllm": against.get("vllm")}
    seen = (
        f"block {served.block_size}, context {served.max_model_len}, chunk {chunk} "
        f"({chunk_source}), KV {geometry.kv_tokens} tok"
    )
    report.checks.append(Check("server", "read from the server", seen, None))
    suite = Suite(client, served.model, plan, report, speculative, opts.rows)
    suite.drift_nats, suite.against, suite.margin = opts.drift_nats, against, opts.margin
    suite.run()
    report.judge()
    if opts.record and report.verdict != "fail":
        passed = {c.name for c in report.checks if c.ok}
        rows = {row: kept for row, kept in suite.recorded.items() if row in passed}
        R.write(Path(opts.record), R.make(report.server, rows))
        report.server["recorded"] = opts.record
    if report.failed:
        lines = opts.log.lines()
        report.crash = find_crash(lines)
        report.log_tail = lines[-LOG_TAIL_LINES:]
    report.measurements["time_to_verdict_s"] = round(time.perf_counter() - start, 1)
    return report
