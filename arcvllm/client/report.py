"""The result of checks against a server (`arcvllm smoke`, `arcvllm verify`): Check rows,
the one screen an operator reads, the JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from arcvllm.text import columns


@dataclass
class Check:
    name: str
    expected: str
    seen: str
    ok: bool | None  # None: information (e.g. the block size read), neither PASS nor FAIL
    # A check that did not exercise what it checks (ok None): how to make it run. Its
    # result is INCOMPLETE, never PASS.
    how: str = ""

    @property
    def result(self) -> str:
        if self.how:
            return "INCOMPLETE"
        return "INFO" if self.ok is None else "PASS" if self.ok else "FAIL"


@dataclass
class Report:
    verdict: str = "fail"  # pass, fail, or incomplete (nothing failed, something did not run)
    failed: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    server: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    measurements: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    crash: str | None = None
    log_tail: list[str] = field(default_factory=list)

    def judge(self) -> None:
        """The verdict from the checks: a failed one fails the report; else one that did
        not run makes it incomplete; else it passes."""
        self.failed = [c.name for c in self.checks if c.ok is False]
        self.incomplete = [c.name for c in self.checks if c.how]
        self.verdict = "fail" if self.failed else "incomplete" if self.incomplete else "pass"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json())


def render_checks(checks: list[Check], width: int | None = None) -> str:
    """One screen: check, expected, seen, PASS/FAIL/INFO."""
    if width is None:
        import shutil

        width = max(100, shutil.get_terminal_size((120, 24)).columns)
    rows = [("check", "expected", "seen", "result")]
    rows += [(c.name, c.expected, c.seen, c.result) for c in checks]
    return columns(rows, width=width, rule=True)


def render_drift(report: Report) -> str:
    """Per row whose path's logprobs were compared with the plain model's: |Δ logprob|
    p50/p99/max and the top-K overlap, under the threshold; '' when none was."""
    rows: list[tuple[str, ...]] = [("row", "tokens", "p50", "p99", "max", "top-k overlap")]
    for name, greedy in report.outputs.get("greedy", {}).items():
        d = greedy.get("drift") or {}
        if d.get("tokens"):
            values = [f"{d[k]:.3f}" for k in ("p50", "p99", "max", "overlap")]
            rows.append((name, str(d["tokens"]), *values))
    if len(rows) == 1:
        return ""
    limit = report.server.get("drift_nats")
    head = "drift: |Δ logprob| of each token against the plain model's, nats"
    head += f" (a token beyond {limit:g} fails its row)" if limit is not None else ""
    return head + "\n" + columns(rows, rule=True)


def table(report: Report, title: str = "smoke") -> str:
    """The one screen an operator reads; TITLE names the command in its verdict line."""
    out = [render_checks(report.checks), ""]
    drift = render_drift(report)
    if drift:
        out += [drift, ""]
    meas = ", ".join(f"{k}={v}" for k, v in report.measurements.items())
    out.append(f"measured (not asserted): {meas}")
    for c in report.checks:
        if c.how:
            out.append(f"{c.name}: not exercised: {c.how}")
    if report.verdict == "pass":
        passed = sum(1 for c in report.checks if c.ok)
        out.append(f"{title}: PASS ({passed} checks)")
        return "\n".join(out)
    if report.verdict == "incomplete":
        out.append(f"{title}: INCOMPLETE: {', '.join(report.incomplete)}")
        return "\n".join(out)
    out.append(f"{title}: FAIL: {', '.join(report.failed)}")
    if report.crash:
        out.append(f"server crashed: {report.crash}")
    if report.log_tail:
        out.append(f"--- last {len(report.log_tail)} lines of the server log ---")
        out.extend(report.log_tail)
    else:
        out.append("(no server log: pass --log-file or --log-cmd to see it here)")
    return "\n".join(out)
