"""deploy/alertmanager and the path of an alert: arcvllm's rules in Debian's Prometheus, sent
to Debian's Alertmanager (started by the image's entrypoint script), delivered to a webhook.
Like tests/deploy/test_prometheus.py these run the host's binaries (`make tools`), no engine."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from support import ROOT
from support.alerting import TEMPLATE, AlertPath, entrypoint, shipped_config, started
from support.httpd import QuietHandler
from support.processes import free_port, stop_server
from support.prometheus import PROM, RULES, tool

from arcvllm.builder import dockerfile
from arcvllm.client.api import WaitTimeout, wait_until

DOCKERFILE = ROOT / "docker" / "Dockerfile"


def run_entrypoint(tmp_path: Path, url: str | None) -> subprocess.CompletedProcess:
    argv, env = entrypoint(tmp_path, "--version", url=url)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)


# ---- the configuration and the entrypoint -----------------------------------------------


def test_the_configuration_with_a_url_is_valid_for_amtool(tmp_path):
    config = tmp_path / "alertmanager.yml"
    config.write_text(TEMPLATE.read_text().replace("__ALERT_WEBHOOK_URL__", "https://h.example/x"))
    result = subprocess.run(
        [tool("amtool"), "check-config", str(config)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 receivers" in result.stdout


def test_a_broken_configuration_fails_amtool(tmp_path):
    config = tmp_path / "alertmanager.yml"
    text = TEMPLATE.read_text().replace("__ALERT_WEBHOOK_URL__", "https://h.example/x")
    config.write_text(text.replace("receiver: operator", "receiver: nobody"))
    result = subprocess.run(
        [tool("amtool"), "check-config", str(config)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode != 0
    assert "nobody" in result.stdout + result.stderr


def test_without_a_webhook_url_the_entrypoint_refuses_in_one_line(tmp_path):
    result = run_entrypoint(tmp_path, url=None)
    assert result.returncode == 3
    assert result.stderr.splitlines() == [
        "alertmanager: ALERT_WEBHOOK_URL is not set: set it to the webhook that receives"
        " arcvllm's alerts (docs/scale.md)"
    ]
    assert not (tmp_path / "alertmanager.yml").exists()


@pytest.mark.parametrize("url", ["hooks.example.org/x", 'https://h/"x', "https://h/ x", "ftp://h"])
def test_a_url_that_is_not_http_is_a_usage_error_in_one_line(tmp_path, url):
    result = run_entrypoint(tmp_path, url=url)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1 and "http:// or https://" in result.stderr


def test_the_entrypoint_writes_the_url_as_given_and_private(tmp_path):
    url = "https://hooks.example.org/services/T0/B0/x?a=1&b=2#frag"
    result = run_entrypoint(tmp_path, url=url)
    assert result.returncode == 0, result.stderr
    assert "alertmanager, version 0.25" in result.stdout + result.stderr
    written = tmp_path / "alertmanager.yml"
    assert (written.stat().st_mode & 0o777) == 0o600
    config = yaml.safe_load(written.read_text())
    assert config["receivers"][0]["webhook_configs"][0]["url"] == url


# ---- compose and the image --------------------------------------------------------------


def test_the_alertmanager_stage_follows_prometheus_and_runs_the_entrypoint():
    stages = dict(dockerfile.stages(DOCKERFILE.read_text()))
    names = list(stages)
    # (each side image's stage is `<name>-content`; `side` adds its SBOM and labels)
    assert names[names.index("prometheus-content") + 1] == "alertmanager-content"
    assert names[-3:] == ["side-content", "side-sbom", "side"]
    steps = stages["alertmanager-content"]
    assert any(
        i == "RUN" and "apt-get install -y --no-install-recommends prometheus-alertmanager" in v
        for i, v in steps
    )
    assert (
        "COPY",
        "docker/alertmanager-entrypoint.sh /usr/local/bin/arcvllm-alertmanager",
    ) in steps
    assert ("ENTRYPOINT", '["/usr/local/bin/arcvllm-alertmanager"]') in steps


@pytest.mark.compose
def test_compose_runs_alertmanager_with_monitoring_and_publishes_no_port():
    """Its API adds silences without authentication: no host port (tests/deploy/test_gateway.py:
    only the gateway is published)."""
    from support.scale import ports, services

    am = services("monitoring")["alertmanager"]
    assert (am["build"]["target"], am["build"]["args"]) == ("side", {"SIDE": "alertmanager"})
    assert [str(p) for p in am["expose"]] == ["9093"]
    assert ports(am) == []
    assert am["environment"] == {"ALERT_WEBHOOK_URL": ""}  # the container refuses it
    assert am["read_only"] is True and am["cap_drop"] == ["ALL"]
    mine = services("monitoring", env={"ALERT_WEBHOOK_URL": "https://h/x"})
    assert mine["alertmanager"]["environment"] == {"ALERT_WEBHOOK_URL": "https://h/x"}
    other = services("monitoring", env={"BIND_ADDRESS": "0.0.0.0"})
    assert ports(other["alertmanager"]) == []
    assert am["profiles"] == ["monitoring"]


def test_prometheus_sends_its_alerts_to_the_alertmanager_service():
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    (am,) = config["alerting"]["alertmanagers"]
    assert am["static_configs"] == [{"targets": ["alertmanager:9093"]}]


# ---- a real alert reaches a webhook -----------------------------------------------------


def test_a_down_replica_reaches_the_operators_webhook(tmp_path):
    """ArcvllmReplicaDown (its `for:` cut from 20 m to 1 s, the same expression) fires on a
    replica target nobody answers; Prometheus sends it to Alertmanager, which the image's
    entrypoint started with the sink's URL; the sink receives it with its labels."""
    import httpx

    began = time.monotonic()
    dead_port, router_port = free_port(), free_port()  # nothing listens on them
    rules = RULES.read_text()
    down = 'expr: up{job="vllm"} == 0\n        for: 20m'
    assert rules.count(down) == 1
    (tmp_path / "targets.yml").write_text(
        yaml.safe_dump([{"targets": [f"127.0.0.1:{dead_port}"], "labels": {"replica": "vllm-0"}}])
    )
    config = shipped_config()
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    jobs["vllm"]["file_sd_configs"] = [{"files": [str(tmp_path / "targets.yml")]}]
    jobs["router"]["static_configs"][0]["targets"] = [f"127.0.0.1:{router_port}"]
    config["scrape_configs"] = [jobs["vllm"], jobs["router"]]
    path = AlertPath(tmp_path, config, {"arcvllm.yml": rules.replace(down, down[:-3] + "1s")})
    with path:
        alert = path.delivered("ArcvllmReplicaDown", 60)
        assert alert["status"] == "firing"
        assert alert["labels"] == {
            "alertname": "ArcvllmReplicaDown",
            "deployment": "arcvllm",  # prometheus.yml's external label
            "instance": f"127.0.0.1:{dead_port}",
            "job": "vllm",
            "replica": "vllm-0",
            "severity": "critical",
        }
        assert alert["annotations"]["summary"] == (
            "vLLM replica vllm-0 has not answered for 20 minutes"
        )
        # Alertmanager itself agrees: the alert is active there.
        active = httpx.get(f"http://127.0.0.1:{path.am_port}/api/v2/alerts", timeout=10).json()
        assert "ArcvllmReplicaDown" in {a["labels"]["alertname"] for a in active}
    assert all(proc.returncode is not None for proc in path.procs)
    assert time.monotonic() - began < 90


