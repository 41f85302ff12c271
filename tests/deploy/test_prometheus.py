"""deploy/prometheus: the scrape config, rules, alert unit tests and consoles, checked by
Debian's promtool and served by a real Prometheus (`make tools` unpacks the package)."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from support.processes import free_port, stop_server
from support.prometheus import DASHBOARD, PROM, RULES, console_exprs, dashboard_exprs, rules, tool

from arcvllm.client.api import WaitTimeout, wait_until

ALERTS = {
    "ArcvllmReplicaDown",
    "ArcvllmRouterWorkerUnhealthy",
    "ArcvllmRouterDown",
    "ArcvllmKvCacheFull",
    "ArcvllmRequestsWaiting",
    "ArcvllmPrefixCacheHitRateCollapse",
    "ArcvllmTTFTHigh",
    "ArcvllmRouterMissingTokens",
    "ArcvllmReplicaFlapping",
    "ArcvllmRouterCircuitOpen",
    "ArcvllmReplicaErrorRate",
    "ArcvllmRouterRequestsFailing",
    "ArcvllmPreemptions",
    "ArcvllmTargetsAbsent",
}
RULE_TESTS = PROM / "tests" / "rules.test.yml"
COLD_START = "a cold start and a rolling restart fire nothing"


def promtool(*args: str, cwd: Path = PROM) -> subprocess.CompletedProcess:
    return subprocess.run(
        [tool("promtool"), *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


# ---- static checks ----------------------------------------------------------------------


def test_prometheus_config_and_its_rule_files_are_valid():
    result = promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rules/arcvllm.yml" in result.stdout


def test_rules_are_valid_and_every_alert_is_there():
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert {r["alert"] for r in rules() if "alert" in r} == ALERTS


def test_a_broken_rule_fails_the_check(tmp_path):
    broken = tmp_path / "rules.yml"
    broken.write_text(
        RULES.read_text().replace("max by (replica) (vllm:kv", "max by (replica (vllm:kv")
    )
    result = promtool("check", "rules", str(broken))
    assert result.returncode != 0
    assert "arcvllm:kv_cache_usage:ratio" in result.stdout + result.stderr


def test_every_alert_fires_and_stays_quiet_in_the_unit_tests():
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing = {
        t["alertname"] for case in cases for t in case.get("alert_rule_test", []) if t["exp_alerts"]
    }
    assert firing == ALERTS
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_alert_may_fire_during_a_cold_start_or_a_rolling_restart():
    (case,) = [
        c for c in yaml.safe_load(RULE_TESTS.read_text())["tests"] if c["name"] == COLD_START
    ]
    checks = case["alert_rule_test"]
    assert {t["alertname"] for t in checks} == ALERTS
    assert all(t["exp_alerts"] == [] for t in checks)
    # Checked from the end of the cold start (14 min) to after the restart (43 min).
    assert {"14m", "20m", "43m"} <= {t["eval_time"] for t in checks}


def write_rules(tmp_path: Path, text: str) -> Path:
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "rules" / "arcvllm.yml").write_text(text)
    shutil.copy(RULE_TESTS, tmp_path / "tests")
    return tmp_path


@pytest.mark.parametrize(
    ("before", "after", "alert"),
    [
        # The rules this replaced: any down target for 2 minutes, any unhealthy worker.
        (
            'expr: up{job="vllm"} == 0\n        for: 20m',
            'expr: up{job="vllm"} == 0\n        for: 2m',
            "ArcvllmReplicaDown",
        ),
        (
            'arcvllm:router_worker_health == 0 and on (replica) up{job="vllm"} == 1',
            "arcvllm:router_worker_health == 0",
            "ArcvllmRouterWorkerUnhealthy",
        ),
        ('> 0 and on () sum(up{job="vllm"}) > 0', "> 0", "ArcvllmRouterRequestsFailing"),
    ],
)
def test_the_cold_start_test_catches_rules_that_fire_on_a_model_load(
    tmp_path, before, after, alert
):
    text = RULES.read_text()
    assert before in text
    cwd = write_rules(tmp_path, text.replace(before, after))
    result = promtool("test", "rules", "tests/rules.test.yml", cwd=cwd)
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert f"name: {COLD_START}" in out and f"alertname: {alert}" in out


def test_the_alert_unit_tests_catch_a_changed_threshold(tmp_path):
    text = RULES.read_text()
    assert "arcvllm:kv_cache_usage:ratio > 0.95" in text
    cwd = write_rules(
        tmp_path,
        text.replace("arcvllm:kv_cache_usage:ratio > 0.95", "arcvllm:kv_cache_usage:ratio > 0.99"),
    )
    result = promtool("test", "rules", "tests/rules.test.yml", cwd=cwd)
    assert result.returncode != 0
    assert "ArcvllmKvCacheFull" in result.stdout + result.stderr


def test_every_console_and_dashboard_expression_parses(tmp_path):
    exprs = console_exprs() + dashboard_exprs()
    assert len(exprs) > 20
    check = tmp_path / "exprs.yml"
    check.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "x",
                        "rules": [
                            {"record": f"check:expr_{i}", "expr": e} for i, e in enumerate(exprs)
                        ],
                    }
                ]
            }
        )
    )
    result = promtool("check", "rules", str(check))
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_uses_a_datasource_variable_and_unique_panel_ids():
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert all(
        t["datasource"]["uid"] == "${datasource}" for p in dash["panels"] for t in p["targets"]
    )


# ---- a real Prometheus with synthetic history -------------------------------------------

REPLICAS = ("vllm-0", "vllm-1")


def openmetrics(now: float) -> str:
    """Ten minutes of the series the rules read, as vLLM 0.32 and vllm-router name them."""
    times = [now - 600 + 15 * k for k in range(40)]
    families: dict[str, list[tuple[str, callable]]] = {}

    def add(name: str, labels: dict[str, str], value) -> None:
        families.setdefault(name, []).append((labels, value))

    for i, r in enumerate(REPLICAS):
        base = {"job": "vllm", "instance": f"{r}:8000", "replica": r}
        eng = {**base, "engine": "0", "model_name": "tiny-hybrid"}
        add("up", base, lambda k: 1)
        add("vllm:prefix_cache_queries_total", eng, lambda k: 1000 * k)
        add("vllm:prefix_cache_hits_total", eng, lambda k, i=i: (600 - 300 * i) * k)
        add("vllm:kv_cache_usage_perc", eng, lambda k, i=i: 0.25 + 0.1 * i)
        add("vllm:num_requests_running", eng, lambda k: 2)
        add("vllm:num_requests_waiting", eng, lambda k: 0)
        add("vllm:num_preemptions_total", eng, lambda k: 0)
        http = {**base, "handler": "/v1/completions", "method": "POST"}
        # No 5xx series and no vllm_router_retries_exhausted_total: neither exists before
        # the first failure, and the error rules must still say 0.
        add("http_requests_total", {**http, "status": "2xx"}, lambda k: 10 * k)
        for hist, edges in (
            ("vllm:time_to_first_token_seconds_bucket", ("0.1", "1.0", "+Inf")),
            ("vllm:inter_token_latency_seconds_bucket", ("0.01", "0.1", "+Inf")),
        ):
            for j, le in enumerate(edges):
                add(hist, {**eng, "le": le}, lambda k, j=j: (5 + 5 * j) * k)
        worker = {
            "job": "router",
            "instance": "router:29000",
            "worker": f"http://{r}:8000",
            "replica": r,
        }
        add("vllm_router_worker_health", worker, lambda k: 1)
        add("vllm_router_processed_requests_total", worker, lambda k: 10 * k)
        add("vllm_router_cb_state", worker, lambda k: 0)
    router = {"job": "router", "instance": "router:29000", "replica": "router"}
    add("up", router, lambda k: 1)
    for outcome in ("prefix_hit", "prefix_miss"):
        add(
            "vllm_router_prefix_routing_decisions_total",
            {**router, "policy": "cache_aware", "stage": "regular", "outcome": outcome},
            lambda k: 7 * k,
        )
    lines = []
    for name, series in families.items():
        for labels, value in series:
            text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines += [f"{name}{{{text}}} {value(k)} {t:.3f}" for k, t in enumerate(times)]
    return "\n".join([*lines, "# EOF", ""])


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """Debian's Prometheus with arcvllm's rules and consoles over backfilled history."""
    import httpx

    tmp = tmp_path_factory.mktemp("prometheus")
    data = tmp / "data"
    (tmp / "history.om").write_text(openmetrics(time.time() - 5))
    result = promtool(
        "tsdb", "create-blocks-from", "openmetrics", str(tmp / "history.om"), str(data)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    config["global"]["evaluation_interval"] = "1s"
    config["rule_files"] = [str(RULES)]
    config["scrape_configs"] = []  # the history is all there is
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = tmp / "prometheus.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                tool("prometheus"),
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{port}",
                f"--web.console.templates={PROM / 'consoles'}",
                f"--web.console.libraries={PROM / 'console_libraries'}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"

    def recorded() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"prometheus exited: {log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            r = httpx.get(
                f"{url}/api/v1/query", params={"query": "arcvllm:router_decisions:rate5m"}
            )
            return r.status_code == 200 and bool(r.json()["data"]["result"])
        return False

    try:
        try:
            wait_until(recorded, 60, 0.5, "a recorded series")
        except WaitTimeout as exc:
            pytest.fail(f"{exc}: {log.read_text()[-3000:]}")
        yield url
    finally:
        stop_server(proc)


def query(url: str, expr: str) -> list[dict]:
    import httpx

    r = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["data"]["result"]


def test_every_recording_rule_returns_data_per_replica(prometheus):
    for rule in rules():
        if "record" not in rule:
            continue
        result = query(prometheus, rule["record"])
        assert result, f"{rule['record']} returned nothing"
        assert all(s["value"][1] not in ("NaN", "+Inf") for s in result), (rule["record"], result)
    hit = {
        s["metric"]["replica"]: float(s["value"][1])
        for s in query(prometheus, "arcvllm:prefix_cache_hit_ratio:rate5m")
    }
    assert hit == pytest.approx({"vllm-0": 0.6, "vllm-1": 0.3})


def test_every_console_and_dashboard_expression_returns_data(prometheus):
    for expr in console_exprs() + dashboard_exprs():
        assert query(prometheus, expr), f"no data: {expr}"


def test_no_alert_fires_on_a_healthy_deployment(prometheus):
    firing = query(prometheus, 'ALERTS{alertname=~"Arcvllm.*"}')
    assert firing == [], firing


def test_console_renders_a_row_per_replica_with_every_value(prometheus):
    import httpx

    r = httpx.get(f"{prometheus}/consoles/arcvllm.html", timeout=10)
    assert r.status_code == 200, r.text[-2000:]
    page = r.text
    for replica in REPLICAS:
        row = re.search(rf"<tr><th>{replica}</th>(.*?)</tr>", page, re.S)
        assert row, f"no row for {replica}"
        cells = re.findall(r"<td>(.*?)</td>", row.group(1), re.S)
        assert len(cells) == 11, cells
        values = [re.sub(r"<[^>]+>", "", c).strip() for c in cells]
        assert "-" not in values and "" not in values, values
    assert "60%" in page and "prefix_hit" in page
    # Every script and stylesheet the console loads is served by this Prometheus.
    for asset in re.findall(r'(?:src|href)="(/classic/static/[^"]+)"', page):
        assert httpx.get(f"{prometheus}{asset}", timeout=10).status_code == 200, asset


def test_a_misspelled_metric_returns_no_data(prometheus):
    """The data checks above can fail: a wrong metric name is an empty result, not an error."""
    assert query(prometheus, "max by (replica) (vllm:kv_cache_usage_percent)") == []


def test_error_rules_say_zero_before_the_first_failure(prometheus):
    """Neither the 5xx series nor the router's retries_exhausted counter exists until a
    request fails: the recorded rates are 0, not missing (an empty series hides a broken
    rule and leaves the console blank)."""
    ratio = query(prometheus, "arcvllm:http_5xx_ratio:rate5m")
    assert {s["metric"]["replica"]: s["value"][1] for s in ratio} == {"vllm-0": "0", "vllm-1": "0"}
    (failed,) = query(prometheus, "arcvllm:router_failed_requests:rate5m")
    assert failed["value"][1] == "0"
    assert query(prometheus, "vllm_router_retries_exhausted_total") == []
