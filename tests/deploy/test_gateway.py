"""The gateway (docker/Dockerfile `gateway`, deploy/gateway/, docker/gateway-entrypoint.sh):
the only published port, seen by an attacker and by an operator.

Fast tests run the entrypoint on this host to render the configuration (openssl makes the
self-signed certificate, as in the image). The deployment tests start ONE real deployment
for the module: compose's `cpu` profile (the CPU image with the tiny model) and the gateway,
the key given as a file (compose secret), under their own project; everything goes through
the published TLS port, and the project is taken down with its volumes at the end."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import ssl
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from support import ROOT
from support.compose import compose_binary
from support.docker import docker, docker_client
from support.drain import (
    DRAIN_START,
    DRAINING,
    assert_drained,
    delivery,
    drain_stream,
    nothing_in_flight,
)
from support.measured import measured
from support.processes import free_port
from support.scale import build_target, side_image

from arcvllm import options
from arcvllm.client.api import Client, WaitTimeout, wait_until

ENTRYPOINT = ROOT / "docker" / "gateway-entrypoint.sh"
TEMPLATE = ROOT / "deploy" / "gateway" / "nginx.conf.template"
ENV_TEMPLATE = ROOT / "docker" / "arcvllm.env"
ALLOWED = {"/health", "/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/embeddings"}


# ---- the entrypoint on this host: settings in, configuration out ------------------------


def entrypoint(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    key = tmp_path / "api-key"
    if not key.exists():
        key.write_text("k-render-test\n")
    return subprocess.run(
        ["bash", str(ENTRYPOINT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": "/usr/bin:/bin",
            "GATEWAY_TEMPLATE": str(TEMPLATE),
            "GATEWAY_RUN_DIR": str(tmp_path / "run"),
            "GATEWAY_TLS_DIR": str(tmp_path / "tls"),
            "GATEWAY_RESOLVER": "127.0.0.11",
            "VLLM_API_KEY_FILE": str(key),
            **env,
        },
    )


def render(tmp_path: Path, **env: str) -> str:
    done = entrypoint(tmp_path, "--render-only", **env)
    assert done.returncode == 0, done.stderr
    return (tmp_path / "run" / "nginx.conf").read_text()


def one_line_error(done: subprocess.CompletedProcess, code: int, names: str) -> None:
    assert done.returncode == code, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gateway: ") and names in lines[0], lines


def test_without_a_key_file_the_gateway_refuses_to_start_in_one_line(tmp_path):
    one_line_error(entrypoint(tmp_path, VLLM_API_KEY_FILE=""), 3, "VLLM_API_KEY_FILE")
    missing = str(tmp_path / "nowhere")
    one_line_error(entrypoint(tmp_path, VLLM_API_KEY_FILE=missing), 3, missing)
    (tmp_path / "empty").write_text("")
    empty = entrypoint(tmp_path, VLLM_API_KEY_FILE=str(tmp_path / "empty"))
    one_line_error(empty, 3, options.KEY_RULE)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("key", ['k"; default 1; #', "two words", "k$1", "k\\E.*", "k" * 257])
def test_a_key_nginx_could_read_differently_is_refused(tmp_path, key):
    (tmp_path / "api-key").write_text(key)
    one_line_error(entrypoint(tmp_path, "--render-only"), 3, "VLLM_API_KEY_FILE")


@pytest.mark.parametrize(
    "setting, value",
    [
        ("GATEWAY_RATE", "fast"),
        ("GATEWAY_BURST", "-1"),
        ("GATEWAY_CONN_PER_CLIENT", "0"),
        ("GATEWAY_MAX_BODY", "4g"),
        ("GATEWAY_UPSTREAM", "http://vllm:8000/;evil"),
        ("GATEWAY_DIAGNOSTIC_ROUTES", "yes"),
    ],
)
def test_a_bad_setting_is_one_line_naming_it_and_exit_2(tmp_path, setting, value):
    one_line_error(entrypoint(tmp_path, "--render-only", **{setting: value}), 2, setting)


def test_a_run_folder_whose_socket_path_would_not_fit_is_refused_before_nginx_starts(tmp_path):
    done = entrypoint(tmp_path, GATEWAY_RUN_DIR=str(tmp_path / ("d" * 100)))
    one_line_error(done, 2, "GATEWAY_RUN_DIR")


def test_the_rendered_config_has_every_field_filled_and_only_the_allow_list(tmp_path):
    conf = render(
        tmp_path,
        GATEWAY_UPSTREAM="http://router:8000",
        GATEWAY_RATE="7r/s",
        GATEWAY_BURST="3",
        GATEWAY_MAX_BODY="64k",
    )
    assert not re.findall(r"@[A-Z_]+@", conf)
    served = set(re.findall(r"location = (/\S*) \{", conf)) - {"/_key"}
    assert served == ALLOWED
    # each one forwarded as its own fixed URI, never the client's request target
    assert set(re.findall(r"proxy_pass \$upstream(\S*);", conf)) == ALLOWED
    assert "set $upstream http://router:8000;" in conf
    assert "rate=7r/s" in conf and "burst=3 nodelay" in conf
    assert "client_max_body_size 64k;" in conf
    assert "resolver 127.0.0.11 " in conf
    assert "proxy_buffering off;" in conf
    # the catch-all answers 404 without looking at the key
    assert re.search(r"location / \{\s*return 404;\s*\}", conf)
    assert (tmp_path / "run" / "diagnostic-routes.conf").read_text() == ""


def test_the_key_is_only_in_the_key_map_which_only_this_user_reads(tmp_path):
    conf = render(tmp_path)
    key_map = tmp_path / "run" / "key.map"
    assert "k-render-test" not in conf
    # a case-sensitive regular expression (`~`), the key quoted between \\Q and \\E
    assert key_map.read_text() == '"~^Bearer \\Qk-render-test\\E$" 1;\n'
    assert key_map.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "run").stat().st_mode & 0o077 == 0


def test_the_access_log_format_names_no_header_and_no_query_string(tmp_path):
    conf = render(tmp_path)
    log_format = conf.split("log_format gateway", 1)[1].split(";", 1)[0]
    assert "$request_method $uri" in log_format
    for leak in ("$request ", "$request_uri", "$args", "$query_string", "$http_authorization"):
        assert leak not in log_format + " ", leak


def test_diagnostic_routes_add_tokenize_and_metrics_behind_the_key(tmp_path):
    render(tmp_path, GATEWAY_DIAGNOSTIC_ROUTES="1")
    routes = (tmp_path / "run" / "diagnostic-routes.conf").read_text()
    assert set(re.findall(r"location = (/\S*) \{", routes)) == {"/tokenize", "/metrics"}
    assert set(re.findall(r"proxy_pass \$upstream(\S*);", routes)) == {"/tokenize", "/metrics"}
    assert routes.count("auth_request /_key;") == 2


def test_connections_that_do_not_move_are_closed_and_counted_per_address(tmp_path):
    conf = render(tmp_path, GATEWAY_CONN_PER_CLIENT="64")
    for directive in (
        "client_header_timeout 10s;",
        "client_body_timeout 10s;",
        "send_timeout 30s;",
        "keepalive_timeout 15s;",
        "keepalive_requests 100;",
        "reset_timedout_connection on;",
        "limit_conn conn_per_client 64;",  # stream: as the connection is accepted
        "limit_conn requests_per_client 64;",
    ):
        assert directive in conf, directive
    assert int(re.search(r"worker_connections (\d+);", conf)[1]) >= 8192


def test_tls_offers_only_forward_secret_aead_suites(tmp_path):
    conf = render(tmp_path)
    assert "ssl_protocols TLSv1.2 TLSv1.3;" in conf
    (ciphers,) = re.findall(r"ssl_ciphers (\S+);", conf)
    for suite in ciphers.split(":"):
        assert suite.startswith("ECDHE-") and ("-GCM-" in suite or "CHACHA20" in suite), suite
    assert "ssl_session_tickets off;" in conf


def test_without_a_certificate_a_self_signed_one_is_made_once_and_said_in_one_line(tmp_path):
    empty = str(ROOT / "deploy" / "gateway" / "no-certificate")  # compose's default
    first = entrypoint(tmp_path, "--render-only", GATEWAY_TLS_CERT=empty, GATEWAY_TLS_KEY=empty)
    assert first.returncode == 0, first.stderr
    said = [line for line in first.stdout.splitlines() if "self-signed" in line]
    assert len(said) == 1 and "made now" in said[0] and "Fingerprint=" in said[0]
    cert = (tmp_path / "tls" / "cert.pem").read_bytes()
    again = entrypoint(tmp_path, "--render-only")
    assert "kept from an earlier start" in again.stdout
    assert (tmp_path / "tls" / "cert.pem").read_bytes() == cert
    assert f"ssl_certificate {tmp_path}/tls/cert.pem;" in (tmp_path / "run/nginx.conf").read_text()


def names_in(cert: Path) -> tuple[str, list[str]]:
    """The certificate's subject CN and subjectAltName entries, as openssl prints them."""
    text = subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-noout", "-subject", "-ext", "subjectAltName"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    subject, _, sans = text.partition("X509v3 Subject Alternative Name:")
    return subject.split("CN = ", 1)[1].strip(), [s.strip() for s in sans.strip().split(",")]


