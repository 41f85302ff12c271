"""Real servers started by tests: a free port, waiting for health, and stopping a
process group by its PID."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from support import ROOT

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
    from arcvllm.client.api import Client, WaitTimeout

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


def make(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`make ARGS` in the checkout, as an operator runs it, output captured."""
    return subprocess.run(
        # -o: the tests run from this venv; never reinstall it under them
        ["make", "--no-print-directory", "-C", str(ROOT), "-o", ".venv/.stamp", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
