"""`arcvllm canary`: a serving deployment's output checked every few minutes, its results
as Prometheus metrics. Runs beside the server (a compose service, a Kubernetes
Deployment, or any host that reaches the gateway), as one more client with the key.

Each round runs a small, bounded set of `arcvllm verify`'s rows (arcvllm.verify.suite):
the decode across two block boundaries (speculative, where the server speculates), a
cached prefix resumed, prompts of every length mod 64, sampled answers to open prompts.
The model is the oracle, as in verify: a server that goes wrong while it serves (NaN at
long context, a state lost at a block boundary, `!!!!`) fails a check here, and
deploy/prometheus/rules/canary.yml turns that into an alert for Alertmanager. A round
that fails is run again at once and counts only when it fails again: one lost request
does not page.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

from arcvllm.client.report import Report
from arcvllm.errors import ArcvllmError
from arcvllm.text import error_line
from arcvllm.verify import plan as P

ROWS = (P.DECODE, P.RESUME, P.RESIDUES, P.DEGENERATION)
PORT = 9400
INTERVAL = 300.0
# A speculating server accepting fewer of its drafts than this is as good as a drafter with
# no weights (an MTP preset on a checkpoint without `mtp.*`: every draft rejected).
ACCEPTANCE_FLOOR = 0.3

PREFIX = "arcvllm_canary"
DESCRIPTION = """\
Runs a bounded set of `arcvllm verify`'s rows (decode across two block boundaries, a cached
prefix resumed, prompts of every length mod 64, sampled answers to open prompts) against a
serving deployment every --interval seconds, the model itself as the oracle, and serves the
results as Prometheus metrics on --port (arcvllm_canary_*): each check's pass, the last
success, the degeneration score, the speculative acceptance. A round that fails is run
again at once, and only a second failure counts. deploy/prometheus/rules/canary.yml
alerts on them."""


class Metrics:
    """The canary's series, in a registry of their own."""

    def __init__(self, acceptance_floor: float = ACCEPTANCE_FLOOR) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.acceptance_floor = acceptance_floor

        self.registry = CollectorRegistry()

        def gauge(name: str, doc: str, *labels: str) -> Gauge:
            return Gauge(f"{PREFIX}_{name}", doc, labels, registry=self.registry)

        self.check = gauge(
            "check_ok", "1: the check passed in the last round, 0: it failed", "check"
        )
        # A check that did not exercise its path (INCOMPLETE) neither passed nor failed: it
        # has no check_ok (no page) and says so here.
        self.incomplete = gauge(
            "check_incomplete", "1: the check did not exercise its path in the last round", "check"
        )
        self.up = gauge("up", "1: the last round reached the server")
        self.rounds = Counter(
            f"{PREFIX}_rounds", "Rounds by result (pass, incomplete, fail, error)", ["result"],
            registry=self.registry,
        )  # fmt: skip
        self.rechecks = Counter(
            f"{PREFIX}_rechecks", "Rounds that failed once and were run again before counting",
            registry=self.registry,
        )  # fmt: skip
        self.last_round = gauge("last_round_timestamp_seconds", "When the last round ended")
        self.last_success = gauge(
            "last_success_timestamp_seconds", "When a round last passed it all (or the start)"
        )
        # Per served model, so a series exists only once a round has measured it (a
        # server that does not speculate has no acceptance, not an acceptance of 0).
        self.run = gauge("degeneration_longest_run", "Longest run of one token", "model")
        self.entropy = gauge(
            "degeneration_min_entropy_nats", "Lowest mean top-k entropy of an answer", "model"
        )
        self.acceptance = gauge("spec_acceptance_rate", "Drafts accepted in a round", "model")
        self.floor = gauge("spec_acceptance_floor", "Below it drafts are as good as none", "model")
        self.seconds = gauge("round_seconds", "How long the last round took")
        # Counted from the start: a canary that never passes alerts as one that stopped.
        self.last_success.set(time.time())

    def record(self, report: Report | None, error: str | None, seconds: float) -> str:
        """Set the series from one round's REPORT (None: the round did not get that far,
        ERROR says why); the round's result."""
        now = time.time()
        self.last_round.set(now)
        self.seconds.set(round(seconds, 1))
        if report is None:
            self.up.set(0)
            self.rounds.labels("error").inc()
            return "error"
        self.up.set(1)
        for check in report.checks:
            if check.name not in ROWS:
                continue
            self.incomplete.labels(check.name).set(1 if check.how else 0)
            if check.how:
                with contextlib.suppress(KeyError):  # never set: nothing to take back
                    self.check.remove(check.name)
            elif check.ok is not None:
                self.check.labels(check.name).set(1 if check.ok else 0)
        measured, model = report.measurements, str(report.server.get("model", ""))
        if "degeneration_longest_run" in measured:
            self.run.labels(model).set(measured["degeneration_longest_run"])
            self.entropy.labels(model).set(measured["degeneration_min_entropy"])
        if measured.get("spec_acceptance_rate") is not None:
            self.acceptance.labels(model).set(measured["spec_acceptance_rate"])
            self.floor.labels(model).set(self.acceptance_floor)
        result = report.verdict if report.verdict in ("pass", "incomplete") else "fail"
        self.rounds.labels(result).inc()
        if result != "fail":  # nothing failed: nothing to page for
            self.last_success.set(now)
        return result

    def exposition(self) -> str:
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()


