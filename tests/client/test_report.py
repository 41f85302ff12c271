"""The report of smoke and verify: its verdict from the checks (a failure wins over a check
that did not run, which is never a pass), the screen, the exit status."""

from __future__ import annotations

from arcvllm.client.report import Check, Report, table
from arcvllm.verify.session import exit_status


def report(*checks: Check) -> Report:
    r = Report(checks=list(checks))
    r.judge()
    return r


PASSED = Check("boundary decode", "each = plain greedy", "280 of 280 tok", True)
INFO = Check("server", "read from the server", "block 256", None)
FAILED = Check("mixed batches", "each = plain greedy", "3 off", False)
UNRUN = Check("preemption", "preempted", "not exercised", None, "start it with less KV cache")


def test_every_check_passed_is_a_pass_exit_0():
    r = report(INFO, PASSED)
    assert (r.verdict, r.failed, r.incomplete, exit_status(r)) == ("pass", [], [], 0)
    assert table(r, "verify").endswith("verify: PASS (1 checks)")


def test_a_check_that_did_not_run_is_incomplete_exit_4_with_how_to_run_it():
    r = report(INFO, PASSED, UNRUN)
    assert (r.verdict, r.incomplete, exit_status(r)) == ("incomplete", ["preemption"], 4)
    assert UNRUN.result == "INCOMPLETE"
    screen = table(r, "verify")
    assert "preemption: not exercised: start it with less KV cache" in screen
    assert screen.endswith("verify: INCOMPLETE: preemption")
    row = next(line for line in screen.splitlines() if line.startswith("preemption "))
    assert row.split()[-1] == "INCOMPLETE"


def test_a_failure_wins_over_a_check_that_did_not_run_exit_1():
    r = report(UNRUN, FAILED, PASSED)
    assert (r.verdict, r.failed, r.incomplete, exit_status(r)) == (
        "fail",
        ["mixed batches"],
        ["preemption"],
        1,
    )
    assert "verify: FAIL: mixed batches" in table(r, "verify")


def test_the_drift_of_each_row_is_a_table_under_the_checks_with_its_threshold():
    r = report(INFO, PASSED)
    assert "drift" not in table(r, "verify")  # no path logprobs compared: no table
    drift = {"tokens": 280, "p50": 0.0141, "p99": 0.0316, "max": 0.0565, "overlap": 0.9821}
    r.outputs["greedy"] = {"boundary decode": {"drift": drift}, "resumed": {"drift": {}}}
    r.server["drift_nats"] = 1.0
    lines = table(r, "verify").splitlines()
    at = lines.index(
        "drift: |Δ logprob| of each token against the plain model's, nats "
        "(a token beyond 1 fails its row)"
    )
    assert lines[at + 1].split() == ["row", "tokens", "p50", "p99", "max", "top-k", "overlap"]
    assert lines[at + 3].split() == [
        "boundary",
        "decode",
        "280",
        "0.014",
        "0.032",
        "0.057",
        "0.982",
    ]
    assert len([line for line in lines if line.startswith("resumed")]) == 0
