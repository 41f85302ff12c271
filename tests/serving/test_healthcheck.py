"""docker/healthcheck.py, the one health probe of every image and compose file: it passes
on a server that answers, fails on one that does not, and no other probe is inline."""

from __future__ import annotations

import json
import re
import socket
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from support import ROOT
from support.processes import free_port

from arcvllm.builder import dockerfile

PROBE = ROOT / "docker" / "healthcheck.py"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
COMPOSE_FILES = (ROOT / "docker" / "compose.yaml", ROOT / "docker" / "compose.scale.yaml")


def probe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(PROBE), *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
    )


@pytest.fixture(scope="module")
def server():
    """An HTTP server: /health 200, /sick 503."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 503)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_a_server_that_answers_passes_and_one_that_does_not_fails(server):
    assert probe(f"{server}/health").returncode == 0
    assert probe(f"{server}/sick").returncode == 1
    assert probe(f"http://127.0.0.1:{free_port()}/health", "--timeout", "2").returncode == 1


def test_the_status_mode_prints_the_answer_or_zero(server):
    assert probe("--status", f"{server}/sick").stdout == "503\n"
    closed = probe("--status", f"http://127.0.0.1:{free_port()}/")
    assert (closed.returncode, closed.stdout) == (0, "0\n")


def test_the_port_comes_from_the_environment_as_a_healthcheck_gives_none(server):
    port = server.rsplit(":", 1)[1]
    url = "http://127.0.0.1:${ARCVLLM_PORT:-1}/health"
    assert probe(url, env={"ARCVLLM_PORT": port}).returncode == 0
    assert probe(url).returncode == 1  # the default, port 1: nobody


def test_the_tls_mode_passes_on_a_handshake_and_fails_without_one(tmp_path, server):
    from arcvllm.operate.single import make_secrets

    make_secrets(tmp_path / "tls")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "tls" / "cert.pem", tmp_path / "tls" / "key.pem")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def accept() -> None:
        conn, _ = listener.accept()
        with context.wrap_socket(conn, server_side=True):
            pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    gateway = probe("--tls", "127.0.0.1:${GATEWAY_PORT}", env={"GATEWAY_PORT": str(port)})
    assert gateway.returncode == 0, gateway.stderr
    thread.join(10)
    listener.close()
    plain = server.removeprefix("http://")  # a server that speaks no TLS
    assert probe("--tls", plain, "--timeout", "2").returncode == 1
    assert probe("--tls", f"127.0.0.1:{free_port()}", "--timeout", "2").returncode == 1


# ---- no other probe: every image's HEALTHCHECK and every compose healthcheck is this one ----

INLINE = re.compile(r"python3?\W+-c|urlopen|wget|curl")


def test_every_healthcheck_of_the_dockerfile_runs_the_probe_its_stage_copies_in():
    stages = dockerfile.stages(DOCKERFILE.read_text())
    checked = []
    for name, instructions in stages:
        for instruction, value in instructions:
            if instruction != "HEALTHCHECK":
                continue
            command = json.loads(value.split("CMD", 1)[1])
            assert command[0] == "arcvllm-healthcheck", (name, command)
            copies = [v for i, v in instructions if i == "COPY"]
            assert "docker/healthcheck.py /usr/local/bin/arcvllm-healthcheck" in copies, name
            checked.append(name)
    assert checked == [
        "runtime-content",
        "router-content",
        "prometheus-content",
        "alertmanager-content",
        "gateway-content",
    ]
    healthchecks = [v for _, ins in stages for i, v in ins if i == "HEALTHCHECK"]
    assert not [v for v in healthchecks if INLINE.search(v)]


@pytest.mark.parametrize("compose_file", COMPOSE_FILES, ids=lambda p: p.name)
def test_every_compose_healthcheck_runs_the_probe(compose_file):
    doc = yaml.safe_load(compose_file.read_text())
    found = [
        value["healthcheck"]["test"]
        for value in doc.values()
        if isinstance(value, dict) and "healthcheck" in value
    ]
    found += [s["healthcheck"]["test"] for s in doc["services"].values() if "healthcheck" in s]
    assert found and all(test[:2] == ["CMD", "arcvllm-healthcheck"] for test in found), found
    assert not INLINE.search(compose_file.read_text())


def test_no_module_of_the_package_carries_a_probe_of_its_own():
    for path in (ROOT / "arcvllm" / "operate").glob("*.py"):
        assert "urlopen" not in path.read_text(), path


def test_an_inline_probe_would_be_found():
    inline = "python3 -c \"import urllib.request; urllib.request.urlopen('http://x')\""
    assert INLINE.search(inline)