def one_round(
    opts, metrics: Metrics, check: Callable[[Any], Report] | None = None
) -> tuple[str, Report | None]:
    """Run the rows once against the server (CHECK: verify's run), and once more at once
    when they failed or did not get that far: only a round that fails twice running is
    recorded as failed in METRICS (one request lost to a restart, a timeout under load,
    a near tie does not page)."""
    report, error, seconds = _attempt(opts, check)
    if error is not None or (report is not None and report.verdict == "fail"):
        named = error or ", ".join(report.failed if report is not None else [])
        print(f"arcvllm canary: round failed ({named}): once more", file=sys.stderr, flush=True)
        metrics.rechecks.inc()
        report, error, again = _attempt(opts, check)
        seconds += again
    result = metrics.record(report, error, seconds)
    if error:
        print(f"arcvllm canary: round failed: {error}", file=sys.stderr, flush=True)
    return result, report


def _attempt(
    opts, check: Callable[[Any], Report] | None
) -> tuple[Report | None, str | None, float]:
    """One run of the rows: its report, or why there is none; its seconds."""
    from arcvllm.verify.suite import run

    start = time.perf_counter()
    try:
        report, error = (check or run)(opts), None
    except ArcvllmError as exc:
        report, error = None, str(exc)
    except Exception as exc:  # a server that answers garbage is a failed round, not a crash
        report, error = None, error_line(exc)
    return report, error, time.perf_counter() - start


def round_line(result: str, report: Report | None, as_json: bool) -> str:
    """A round as `arcvllm canary` prints it: a JSON line, or `round RESULT: ROWS` (the
    failed ones, else the incomplete ones)."""
    failed = report.failed if report is not None else []
    incomplete = report.incomplete if report is not None else []
    if as_json:
        return json.dumps({"round": result, "failed": failed, "incomplete": incomplete})
    named = failed or incomplete
    why = f": {', '.join(named)}" if named else ""
    return f"arcvllm canary: round {result}{why}"


def watch(
    opts, metrics: Metrics, listen: str, port: int, interval: float, as_json: bool
) -> NoReturn:
    """Serve METRICS on LISTEN:PORT and run a round every INTERVAL seconds, a line each."""
    from prometheus_client import start_http_server

    start_http_server(port, addr=listen, registry=metrics.registry)
    print(f"arcvllm canary: metrics on {listen}:{port}/metrics", flush=True)
    while True:
        result, report = one_round(opts, metrics)
        print(round_line(result, report, as_json), flush=True)
        time.sleep(interval)
