"""The path of an alert on this host: arcvllm's rules in Debian's Prometheus, sent to
Debian's Alertmanager (started by the image's entrypoint script, docker/alertmanager-
entrypoint.sh), delivered to a webhook in this process. What test_alerting.py and
test_canary.py share; the binaries come from `make tools`, no engine."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
import yaml

from arcvllm.client.api import WaitTimeout, wait_until
from support import ROOT
from support.httpd import QuietHandler
from support.processes import free_port, stop_server
from support.prometheus import PROM, tool

ALERTMANAGER = ROOT / "deploy" / "alertmanager"
TEMPLATE = ALERTMANAGER / "alertmanager.yml"
ENTRYPOINT = ROOT / "docker" / "alertmanager-entrypoint.sh"


def entrypoint(
    run_dir: Path, *args: str, url: str | None, template: Path = TEMPLATE
) -> tuple[list[str], dict[str, str]]:
    """The image's entrypoint with the host's Alertmanager: what the container runs."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "ALERTMANAGER_TEMPLATE": str(template),
        "ALERTMANAGER_RUN_DIR": str(run_dir),
    }
    if url is not None:
        env["ALERT_WEBHOOK_URL"] = url
    return [str(ENTRYPOINT), *args], env


class Sink:
    """A webhook receiver: every JSON body POSTed to it."""

    def __init__(self) -> None:
        from http.server import ThreadingHTTPServer

        received = self.received = []

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                received.append(json.loads(self.rfile.read(length)))
                self.send(200, "{}")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/arcvllm"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def started(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


class AlertPath:
    """Prometheus with CONFIG (the shipped prometheus.yml, changed by the caller: its scrape
    jobs, 1 s intervals) and RULES (file name -> text), Alertmanager from the shipped
    template with 1 s waits, and a Sink at the end of it. A context manager: everything it
    started is stopped on exit."""

    def __init__(self, tmp: Path, config: dict, rules: dict[str, str]) -> None:
        self.tmp = tmp
        self.am_port, self.prom_port = free_port(), free_port()
        (tmp / "am").mkdir()
        template = tmp / "alertmanager-template.yml"
        am_config = yaml.safe_load(TEMPLATE.read_text())
        am_config["route"].update(group_wait="1s", group_interval="1s")
        template.write_text(yaml.safe_dump(am_config))
        (tmp / "rules").mkdir()
        for name, text in rules.items():
            (tmp / "rules" / name).write_text(text)
        config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
        config["rule_files"] = [str(tmp / "rules" / "*.yml")]
        config["alerting"]["alertmanagers"][0]["static_configs"] = [
            {"targets": [f"127.0.0.1:{self.am_port}"]}
        ]
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.template = template
        self.sink = Sink()
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> AlertPath:
        tmp = self.tmp
        argv, env = entrypoint(
            tmp / "am",
            f"--storage.path={tmp / 'am'}",
            f"--web.listen-address=127.0.0.1:{self.am_port}",
            "--cluster.listen-address=",
            url=self.sink.url,
            template=self.template,
        )
        self.procs.append(started(argv, tmp / "alertmanager.log", env))
        argv = [
            tool("prometheus"),
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.prom_port}",
        ]
        self.procs.append(started(argv, tmp / "prometheus.log"))
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            stop_server(proc)
        self.sink.close()

    def logs(self) -> str:
        return "".join(
            (self.tmp / f"{n}.log").read_text()[-1500:] for n in ("alertmanager", "prometheus")
        )

    def delivered(self, alertname: str, timeout: float, **labels: str) -> dict:
        """The first alert ALERTNAME (with LABELS) the sink received; the test fails with
        both logs if it does not arrive within TIMEOUT seconds."""

        def arrived() -> dict | None:
            for proc, name in zip(self.procs, ("alertmanager", "prometheus"), strict=True):
                if proc.poll() is not None:
                    log = (self.tmp / f"{name}.log").read_text()[-3000:]
                    pytest.fail(f"{name} exited: {log}")
            for body in self.sink.received:
                for alert in body["alerts"]:
                    got = alert["labels"]
                    if got["alertname"] == alertname and all(
                        got.get(k) == v for k, v in labels.items()
                    ):
                        return alert
            return None

        try:
            return wait_until(arrived, timeout, 0.5, f"{alertname} at the webhook")
        except WaitTimeout as exc:
            pytest.fail(f"{exc}; received {self.sink.received}: {self.logs()}")


def shipped_config(name: str = "prometheus.yml") -> dict:
    return yaml.safe_load((PROM / name).read_text())