# ---- the single server of `make up` -----------------------------------------------------

SINGLE = PROM / "prometheus-single.yml"


def test_the_single_server_config_is_valid_and_has_no_router_job():
    result = subprocess.run(
        [tool("promtool"), "check", "config", str(SINGLE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load(SINGLE.read_text())
    assert [job["job_name"] for job in config["scrape_configs"]] == ["vllm", "canary"]
    assert config["alerting"] == yaml.safe_load((PROM / "prometheus.yml").read_text())["alerting"]


@pytest.mark.compose
def test_compose_runs_the_single_servers_prometheus_as_the_image_does_with_its_config():
    from support.compose import COMPOSE_FILE, config

    result = config(COMPOSE_FILE, "--profile", "monitoring")
    assert result.returncode == 0, result.stderr
    service = yaml.safe_load(result.stdout)["services"]["prometheus-single"]
    image = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", prometheus_stage(), re.M).group(1))
    swapped = [a.replace("/prometheus.yml", "/prometheus-single.yml") for a in image]
    assert service["entrypoint"] == swapped != image
    assert service["profiles"] == ["monitoring"]
    # no authentication: published nowhere (the gateway is the one published port)
    assert "ports" not in service and [str(p) for p in service["expose"]] == ["9090"]


def prometheus_stage() -> str:
    text = DOCKERFILE.read_text()
    stage = text[text.index(" AS prometheus-content\n") :]
    return stage[: stage.index("\nFROM ")]


def test_one_server_found_under_both_names_is_one_target_labelled_vllm(tmp_path):
    """The single server's relabeling, on a real Prometheus: the DNS lookup is replaced by
    the two targets it yields when vllm-cpu also answers as `vllm` (one address, two
    names); they become one target, replica="vllm", instance="vllm:8000"."""
    import httpx

    class Metrics(QuietHandler):
        def do_GET(self) -> None:
            self.send(200, "vllm:num_requests_running 0\n", "text/plain")

    from http.server import ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{server.server_address[1]}"
    config = yaml.safe_load(SINGLE.read_text())
    config["global"].update(scrape_interval="1s", scrape_timeout="1s")
    config.pop("alerting")
    config["rule_files"] = []
    job = config["scrape_configs"][0]
    config["scrape_configs"] = [job]
    assert job.pop("dns_sd_configs")[0]["names"] == ["vllm", "vllm-cpu"]
    job["static_configs"] = [
        {"targets": [address], "labels": {"__meta_dns_name": name}} for name in ("vllm", "vllm-cpu")
    ]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = started(
        [
            tool("prometheus"),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        tmp_path / "prometheus.log",
    )
    try:

        def scraped() -> list:
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited: {(tmp_path / 'prometheus.log').read_text()}")
            try:
                r = httpx.get(
                    f"http://127.0.0.1:{port}/api/v1/query", params={"query": "up"}, timeout=5
                )
            except httpx.HTTPError:
                return []
            return r.json()["data"]["result"] if r.status_code == 200 else []

        try:
            found = wait_until(scraped, 30, 0.5, "a scrape of the single server")
        except WaitTimeout as exc:
            pytest.fail(f"{exc}: {(tmp_path / 'prometheus.log').read_text()[-2000:]}")
        time.sleep(2)  # a second target, had there been one, would be up by now
        (up,) = scraped() or found
        assert up["metric"] == {
            "__name__": "up",
            "job": "vllm",
            "replica": "vllm",
            "instance": "vllm:8000",
        }
        assert up["value"][1] == "1"
        targets = httpx.get(f"http://127.0.0.1:{port}/api/v1/targets", timeout=5).json()
        assert len(targets["data"]["activeTargets"]) == 1
    finally:
        stop_server(proc)
        server.shutdown()
        server.server_close()