def test_the_self_signed_certificate_names_ips_as_ip_and_names_as_dns(tmp_path):
    """Remote clients verify the name they dialled: an address must be an IP name (a DNS
    name of 192.0.2.10 matches no client), each of GATEWAY_SERVER_NAME's comma list."""
    done = entrypoint(tmp_path, "--render-only",
                      GATEWAY_SERVER_NAME="api.example.org,192.0.2.10,2001:db8::7")  # fmt: skip
    assert done.returncode == 0, done.stderr
    cn, sans = names_in(tmp_path / "tls" / "cert.pem")
    assert cn == "api.example.org"
    assert sans == [
        "DNS:api.example.org", "IP Address:192.0.2.10", "IP Address:2001:DB8:0:0:0:0:0:7",
        "DNS:localhost", "IP Address:127.0.0.1", "DNS:gateway",
    ]  # fmt: skip
    only_ip = tmp_path / "ip"
    only_ip.mkdir()
    assert entrypoint(only_ip, "--render-only", GATEWAY_SERVER_NAME="192.0.2.10").returncode == 0
    assert names_in(only_ip / "tls" / "cert.pem")[1] == [
        "IP Address:192.0.2.10", "DNS:localhost", "IP Address:127.0.0.1", "DNS:gateway",
    ]  # fmt: skip


def test_a_client_that_dialled_the_address_verifies_the_self_signed_certificate(tmp_path):
    """A real TLS handshake on another loopback address, GATEWAY_SERVER_NAME=127.0.0.2: a
    verifying client (Python's ssl, the certificate as its CA) accepts it by that address."""
    done = entrypoint(tmp_path, "--render-only", GATEWAY_SERVER_NAME="127.0.0.2")
    assert done.returncode == 0, done.stderr
    tls = tmp_path / "tls"
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(tls / "cert.pem", tls / "key.pem")
    client_side = ssl.create_default_context(cafile=str(tls / "cert.pem"))
    with socket.create_server(("127.0.0.2", 0)) as listener:
        port = listener.getsockname()[1]
        with ThreadPoolExecutor(1) as pool:

            def accept() -> None:
                conn, _ = listener.accept()
                with contextlib.suppress(OSError), server_side.wrap_socket(conn, server_side=True):
                    pass

            accepted = pool.submit(accept)
            with (
                socket.create_connection(("127.0.0.2", port), timeout=10) as raw,
                client_side.wrap_socket(raw, server_hostname="127.0.0.2") as verified,
            ):
                assert verified.version()
            accepted.result(timeout=10)


def test_a_kept_certificate_is_made_anew_when_the_names_change(tmp_path):
    first = entrypoint(tmp_path, "--render-only")
    assert "made now" in first.stdout
    assert names_in(tmp_path / "tls" / "cert.pem")[1] == [
        "DNS:localhost", "IP Address:127.0.0.1", "DNS:gateway",
    ]  # fmt: skip
    changed = entrypoint(tmp_path, "--render-only", GATEWAY_SERVER_NAME="192.0.2.10")
    assert changed.returncode == 0, changed.stderr
    (said,) = [line for line in changed.stdout.splitlines() if "self-signed" in line]
    assert "made now" in said and "its names changed" in said
    assert "IP Address:192.0.2.10" in names_in(tmp_path / "tls" / "cert.pem")[1]
    cert = (tmp_path / "tls" / "cert.pem").read_bytes()
    same = entrypoint(tmp_path, "--render-only", GATEWAY_SERVER_NAME="192.0.2.10")
    assert "kept from an earlier start" in same.stdout
    assert (tmp_path / "tls" / "cert.pem").read_bytes() == cert


@pytest.mark.parametrize(
    "value", ["api example.org", "a,,b", "-bad.example", "192.0.2.300", "a/b", ",localhost"]
)
def test_a_server_name_that_no_certificate_can_carry_is_one_line(tmp_path, value):
    one_line_error(
        entrypoint(tmp_path, "--render-only", GATEWAY_SERVER_NAME=value), 2, "GATEWAY_SERVER_NAME"
    )
    assert not (tmp_path / "tls").exists()


def test_the_settings_file_sets_the_gateways_server_name():
    from arcvllm.operate.settings import load

    assert load(ROOT / "docker" / "arcvllm.env")["GATEWAY_SERVER_NAME"] == "localhost"


