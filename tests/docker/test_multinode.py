"""docker/compose.multinode.yaml: one vLLM server over two nodes on vLLM's multi-node launcher.

The XPU form (a leader and a headless worker, one per host) is validated by compose v2
itself; the CPU form runs for real: two containers of the CPU image on one Docker network
as two nodes, the tiny model split across them (tensor parallel 2, gloo), the smoke test
and `arcvllm verify` through the leader's API, and the worker killed mid-request."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from support import ROOT
from support.compose import ENV_FILE, compose_binary, config
from support.docker import docker
from support.measured import measured
from support.processes import free_port
from support.servers import arcvllm

from arcvllm.client.api import WaitTimeout, wait_until
from arcvllm.presets import get_preset, server_command
from arcvllm.serving.serve import HEADLESS_MODULE, server_argv

MULTINODE = ROOT / "docker" / "compose.multinode.yaml"
PROJECT = "arcvllm-multinode-ci"
API_KEY = "multinode-test-key"
HEALTH_TIMEOUT = 900  # two engines starting on a shared 2-core machine
# A node lost mid-request: the client's stream ends with an error, and the leader's /health
# fails, within these bounds (measured: 0.4-7.4 s; docs/multi-node.md). The leader's exit
# is measured for up to LEADER_EXIT_WAIT.
STREAM_END_BOUND = 30
LEADER_DOWN_BOUND = 60
LEADER_EXIT_WAIT = 120
MEASURED: dict[str, object] = {}


def services(*profiles: str, env: dict[str, str] | None = None) -> dict:
    args = [a for p in profiles for a in ("--profile", p)]
    result = config(MULTINODE, *args, env=env)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["services"]


def flags(command: list[str]) -> dict[str, str | bool]:
    """A compose command's `--flag value` pairs (a flag without a value: True)."""
    out: dict[str, str | bool] = {}
    for i, word in enumerate(command):
        if word.startswith("--"):
            nxt = command[i + 1] if i + 1 < len(command) else "--"
            out[word[2:]] = True if nxt.startswith("--") else nxt
    return out


# ---- the file, as compose renders it (no engine) ----------------------------------------


PAIRS = (("leader", "worker"), ("leader-cpu", "worker-cpu"))


def world_mismatch(svc: dict) -> list[str]:
    """Where a leader and its worker would build different worlds (empty: none)."""
    problems = []
    for leader, worker in PAIRS:
        lead, work = flags(svc[leader]["command"]), flags(svc[worker]["command"])
        if svc[leader]["command"][0] != svc[worker]["command"][0]:
            problems.append(f"{leader}/{worker}: two presets")
        if (lead.get("node-rank"), work.get("node-rank")) != ("0", "1"):
            problems.append(f"{leader}/{worker}: node ranks")
        if "headless" in lead or work.get("headless") is not True:
            problems.append(f"{leader}/{worker}: only the worker is headless")
        for key in ("nnodes", "master-addr", "master-port"):
            if lead.get(key) != work.get(key):
                problems.append(f"{leader}/{worker}: {key}")
        for key in ("tensor-parallel-size", "pipeline-parallel-size"):
            if lead.get(key) != work.get(key):
                problems.append(f"{leader}/{worker}: {key}")
    return problems


ADDRESSES = {"LEADER_ADDR": "10.0.0.1", "WORKER_ADDR": "10.0.0.2"}


def test_the_leader_and_the_headless_worker_agree_on_the_world():
    svc = services("cpu", env=ADDRESSES)
    assert world_mismatch(svc) == []
    for _, worker in PAIRS:
        assert "ports" not in svc[worker]
    # XPU: each host's own address for vLLM's message queues, the leader's as master
    assert svc["leader"]["network_mode"] == svc["worker"]["network_mode"] == "host"
    assert flags(svc["leader"]["command"])["master-addr"] == "10.0.0.1"
    assert svc["leader"]["environment"]["VLLM_HOST_IP"] == "10.0.0.1"
    assert svc["worker"]["environment"]["VLLM_HOST_IP"] == "10.0.0.2"
    assert svc["leader-cpu"]["ports"][0]["host_ip"] == "127.0.0.1"


def test_a_worker_given_another_world_size_is_caught(tmp_path):
    text = MULTINODE.read_text()
    broken = text.replace("--nnodes 2 --node-rank 1", "--nnodes 3 --node-rank 1", 1)
    assert broken != text
    (tmp_path / "compose.multinode.yaml").write_text(broken)
    result = config(tmp_path / "compose.multinode.yaml", "--profile", "cpu")
    assert result.returncode == 0, result.stderr
    assert world_mismatch(yaml.safe_load(result.stdout)["services"]) == ["leader/worker: nnodes"]


