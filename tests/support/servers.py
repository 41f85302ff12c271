"""Real vLLM servers of a preset on this host (`arcvllm serve --preset`), and the smoke
test run against one: what the end-to-end server tests share."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support import ROOT
from support.processes import free_port
from support.venvs import inductor_cache, vllm_cache


def start_preset_server(
    python: Path,
    preset: str,
    model: Path,
    tmp: Path,
    env_extra: dict[str, str],
    vllm_args: tuple[str, ...] = (),
    host: str = "127.0.0.1",
    port: int | None = None,
) -> tuple[subprocess.Popen, str, Path]:
    """PYTHON's `arcvllm serve --preset PRESET [-- VLLM_ARGS]` on HOST (any of 127/8 is
    loopback) at PORT (a free one if None), with everything it writes under TMP and
    ENV_EXTRA over this environment: (process, URL, its log)."""
    port = port or free_port()
    # vLLM's engine sockets are ZMQ IPC files in TMPDIR, each named by a uuid (36
    # characters); a unix socket's path holds at most 107 bytes (sockaddr_un): a server
    # started deeper dies at start with a ZMQError. Callers keep TMP's name short.
    (tmp / "tmp").mkdir(parents=True, exist_ok=True)
    vllm_cache(tmp / "cache")
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.update(
        TMPDIR=str(tmp / "tmp"),
        VLLM_CACHE_ROOT=str(tmp / "cache"),
        XDG_CACHE_HOME=str(tmp / "cache"),
        TORCHINDUCTOR_CACHE_DIR=str(inductor_cache()),
        HF_HUB_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        VLLM_CPU_KVCACHE_SPACE="1",
    )
    env.update(env_extra)
    log = tmp / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                str(python),
                *("-m", "arcvllm", "serve", "--preset", preset, "--"),
                *("--model", str(model), "--host", host, "--port", str(port)),
                *vllm_args,
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: killed as one at teardown
        )
    return proc, f"http://{host}:{port}", log


def arcvllm(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """`arcvllm ARGS` from the checkout, as a client of a server: its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "arcvllm", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def smoke(url: str, log: Path, report: Path, *extra: str) -> subprocess.CompletedProcess:
    """`arcvllm smoke` against URL, the server's log as its log source, the report at REPORT."""
    return arcvllm(
        *("smoke", "--base-url", url, "--log-file", str(log), "--out", str(report)), *extra
    )