def test_the_operators_certificate_is_used_and_half_of_one_is_refused(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"),
            *("-nodes", "-days", "1", "-subj", "/CN=api.example.org"),
            *("-keyout", str(mine / "key.pem"), "-out", str(mine / "cert.pem")),
        ],
        check=True,
        capture_output=True,
    )
    given = {"GATEWAY_TLS_CERT": str(mine / "cert.pem"), "GATEWAY_TLS_KEY": str(mine / "key.pem")}
    done = entrypoint(tmp_path, "--render-only", **given)
    assert done.returncode == 0, done.stderr
    assert "api.example.org" in done.stdout and "self-signed" not in done.stdout
    conf = (tmp_path / "run" / "nginx.conf").read_text()
    assert f"ssl_certificate {mine}/cert.pem;" in conf
    assert not (tmp_path / "tls").exists()
    half = entrypoint(tmp_path, "--render-only", GATEWAY_TLS_CERT=given["GATEWAY_TLS_CERT"])
    one_line_error(half, 2, "GATEWAY_TLS_KEY")
    gone = entrypoint(tmp_path, "--render-only", GATEWAY_TLS_CERT=str(mine / "nope.pem"))
    one_line_error(gone, 3, "GATEWAY_TLS_CERT")


@pytest.mark.compose
@pytest.mark.parametrize("bind", ["127.0.0.1", "0.0.0.0"])
def test_in_every_profile_only_the_gateway_publishes_a_port(bind):
    """Issue 20, item 7: the monitoring profile published Prometheus and the alertmanager
    (whose API adds silences) without authentication. The router and vLLM never did."""
    from support.scale import ports, services

    profiles = ("cpu", "monitoring", "scale", "cpu-scale")
    published = {
        name: ports(service)
        for name, service in services(*profiles, env={"BIND_ADDRESS": bind}).items()
        if ports(service)
    }
    assert published == {"gateway": [(bind, 8443, 8443)]}


# ---- one real deployment: vllm-cpu and the gateway, through the published port ----------

PROJECT = os.environ.get("ARCVLLM_TEST_GATEWAY_PROJECT", "arcvllm-gw-test")
PORT = int(os.environ.get("ARCVLLM_TEST_GATEWAY_PORT", "18443"))
GATEWAY_IMAGE = os.environ.get("ARCVLLM_TEST_GATEWAY_IMAGE") or side_image("gateway")
MAX_BODY_BYTES = 64 * 1024
RATE, BURST = 20, 20
MODEL = "tiny-hybrid"
# The engine's pause after each model step (tests/support/pace): the tiny model's step
# takes a few ms, so the drain test's stream lasts its 10 s at ~20 tokens a second.
PACE_MS = "40"
PACE_MOUNT = "/opt/arcvllm-pace"
MEASURED: dict[str, float | str] = {}

# Paths vLLM (or its router) serves without a key, and paths nobody should reach.
CLOSED = [
    ("POST", "/invocations"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("GET", "/docs"),
    ("GET", "/openapi.json"),
    ("GET", "/metrics"),
    ("GET", "/load"),
    ("POST", "/scale_elastic_ep"),
    ("POST", "/add_worker"),
    ("POST", "/remove_worker"),
    ("POST", "/flush_cache"),
    ("GET", "/workers"),
    ("POST", "/v1/completions/render"),
    ("GET", "/v1/no-such-route"),
    ("GET", "/no-such-path"),
]
BODY = {"model": MODEL, "prompt": "block state", "max_tokens": 4, "temperature": 0}


@dataclass
class Gateway:
    url: str
    key: str
    ca_cert: Path
    compose: list[str]
    env: dict[str, str]

    def container(self, service: str) -> str:
        done = subprocess.run(
            [*self.compose, "ps", "-a", "-q", service],  # -a: a stopped one too (compose v2)
            capture_output=True,
            text=True,
            timeout=60,
            env=self.env,
        )
        return done.stdout.strip()

    def request(self, method: str, path: str, key: str | None = None, **kw) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.request(
            method,
            f"{self.url}{path}",
            headers=headers,
            verify=ssl.create_default_context(cafile=str(self.ca_cert)),
            timeout=120,
            **kw,
        )

    def logs(self, service: str = "gateway") -> str:
        done = docker("logs", self.container(service), timeout=60)
        return done.stdout + done.stderr


@pytest.fixture(scope="module")
def gateway(cpu_image, tmp_path_factory):
    start = time.monotonic()
    build_target("gateway", GATEWAY_IMAGE)
    MEASURED["gateway_build_s"] = round(time.monotonic() - start, 1)
    folder = tmp_path_factory.mktemp("gateway")  # 0700: only this user reaches the files
    key = secrets.token_hex(32)  # as docs/gateway.md makes one: openssl rand -hex 32
    key_file = folder / "api-key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o644)  # the containers' UID 1000 reads the bind-mounted file
    settings = folder / "mine.env"
    text = ENV_TEMPLATE.read_text().replace("\nSHM_SIZE=16g\n", "\nSHM_SIZE=1g\n")
    settings.write_text(
        re.sub(r"\nVLLM_API_KEY_FILE=.*\n", f"\nVLLM_API_KEY_FILE={key_file}\n", text)
    )
    env = {
        **os.environ,
        "ENV_FILE": str(settings),
        "IMAGE": cpu_image,
        "GATEWAY_IMAGE": GATEWAY_IMAGE,
        "PORT": str(PORT),
        "GATEWAY_RATE": f"{RATE}r/s",
        "GATEWAY_BURST": str(BURST),
        "GATEWAY_MAX_BODY": f"{MAX_BODY_BYTES // 1024}k",
    }
    # The server paced for the drain test (tests/support/pace): on two loaded cores vLLM's
    # engine busy-waits beside its API process, which then takes a stop only after a short
    # stream's last token. Paced, the stop lands while the engine generates, by its own log.
    pace = folder / "pace.yaml"
    pace.write_text(
        yaml.safe_dump(
            {
                "services": {
                    "vllm-cpu": {
                        "environment": {"PYTHONPATH": PACE_MOUNT, "ARCVLLM_PACE_MS": PACE_MS},
                        "volumes": [f"{ROOT / 'tests' / 'support' / 'pace'}:{PACE_MOUNT}:ro"],
                    }
                }
            }
        )
    )
    compose = [
        *compose_binary(),
        "-p",
        PROJECT,
        "--env-file",
        str(settings),
        "-f",
        str(ROOT / "docker" / "compose.yaml"),
        "-f",
        str(pace),
        "--profile",
        "cpu",
    ]

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*compose, *args], capture_output=True, text=True, timeout=timeout, env=env
        )

    run("down", "-v", "--remove-orphans")  # a previous run's leftovers, by project name
    up_at = time.monotonic()
    try:
        up = run("up", "-d", "vllm-cpu", "gateway")
        assert up.returncode == 0, up.stderr[-3000:]
        gw = Gateway(f"https://127.0.0.1:{PORT}", key, folder / "ca.pem", compose, env)
        cid = gw.container("gateway")
        cert = "/var/lib/arcvllm-gateway/tls/cert.pem"

        def cert_ready() -> bool:
            return docker("exec", cid, "test", "-s", cert, check=False).returncode == 0

        wait_until(cert_ready, 60, 0.5, "the gateway's self-signed certificate")
        gw.ca_cert.write_text(docker("exec", cid, "cat", cert).stdout)
        try:
            Client(gw.url, key, ca_cert=str(gw.ca_cert)).wait_healthy(600, interval=2)
        except WaitTimeout as exc:
            pytest.fail(f"{exc}\n{run('logs', '--tail=40').stdout[-4000:]}")
        MEASURED["healthy_s"] = round(time.monotonic() - up_at, 1)
        yield gw
    finally:
        down = run("down", "-v", "--remove-orphans", "-t", "20")
        MEASURED["module_s"] = round(time.monotonic() - start, 1)
        measured(f"gateway measurements: {json.dumps(MEASURED)}")
        assert down.returncode == 0, down.stderr[-2000:]