def test_a_headless_node_runs_vllms_serve_subcommand_not_the_api_server():
    command = server_command(get_preset("tiny-hybrid-cpu"), ["--nnodes", "2", "--headless"])
    assert server_argv(command)[1:3] == ["-m", HEADLESS_MODULE]
    leader = server_command(get_preset("tiny-hybrid-cpu"), ["--nnodes", "2"])
    assert server_argv(leader) == leader.argv  # vLLM's OpenAI server


# ---- the CI deployment: two CPU containers as two nodes, for real -----------------------


@dataclass
class Deployment:
    compose: list[str]
    env: dict[str, str]
    url: str
    key_file: Path
    tmp: Path

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [*self.compose, *args], capture_output=True, text=True, timeout=timeout, env=self.env
        )
        assert result.returncode == 0, f"compose {' '.join(args)}: {result.stderr[-3000:]}"
        return result

    def container(self, service: str) -> str:
        return self.run("ps", "-a", "-q", service).stdout.strip()

    def log(self, service: str) -> Path:
        """SERVICE's log so far, in a file (smoke and verify read the block size and chunk)."""
        path = self.tmp / f"{service}.log"
        out = docker("logs", self.container(service), timeout=60)
        path.write_text(out.stdout + out.stderr)
        return path

    def logs(self) -> str:
        return subprocess.run(
            [*self.compose, "logs", "--no-color", "--tail=60"],
            capture_output=True,
            text=True,
            timeout=60,
            env=self.env,
        ).stdout[-8000:]


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def source_mount(image: str, tmp: Path) -> list[str]:
    """An image built before this tree's arcvllm/serving/serve.py (ARCVLLM_TEST_IMAGE, not
    rebuilt) gets the tree's file mounted over its own: the headless node's entry is in it.
    A fresh `make build` (CI) carries the tree's file and mounts nothing."""
    code = "import arcvllm.serving.serve as s; print(s.__file__)"
    inside = docker("run", "--rm", "--entrypoint", "python3", image, "-c", code).stdout.strip()
    ours = ROOT / "arcvllm" / "serving" / "serve.py"
    theirs = docker("run", "--rm", "--entrypoint", "cat", image, inside).stdout
    if theirs == ours.read_text():
        return []
    MEASURED["mounted_tree_serve_py"] = True
    override = tmp / "source.yaml"
    mount = f"['{ours}:{inside}:ro']"
    override.write_text(
        f"services:\n  leader-cpu:\n    volumes: {mount}\n  worker-cpu:\n    volumes: {mount}\n"
    )
    return ["-f", str(override)]


@pytest.fixture(scope="module")
def deployment(request, tmp_path_factory):
    image = request.getfixturevalue("cpu_image")  # tests/builder/test_image.py: make build's image
    tmp = tmp_path_factory.mktemp("multinode")
    key_file = tmp / "api-key"
    key_file.write_text(API_KEY + "\n")
    key_file.chmod(0o644)  # UID 1000 in the container reads it
    port = free_port()
    env = {
        **os.environ,
        "CPU_IMAGE": image,
        "BIND_ADDRESS": "127.0.0.1",
        "PORT": str(port),
        "VLLM_API_KEY_FILE": str(key_file),
    }
    compose = [
        *compose_binary(),
        *("-p", PROJECT, "--env-file", str(ENV_FILE), "-f", str(MULTINODE)),
        *source_mount(image, tmp),
        *("--profile", "cpu"),
    ]
    dep = Deployment(compose, env, f"http://127.0.0.1:{port}", key_file, tmp)
    dep.run("down", "-v", "--remove-orphans", timeout=180)  # a previous run's leftovers
    start = time.monotonic()
    try:
        dep.run("up", "-d", "leader-cpu", "worker-cpu", timeout=300)
        try:
            wait_until(lambda: healthy(dep.url), HEALTH_TIMEOUT, 2, "the leader's /health")
        except WaitTimeout as exc:
            pytest.fail(f"{exc}\n{dep.logs()}")
        MEASURED["healthy_s"] = round(time.monotonic() - start, 1)
        yield dep
    finally:
        subprocess.run(
            [*compose, "down", "-v", "--remove-orphans", "-t", "20"],
            capture_output=True,
            timeout=300,
            env=env,
        )
        MEASURED["total_s"] = round(time.monotonic() - start, 1)
        measured(f"multi-node measurements: {json.dumps(MEASURED)}")


@pytest.mark.docker
@pytest.mark.server
def test_the_model_is_split_across_the_two_containers(deployment):
    leader, worker = (
        deployment.log("leader-cpu").read_text(),
        deployment.log("worker-cpu").read_text(),
    )
    # each container holds one rank of a world of two, over gloo, and one half of the model
    assert "world_size=2 rank=0" in leader and "backend=gloo" in leader
    assert "world_size=2 rank=1" in worker and "backend=gloo" in worker
    assert "Worker_TP0" in leader and "Worker_TP1" not in leader
    assert "Worker_TP1" in worker and "headless multiproc executor" in worker
    t0 = time.monotonic()
    r = httpx.post(
        f"{deployment.url}/v1/completions",
        json={"model": "tiny-hybrid", "prompt": "two nodes", "max_tokens": 8, "temperature": 0},
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=300,
    )
    MEASURED["first_request_s"] = round(time.monotonic() - t0, 1)
    assert r.status_code == 200, r.text[:500]
    assert r.json()["usage"]["completion_tokens"] == 8
    assert "-tp2-" in r.json()["system_fingerprint"]