@pytest.mark.parametrize("method, path", CLOSED, ids=[p for _, p in CLOSED])
@pytest.mark.docker
@pytest.mark.compose
def test_every_unlisted_path_is_404_without_with_a_wrong_and_with_the_right_key(
    gateway, method, path
):
    answers = {
        who: gateway.request(method, path, key, json={})
        for who, key in (("none", None), ("wrong", "k-wrong"), ("right", gateway.key))
    }
    assert {who: r.status_code for who, r in answers.items()} == dict.fromkeys(answers, 404)
    # the same answer whatever the key: an unlisted path says nothing about it
    assert len({r.content for r in answers.values()}) == 1
    assert "www-authenticate" not in answers["none"].headers


@pytest.mark.docker
@pytest.mark.compose
def test_behind_the_gateway_vllm_does_serve_invocations_without_a_key(gateway):
    """The sibling of the 404s: inside the compose network the server does answer the
    paths the gateway closes (so the 404s are the gateway's doing)."""
    code = (
        "import json, urllib.request, urllib.error\n"
        "req = urllib.request.Request('http://127.0.0.1:8000/invocations', method='POST',\n"
        f"    data=json.dumps({BODY!r}).encode(), headers={{'Content-Type': 'application/json'}})\n"
        "print(urllib.request.urlopen(req, timeout=120).status)\n"
    )
    done = docker("exec", gateway.container("vllm-cpu"), "python3", "-c", code, timeout=180)
    assert done.stdout.strip() == "200"


@pytest.mark.docker
@pytest.mark.compose
def test_vllm_behind_the_gateway_checks_the_same_key_itself(gateway):
    """Defence in depth: the image's entrypoint read the key file into vLLM's --api-key."""
    code = (
        "import sys, urllib.request, urllib.error\n"
        "def get(key):\n"
        "    headers = {'Authorization': 'Bearer ' + key} if key else {}\n"
        "    req = urllib.request.Request('http://127.0.0.1:8000/v1/models', headers=headers)\n"
        "    try:\n        return urllib.request.urlopen(req, timeout=30).status\n"
        "    except urllib.error.HTTPError as e:\n        return e.code\n"
        "print(get(''), get(open('/run/secrets/api-key').read().strip()))\n"
    )
    done = docker("exec", gateway.container("vllm-cpu"), "python3", "-c", code, timeout=120)
    assert done.stdout.split() == ["401", "200"]
    env = docker("inspect", "-f", "{{json .Config.Env}}", gateway.container("vllm-cpu"))
    assert gateway.key not in env.stdout  # only the file's path is in the container's config


@pytest.mark.docker
@pytest.mark.compose
@pytest.mark.parametrize("method, path", [("GET", "/v1/models"), ("POST", "/v1/completions")])
def test_the_api_needs_the_key(gateway, method, path):
    body = {"json": BODY} if method == "POST" else {}
    assert gateway.request(method, path, None, **body).status_code == 401
    wrong = gateway.request(method, path, "k-wrong", **body)
    assert wrong.status_code == 401
    assert gateway.request(method, path, f"{gateway.key}x", **body).status_code == 401
    right = gateway.request(method, path, gateway.key, **body)
    assert right.status_code == 200, right.text[:500]


@pytest.mark.docker
@pytest.mark.compose
def test_a_real_streamed_completion_passes_through(gateway):
    client = Client(gateway.url, gateway.key, timeout=120, ca_cert=str(gateway.ca_cert))
    assert [m["id"] for m in client.models()] == [MODEL]
    stream = client.stream(MODEL, "The state of each block", 12)
    assert stream.completion_tokens == 12
    assert len(stream.chunks) > 1  # chunk by chunk, not one buffered answer


@pytest.mark.docker
@pytest.mark.compose
def test_chat_completions_is_routed_with_the_key(gateway):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert gateway.request("POST", "/v1/chat/completions", None, json=chat).status_code == 401
    # 200, or vLLM's own 400 if the tiny model has no chat template: routed either way
    assert gateway.request("POST", "/v1/chat/completions", gateway.key, json=chat).status_code in (
        200,
        400,
    )


@pytest.mark.docker
@pytest.mark.compose
def test_health_needs_no_key(gateway):
    assert gateway.request("GET", "/health").status_code == 200


@pytest.mark.docker
@pytest.mark.compose
def test_a_body_over_the_limit_is_413(gateway):
    big = {**BODY, "prompt": "x" * (MAX_BODY_BYTES + 1024)}
    assert gateway.request("POST", "/v1/completions", gateway.key, json=big).status_code == 413
    small = {**BODY, "prompt": "x " * 100}
    assert gateway.request("POST", "/v1/completions", gateway.key, json=small).status_code == 200


@pytest.mark.docker
@pytest.mark.compose
def test_the_access_log_never_holds_the_key(gateway):
    marker = f"q-{secrets.token_hex(6)}"
    assert gateway.request("GET", f"/v1/models?api_key={marker}", gateway.key).status_code == 400
    gateway.request("GET", "/v1/models", "k-guess-in-log")
    log = gateway.logs()
    assert '"GET /v1/models HTTP/1.1" 400' in log  # the log is there ...
    assert gateway.key not in log and marker not in log and "k-guess-in-log" not in log


@pytest.mark.docker
@pytest.mark.compose
def test_plain_http_to_the_tls_port_gets_no_answer(gateway):
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{PORT}/health", timeout=10)


@pytest.mark.docker
@pytest.mark.compose
def test_an_untrusted_certificate_is_refused_by_a_verifying_client(gateway):
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{gateway.url}/health", timeout=10)


@pytest.mark.docker
@pytest.mark.compose
def test_only_the_gateway_publishes_a_host_port(gateway):
    assert docker("port", gateway.container("vllm-cpu")).stdout.strip() == ""
    published = docker("port", gateway.container("gateway")).stdout.strip().splitlines()
    assert published == [f"8443/tcp -> 127.0.0.1:{PORT}"]


@pytest.mark.docker
@pytest.mark.compose
def test_the_self_signed_certificate_is_said_in_one_line(gateway):
    said = [line for line in gateway.logs().splitlines() if "self-signed" in line]
    assert len(said) == 1 and "GATEWAY_TLS_CERT" in said[0], said


@pytest.mark.docker
@pytest.mark.compose
def test_a_burst_over_the_rate_gets_some_429(gateway):
    """Last: it spends the bucket. 4 x (rate + burst) requests at once, loopback only."""
    count = 4 * (RATE + BURST)
    # One pool of kept-alive TLS connections: the requests come as fast as loopback allows,
    # not at the pace of a handshake each (the machine may be busy with other tests).
    verify = ssl.create_default_context(cafile=str(gateway.ca_cert))
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    with (
        httpx.Client(verify=verify, timeout=60, limits=limits) as client,
        ThreadPoolExecutor(max_workers=32) as pool,
    ):
        codes = list(
            pool.map(lambda _: client.get(f"{gateway.url}/health").status_code, range(count))
        )
    assert set(codes) <= {200, 429}, codes
    assert codes.count(429) >= count // 4, codes
    assert codes.count(200) >= BURST
    time.sleep((RATE + BURST) / RATE)
    assert gateway.request("GET", "/health").status_code == 200  # the bucket refills


@pytest.mark.docker
@pytest.mark.compose
def test_a_stream_in_flight_across_compose_stop_completes_with_all_its_tokens(gateway):
    """Last: it stops the deployment, server and gateway at once, as `docker compose stop`
    does. vLLM's default (--shutdown-timeout 0) would abort what runs and nginx's SIGTERM
    would cut it: the preset's 30 s drain and the gateway's SIGQUIT let it finish. That the
    stop came mid-stream is the server's word (its drain line), not this client's clock;
    where the server says the stop found nothing in flight, the run is repeated once."""

    def compose(action: str) -> None:
        done = subprocess.run(
            [*gateway.compose, action],
            capture_output=True, text=True, timeout=300, env=gateway.env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]

    def stop() -> None:
        compose("stop")

    verify = ssl.create_default_context(cafile=str(gateway.ca_cert))
    seen = drain_stream(gateway.url, MODEL, gateway.key, verify, stop)
    log = gateway.logs("vllm-cpu")
    if nothing_in_flight(seen, log):
        # The server says the stop came after the stream was generated (its API process got
        # no CPU to take the SIGTERM sooner): once more, from a start of the same containers.
        MEASURED["drain_repeated"] = True
        compose("start")
        Client(gateway.url, gateway.key, ca_cert=str(gateway.ca_cert)).wait_healthy(600, 2)
        seen = drain_stream(gateway.url, MODEL, gateway.key, verify, stop)
        log = gateway.logs("vllm-cpu")
    assert "arcvllm pace: the engine sleeps" in log, "the server was not paced"
    assert_drained(seen, log)
    MEASURED["drain_stream_left_at_stop_s"] = round(seen["stream_end"] - seen["stop_asked"], 1)
    MEASURED["drain_stream_tokens"] = seen["tokens"]
    MEASURED["drain_stream_delivery"] = delivery(seen)
    for service in ("vllm-cpu", "gateway"):
        state = docker("inspect", "-f", "{{.State.Status}}", gateway.container(service)).stdout
        assert state.strip() == "exited", service


def test_the_drain_verdict_is_the_servers_word_not_this_clients_clock():
    """Issue 33, item 15: CI's stream through the gateway arrived late and bunched (5 chunks
    6.5 s after the request, the other 1996 within 0.1 s), so the stop, asked after the
    fifth chunk, came 0.1 s before the stream's end by this client's clock, and the test
    failed although the server had drained. Measured here under load: 2001 chunks over
    8.2 s, 89% of them < 1 ms apart, through a gateway that passes paced events as they
    come (test_a_stream_passes_the_gateway_event_by_event...): the server side, loaded,
    sends in bursts. Whether the stop came mid-generation is what the server logged."""
    start = 100.0
    seen = {
        "tokens": 2000, "chunks": 2001, "finish": "length",
        "usage": {"completion_tokens": 2000}, "stream_start": start,
        "stop_asked": start + 6.5, "stream_end": start + 6.6, "stop_done": start + 21.0,
        "arrivals": [6.5] * 5 + [6.5 + i * 0.1 / 1996 for i in range(1, 1997)],
    }  # fmt: skip
    drained = "(EngineCore pid=7) INFO [core.py:1655] " + DRAINING + "1 timeout=30s\n"
    assert_drained(seen, server_log="INFO started\n" + drained)
    with pytest.raises(AssertionError, match="the stop found nothing being generated"):
        assert_drained(seen, server_log="INFO started\n[shutdown] EngineCore: start mode=drain\n")
    assert delivery(seen).startswith("2001 chunks from 6.50 s to 6.60 s, 100% < 1 ms")
    # A stop the engine took with nothing in flight, every token delivered: a run to repeat;
    # not a drain that logged its count, nor a cut stream, nor an abort.
    late = "INFO started\n" + DRAIN_START + " timeout=30s\n"
    assert nothing_in_flight(seen, late)
    assert not nothing_in_flight(seen, late + drained)
    assert not nothing_in_flight({**seen, "stream_cut": "ReadError()"}, late)
    assert not nothing_in_flight({**seen, "usage": {"completion_tokens": 1999}}, late)
    aborted = "[shutdown] EngineCore: start mode=abort timeout=0s\n"
    assert not nothing_in_flight(seen, aborted)


# ---- the gateway attacked: its image, a recording stand-in behind it ----------------------
# No vLLM: a stand-in server records every request the gateway forwards (method, target,
# headers) on its stdout and answers 200, so each attack shows what would have reached the
# server. The gateway has an RSA certificate (the operator's kind that allowed suites
# without forward secrecy) and a mixed-case key; its own network, loopback port.

ATTACK_KEY = "k-MixedCase." + secrets.token_urlsafe(24)
ATTACK_MAX_BODY = 64 * 1024
CONN_PER_CLIENT = 256  # the default of GATEWAY_CONN_PER_CLIENT
FIXED_URIS = ALLOWED  # what the server behind may ever see
RECORDER = r"""
import http.server, json, time
class Recorder(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self):
        seen = {"method": self.command, "target": self.path, "headers": dict(self.headers)}
        print(json.dumps(seen), flush=True)
        if self.headers.get("X-Recorder-Drop"):
            self.close_connection = True  # no answer: the gateway's upstream-failure line
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if self.headers.get("X-Recorder-Stream"):  # "EVENTS,SECONDS": server-sent events,
            self.stream(*self.headers["X-Recorder-Stream"].split(","))  # as vLLM streams
            return
        body = b'{"object": "list", "data": []}\n'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def stream(self, events, every):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(int(events)):
            data = b'data: {"event": %d}\n\n' % i
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            time.sleep(float(every))
        self.wfile.write(b"0\r\n\r\n")
    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = answer
    def do_HEAD(self):
        seen = {"method": "HEAD", "target": self.path, "headers": dict(self.headers)}
        print(json.dumps(seen), flush=True)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), Recorder).serve_forever()
"""