@pytest.mark.docker
@pytest.mark.server
def test_smoke_passes_through_the_leader(deployment):
    log = deployment.log("leader-cpu")
    result = arcvllm(
        *("smoke", "--base-url", deployment.url, "--api-key-file", str(deployment.key_file)),
        *("--log-file", str(log), "--out", str(deployment.tmp / "smoke.json")),
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "smoke: PASS" in result.stdout
    MEASURED["smoke_s"] = json.loads((deployment.tmp / "smoke.json").read_text())["measurements"][
        "time_to_verdict_s"
    ]


# verify's row through the two nodes: the block-boundary decode, the path the mamba copy
# takes (with the chunked prefill too, 142 s on an idle 2-core machine, 455 s beside CI's
# builds; every row is run against one node in tests/verify/test_verify_server.py).
VERIFY_ROWS = "boundary decode"


@pytest.mark.docker
@pytest.mark.server
def test_verify_passes_through_the_leader(deployment):
    out = deployment.tmp / "verify.json"
    result = arcvllm(
        *("verify", "--base-url", deployment.url, "--api-key-file", str(deployment.key_file)),
        *("--preset", "tiny-hybrid-cpu", "--rows", VERIFY_ROWS, "--out", str(out)),
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    report = json.loads(out.read_text())
    rows = {row["name"]: row for row in report["checks"]}
    assert {name for name, row in rows.items() if row["ok"] is True} == set(
        VERIFY_ROWS.split(",")
    ), result.stdout[-3000:]
    MEASURED["verify_s"] = report["measurements"]["time_to_verdict_s"]


@pytest.mark.docker
@pytest.mark.server
def test_a_worker_killed_mid_request_ends_the_stream_with_an_error_and_the_leader(deployment):
    """Last: it ends the deployment. No hang: the stream ends with vLLM's error within
    STREAM_END_BOUND, and the leader's /health fails within LEADER_DOWN_BOUND."""
    times: dict[str, float] = {}
    lines: list[str] = []

    def kill_after_first_token() -> None:
        wait_until(lambda: "first" in times, 300, 0.05, "the first streamed token")
        time.sleep(1)
        worker = deployment.container("worker-cpu")
        times["kill"] = time.monotonic()  # the bounds count from before the kill is sent
        docker("kill", worker)

    killer = threading.Thread(target=kill_after_first_token, daemon=True)
    killer.start()
    body = {
        "model": "tiny-hybrid",
        "prompt": "a long answer",
        "max_tokens": 1500,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {API_KEY}"}
    error = None
    try:
        with httpx.stream(
            "POST", f"{deployment.url}/v1/completions", json=body, headers=headers, timeout=300
        ) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    times.setdefault("first", time.monotonic())
                    lines.append(line)
    except httpx.HTTPError as exc:  # the connection dropped rather than an error event
        error = f"{type(exc).__name__}: {exc}"
    times["end"] = time.monotonic()
    killer.join(timeout=10)
    assert "kill" in times, "the worker was not killed"
    stream_end = times["end"] - times["kill"]
    MEASURED["stream_end_after_kill_s"] = round(stream_end, 2)
    events = [line for line in lines if '"error"' in line]
    MEASURED["client_saw"] = (events[-1][6:200] if events else error) or "no error"
    assert events or error, lines[-3:]
    assert stream_end < STREAM_END_BOUND
    wait_until(lambda: not healthy(deployment.url), LEADER_DOWN_BOUND, 0.2, "the leader down")
    MEASURED["leader_unhealthy_after_kill_s"] = round(time.monotonic() - times["kill"], 2)

    def leader_exited() -> bool:
        state = docker("inspect", "-f", "{{.State.Status}}", deployment.container("leader-cpu"))
        return state.stdout.strip() == "exited"

    # Measured, not asserted: the clear error above is the bound. The container exited
    # 4.0 s after the kill on a quiet run, and was still up 60 s after it on a machine at a
    # load of ~50 (docs/multi-node.md).
    try:
        wait_until(leader_exited, LEADER_EXIT_WAIT, 0.5, "the leader's container to exit")
        MEASURED["leader_exited_after_kill_s"] = round(time.monotonic() - times["kill"], 2)
    except WaitTimeout:
        MEASURED["leader_exited_after_kill_s"] = f"not within {LEADER_EXIT_WAIT} s"
    assert "EngineDeadError" in deployment.log("leader-cpu").read_text()