@dataclass
class Attacked:
    port: int
    ca_cert: Path
    gateway: str  # container ids
    recorder: str
    buffering_port: int  # a gateway whose template buffers (proxy_buffering on): a sibling

    def tls(self, **kw) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        for name, value in kw.items():
            setattr(context, name, value)
        return context

    @contextlib.contextmanager
    def connect(
        self, context: ssl.SSLContext | None = None, timeout: float = 30, port: int | None = None
    ):
        """A TLS connection to the published port (or PORT), as a client of this host."""
        with (
            socket.create_connection(("127.0.0.1", port or self.port), timeout=timeout) as sock,
            (context or self.tls()).wrap_socket(sock, server_hostname="localhost") as conn,
        ):
            yield conn

    def send(
        self,
        method: str,
        target: str,
        headers: dict[str, str] | None = None,
        body: bytes = b"",
        key: str | None = None,
    ) -> tuple[int, bytes]:
        """One request as these exact bytes (no client library normalises the target)."""
        lines = [f"{method} {target} HTTP/1.1", "Host: localhost", "Connection: close"]
        if key is not None:
            lines.append(f"Authorization: {key}")
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        if body and not any(n.lower() == "transfer-encoding" for n in headers or {}):
            lines.append(f"Content-Length: {len(body)}")
        raw = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
        answer = b""
        with self.connect() as conn:
            conn.sendall(raw)
            try:
                while chunk := conn.recv(65536):
                    answer += chunk
            except (ssl.SSLEOFError, ConnectionResetError):
                pass
        return int(answer.split(b" ", 2)[1]), answer

    def events(self, events: int, every: float, port: int | None = None) -> list[float]:
        """A streamed completion of EVENTS server-sent events, one every EVERY seconds at the
        stand-in: when each arrived here (seconds after the request), read off the TLS
        socket as the bytes come (no client library between)."""
        raw = (
            "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
            f"Authorization: Bearer {ATTACK_KEY}\r\nX-Recorder-Stream: {events},{every}\r\n"
            "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        ).encode()
        arrived: list[float] = []
        with self.connect(port=port) as conn:
            start = time.monotonic()
            conn.sendall(raw)
            with contextlib.suppress(ssl.SSLEOFError, ConnectionResetError):
                while chunk := conn.recv(65536):
                    arrived += [time.monotonic() - start] * chunk.count(b"data: ")
        return arrived

    def recorded(self) -> list[dict]:
        out = docker("logs", self.recorder, timeout=60).stdout
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    def recorded_after(self, before: int) -> list[dict]:
        time.sleep(0.5)  # the stand-in's stdout reaches docker logs
        return self.recorded()[before:]

    def logs(self) -> str:
        done = docker("logs", self.gateway, timeout=60)
        return done.stdout + done.stderr


@pytest.fixture(scope="module")
def attacked(engine, tmp_path_factory):
    build_target("gateway", GATEWAY_IMAGE)
    folder = tmp_path_factory.mktemp("attacked")
    key_file = folder / "api-key"
    key_file.write_text(ATTACK_KEY + "\n")
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
            *("-keyout", str(folder / "key.pem"), "-out", str(folder / "cert.pem")),
        ],
        check=True,
        capture_output=True,
    )
    for path in (key_file, folder / "key.pem", folder / "cert.pem"):
        path.chmod(0o644)  # the containers' UID 1000 reads the bind-mounted files
    name = f"arcvllm-gw-attack-{secrets.token_hex(4)}"
    port = free_port()
    docker("network", "create", name)
    try:
        recorder = docker(
            "run", "-d", "--name", f"{name}-recorder", "--network", name,
            "--network-alias", "recorder", "--read-only", "--cap-drop", "ALL",
            "--entrypoint", "python3", GATEWAY_IMAGE, "-c", RECORDER,
        ).stdout.strip()  # fmt: skip
        gateway = docker(
            "run", "-d", "--name", f"{name}-gateway", "--network", name,
            "--network-alias", "gateway",
            "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges:true", "-p", f"127.0.0.1:{port}:8443",
            "-v", f"{key_file}:/run/secrets/api-key:ro",
            "-v", f"{folder / 'cert.pem'}:/run/secrets/tls-cert:ro",
            "-v", f"{folder / 'key.pem'}:/run/secrets/tls-key:ro",
            "-e", "VLLM_API_KEY_FILE=/run/secrets/api-key",
            "-e", "GATEWAY_TLS_CERT=/run/secrets/tls-cert",
            "-e", "GATEWAY_TLS_KEY=/run/secrets/tls-key",
            "-e", "GATEWAY_UPSTREAM=http://recorder:8000",
            # the rate limit is the deployment tests' subject: out of these attacks' way
            "-e", "GATEWAY_RATE=1000r/s", "-e", "GATEWAY_BURST=1000",
            "-e", f"GATEWAY_MAX_BODY={ATTACK_MAX_BODY // 1024}k",
            GATEWAY_IMAGE,
        ).stdout.strip()  # fmt: skip
        # The sibling of the streaming test: the same gateway, its template buffering.
        template = folder / "buffering.conf.template"
        template.write_text(
            TEMPLATE.read_text().replace("proxy_buffering off;", "proxy_buffering on;", 1)
        )
        template.chmod(0o644)
        buffering_port = free_port()
        docker(
            "run", "-d", "--name", f"{name}-buffering", "--network", name,
            "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL",
            "-p", f"127.0.0.1:{buffering_port}:8443",
            "-v", f"{key_file}:/run/secrets/api-key:ro",
            "-v", f"{folder / 'cert.pem'}:/run/secrets/tls-cert:ro",
            "-v", f"{folder / 'key.pem'}:/run/secrets/tls-key:ro",
            "-v", f"{template}:/etc/arcvllm/gateway/nginx.conf.template:ro",
            "-e", "VLLM_API_KEY_FILE=/run/secrets/api-key",
            "-e", "GATEWAY_TLS_CERT=/run/secrets/tls-cert",
            "-e", "GATEWAY_TLS_KEY=/run/secrets/tls-key",
            "-e", "GATEWAY_UPSTREAM=http://recorder:8000",
            GATEWAY_IMAGE,
        )  # fmt: skip
        attacked = Attacked(port, folder / "cert.pem", gateway, recorder, buffering_port)

        def health() -> bool:
            try:
                return attacked.send("GET", "/health")[0] == 200
            except (OSError, IndexError, ValueError):
                return False

        def buffering_health() -> bool:
            with contextlib.suppress(OSError, ssl.SSLError), attacked.connect(port=buffering_port):
                return True
            return False

        try:
            wait_until(health, 60, 0.5, "the attacked gateway's /health")
            wait_until(buffering_health, 60, 0.5, "the buffering gateway's TLS port")
        except WaitTimeout as exc:
            pytest.fail(f"{exc}\n{attacked.logs()[-3000:]}")
        yield attacked
    finally:
        for container in (f"{name}-gateway", f"{name}-buffering", f"{name}-recorder"):
            docker("rm", "-f", "-v", container, check=False, timeout=60)
        docker("network", "rm", name, check=False, timeout=60)


STREAM_EVENTS, STREAM_EVERY = 40, 0.05  # 2 s of server-sent events, paced by the stand-in


def held_back(arrived: list[float], which: str) -> bool:
    """The events arrived in bulk (bench's own measure: most of them less than 1 ms after
    the one before), or the first came after half of the stand-in's pacing had passed."""
    from arcvllm.bench.measurements import BULK_SHARE, bulk_share
    from arcvllm.client.api import Chunk, Stream

    paced = (STREAM_EVENTS - 1) * STREAM_EVERY
    late = arrived[0] > arrived[-1] - paced / 2
    share = bulk_share(Stream(0, [Chunk(1, at) for at in arrived]))
    measured(
        f"{which}: {STREAM_EVENTS} events paced over {paced:.2f} s arrived from "
        f"{arrived[0]:.3f} s to {arrived[-1]:.3f} s, {share:.0%} of them < 1 ms apart"
    )
    return late or share >= BULK_SHARE


@pytest.mark.docker
def test_a_stream_passes_the_gateway_event_by_event_as_the_server_sends_it(attacked):
    """Issue 33, item 15: a streamed completion arrived all at once in a CI run. The gateway
    does not hold server-sent events back (proxy_buffering off, no gzip, no wait for a
    full TLS record): each event reaches the client as the server behind sends it."""
    arrived = attacked.events(STREAM_EVENTS, STREAM_EVERY)
    assert len(arrived) == STREAM_EVENTS
    assert not held_back(arrived, "the gateway's stream"), [round(a, 3) for a in arrived]


@pytest.mark.docker
def test_a_gateway_that_buffers_the_stream_is_caught_holding_it_back(attacked):
    """The sibling: the same gateway with `proxy_buffering on` in its template delivers the
    same events in bulk, and the check above says so."""
    arrived = attacked.events(STREAM_EVENTS, STREAM_EVERY, port=attacked.buffering_port)
    assert len(arrived) == STREAM_EVENTS
    assert held_back(arrived, "a buffering gateway's stream"), [round(a, 3) for a in arrived]


@pytest.mark.docker
def test_attack_the_server_behind_sees_only_the_fixed_uri_of_each_allowed_path(attacked):
    """Item 2 of issue 20: nginx matched the normalised path but forwarded the client's
    bytes (`/invocations/../health` reached vLLM as it was sent)."""
    before = len(attacked.recorded())
    keyless = ["/invocations/../health", "/invocations%2f..%2fhealth", "/%2e/health", "//health"]
    keyed = ["/x/../v1/models", "/v1%2fmodels", "/v1/./models", "//v1//models"]
    for target in keyless:
        assert attacked.send("GET", target)[0] == 200, target
    for target in keyed:
        assert attacked.send("GET", target, key=f"Bearer {ATTACK_KEY}")[0] == 200, target
    for target in ("/health/../invocations", "/v1/models/../../tokenize", "/v1%2f..%2fload"):
        assert attacked.send("GET", target, key=f"Bearer {ATTACK_KEY}")[0] == 404, target
    seen = [r["target"] for r in attacked.recorded_after(before)]
    assert seen == ["/health"] * len(keyless) + ["/v1/models"] * len(keyed)
    assert set(seen) <= FIXED_URIS


@pytest.mark.docker
def test_attack_the_key_is_compared_with_its_case(attacked):
    """Item 3: nginx's map compares strings ignoring case; `bearer <key lower-cased>`
    passed."""
    before = len(attacked.recorded())
    for header in (
        f"bearer {ATTACK_KEY.lower()}",
        f"Bearer {ATTACK_KEY.lower()}",
        f"Bearer {ATTACK_KEY.upper()}",
        f"BEARER {ATTACK_KEY}",
        f"bearer {ATTACK_KEY}",
        f"Bearer {ATTACK_KEY}x",
        f"Bearer  {ATTACK_KEY}",
    ):
        for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions")):
            code, answer = attacked.send(method, path, key=header, body=b"{}")
            assert code == 401 and b"WWW-Authenticate: Bearer" in answer, (header, code)
    assert attacked.recorded_after(before) == []
    assert attacked.send("GET", "/v1/models", key=f"Bearer {ATTACK_KEY}")[0] == 200


@pytest.mark.docker
def test_attack_no_key_in_a_query_string_reaches_any_log(attacked):
    """Item 4: a key in a query string reached nginx's error lines (the 413, limit and
    upstream-failure lines quote the request line and the upstream URL)."""
    before = len(attacked.recorded())
    marks = [f"q-{secrets.token_hex(6)}" for _ in range(4)]
    key = f"Bearer {ATTACK_KEY}"
    over = b"x" * (ATTACK_MAX_BODY + 1024)
    asked = [
        ("GET", f"/v1/models?api_key={marks[0]}", {}, b""),
        ("POST", f"/v1/completions?api_key={marks[1]}", {}, over),  # the 413 line
        ("GET", f"/v1/models?api_key={marks[2]}", {"X-Recorder-Drop": "1"}, b""),  # upstream
        ("GET", f"/health?api_key={marks[3]}", {}, b""),
    ]
    for method, target, headers, body in asked:
        code, answer = attacked.send(method, target, headers, body, key=key)
        assert code == 400 and b"no query string" in answer, (target, code)
    assert attacked.recorded_after(before) == []
    # the sibling: an upstream failure without a query string is logged, with the fixed URI
    assert attacked.send("GET", "/v1/models", {"X-Recorder-Drop": "1"}, key=key)[0] == 502
    time.sleep(0.5)
    log = attacked.logs()
    assert "upstream prematurely closed connection" in log
    for mark in marks:
        assert mark not in log
    assert ATTACK_KEY not in log and ATTACK_KEY.lower() not in log


@pytest.mark.docker
def test_attack_health_takes_only_get_or_head_without_a_body_and_its_own_forwarded_headers(
    attacked,
):
    """Item 5: /health took any method and a 4 MiB keyless body, and passed the client's
    X-Forwarded-* through."""
    before = len(attacked.recorded())
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
        code, answer = attacked.send(method, "/health", body=b"x" * 1024)
        assert code == 405 and b"Allow: GET, HEAD" in answer, method
    assert attacked.send("GET", "/health", body=b"x" * 1024)[0] == 400
    chunked = {"Transfer-Encoding": "chunked"}
    assert attacked.send("GET", "/health", chunked, b"400\r\n" + b"x" * 1024 + b"\r\n0\r\n\r\n")[
        0
    ] in (400, 411)
    assert attacked.send("POST", "/health", body=b"x" * (4 * 1024 * 1024))[0] in (405, 413)
    assert attacked.recorded_after(before) == []
    forged = {
        "X-Forwarded-For": "6.6.6.6",
        "X-Forwarded-Proto": "http",
        "X-Forwarded-Host": "evil.example",
        "X-Forwarded-Port": "80",
        "X-Real-IP": "6.6.6.6",
        "Forwarded": "for=6.6.6.6;proto=http",
    }
    assert attacked.send("HEAD", "/health", forged)[0] == 200
    assert attacked.send("GET", "/health", forged, key=f"Bearer {ATTACK_KEY}")[0] == 200
    assert attacked.send("GET", "/v1/models", forged, key=f"Bearer {ATTACK_KEY}")[0] == 200
    seen = attacked.recorded_after(before)
    assert [(r["method"], r["target"]) for r in seen] == [
        ("HEAD", "/health"),
        ("GET", "/health"),
        ("GET", "/v1/models"),
    ]
    for request in seen:
        headers = {name.lower(): value for name, value in request["headers"].items()}
        assert "6.6.6.6" not in headers["x-forwarded-for"], headers
        assert headers["x-forwarded-proto"] == "https"
        assert not {"x-forwarded-host", "x-forwarded-port", "x-real-ip", "forwarded"} & set(
            headers
        ), headers
    assert "authorization" not in {n.lower() for n in seen[1]["headers"]}  # /health: no key
    assert seen[2]["headers"]["Authorization"] == f"Bearer {ATTACK_KEY}"  # vLLM checks again


@pytest.mark.docker
@pytest.mark.parametrize(
    "ciphers, accepted",
    [
        ("AES128-SHA", False),  # RSA key exchange (no forward secrecy), CBC with SHA-1
        ("AES256-GCM-SHA384", False),  # RSA key exchange
        ("ECDHE-RSA-AES128-SHA", False),  # forward secret, but CBC with SHA-1
        ("ECDHE-RSA-AES256-SHA384", False),  # CBC
        ("ECDHE-RSA-AES128-GCM-SHA256", True),
        ("ECDHE-RSA-CHACHA20-POLY1305", True),
    ],
)
def test_attack_tls_1_2_takes_only_forward_secret_aead_suites(attacked, ciphers, accepted):
    """Item 6: with an RSA certificate, suites without forward secrecy and CBC-SHA1 were
    accepted."""
    context = attacked.tls(maximum_version=ssl.TLSVersion.TLSv1_2)
    context.set_ciphers(f"{ciphers}:@SECLEVEL=0")
    if accepted:
        with attacked.connect(context) as conn:
            assert conn.cipher()[0] == ciphers
    else:
        with pytest.raises((ssl.SSLError, ConnectionResetError)), attacked.connect(context):
            pass


@pytest.mark.docker
def test_attack_plain_http_through_the_relay_gets_no_answer(attacked):
    with socket.create_connection(("127.0.0.1", attacked.port), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert sock.recv(4096) == b""  # closed without a byte


@pytest.mark.docker
def test_attack_tls_1_3_is_served(attacked):
    with attacked.connect() as conn:
        assert conn.version() == "TLSv1.3"


def closed_by_peer(sock: socket.socket) -> bool:
    """True once the other end closed SOCK (EOF or reset); a blocking SOCK is not waited on."""
    try:
        return sock.recv(4096, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


KEYED_CLIENT = r"""
import json, socket, ssl, sys, time
start = time.monotonic()
context = ssl._create_unverified_context()
with socket.create_connection(("gateway", 8443), timeout=float(sys.argv[2])) as sock:
    with context.wrap_socket(sock) as conn:
        key = open(sys.argv[1]).read().strip().encode()
        conn.sendall(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                     b"Authorization: Bearer " + key + b"\r\n\r\n")
        answer = b""
        try:
            while chunk := conn.recv(65536):
                answer += chunk
        except (ssl.SSLEOFError, ConnectionResetError):
            pass
seconds = round(time.monotonic() - start, 3)
print(json.dumps({"status": int(answer.split(b" ", 2)[1]), "seconds": seconds}))
"""


@pytest.mark.docker
def test_attack_a_flood_of_incomplete_connections_from_one_address_leaves_a_keyed_client_served(
    attacked,
):
    """Item 1: ~1000 connections that send half a request line and never finish it filled
    worker_connections 1024 for the 60 s of nginx's default header timeout, and keyed
    clients got nothing. Here 1100 of them from this host (one address, as Docker's port
    publishing presents them), then a keyed client from another address (a container on the
    gateway's network) must be served at once, and the gateway must close every held
    connection within its 10 s header timeout. Loopback and the test network only."""
    import resource

    flood = 1100
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < flood + 200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, flood + 1024), hard))
    socks: list[socket.socket] = []
    docker("exec", attacked.recorder, "true")  # warm: the keyed client's exec below
    try:
        start = time.monotonic()
        for n in range(flood):
            if n % 50 == 0:
                time.sleep(0.02)  # paced to what the gateway accepts: not the kernel's backlog
            sock = socket.create_connection(("127.0.0.1", attacked.port), timeout=10)
            sock.sendall(b"GET /v1/models HTTP/1.1\r\n")  # and never the rest
            sock.settimeout(None)  # blocking: closed_by_peer's MSG_DONTWAIT does not wait
            socks.append(sock)
        opened_s = time.monotonic() - start
        time.sleep(1)  # the relay refuses what is over the address's limit at once
        held = sum(not closed_by_peer(s) for s in socks)
        client = subprocess.run(
            [docker_client(), "exec", "-i", attacked.recorder, "python3", "-c", KEYED_CLIENT,
             "/dev/stdin", "8"],
            input=ATTACK_KEY, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        served_while_held = sum(not closed_by_peer(s) for s in socks)
        while time.monotonic() - start < 30 and any(not closed_by_peer(s) for s in socks):
            time.sleep(0.25)
        all_closed_s = time.monotonic() - start
        still_open = sum(not closed_by_peer(s) for s in socks)
    finally:
        for sock in socks:
            sock.close()
    result = json.loads(client.stdout) if client.returncode == 0 else {}
    measured(
        f"flood: {flood} connections opened in {opened_s:.2f} s from one address, "
        f"{held} held by the gateway ({flood - held} refused at once), "
        f"{served_while_held} still held while a keyed client from another address got "
        f"{result.get('status')} in {result.get('seconds')} s; every held one closed by the "
        f"gateway {all_closed_s:.1f} s after the flood began ({still_open} still open)"
    )
    assert client.returncode == 0, client.stderr[-2000:]
    assert result["status"] == 200 and result["seconds"] < 5
    assert 0 < held <= CONN_PER_CLIENT
    assert still_open == 0 and all_closed_s < 25


@pytest.mark.docker
def test_attack_a_body_trickled_slower_than_the_timeout_is_cut(attacked):
    """Item 1: a keyless POST /health with a body trickled one byte every 45 s stayed open
    225 s. /health now refuses a body at once; a keyed request's body that stops for longer
    than client_body_timeout (10 s) has its connection closed by the gateway."""
    # keyless, /health: answered before the body comes
    with attacked.connect() as conn:
        conn.sendall(b"POST /health HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\nx")
        conn.settimeout(5)
        assert conn.recv(4096).startswith(b"HTTP/1.1 405 ")
    # keyed: the body stops after its first bytes
    with attacked.connect(timeout=60) as conn:
        conn.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n"
            + f"Authorization: Bearer {ATTACK_KEY}\r\n\r\n".encode()
            + b'{"prompt": "'
        )
        stopped = time.monotonic()
        conn.settimeout(40)
        try:
            answer = conn.recv(4096)  # b"" (EOF) or a 408, once the gateway gives up
        except (ssl.SSLError, ConnectionResetError):
            answer = b"reset"
        except TimeoutError:
            answer = b"still open"
        waited = time.monotonic() - stopped
    measured(f"trickle: the gateway closed a stalled body after {waited:.1f} s ({answer[:20]!r})")
    assert 8 <= waited < 20, (waited, answer)
