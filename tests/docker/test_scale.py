"""docker/compose.scale.yaml: N replicas behind vLLM's router, and Prometheus.

The profiles are validated by compose v2 itself (no engine needed); the `cpu-scale` and
`monitoring` profiles then run for real (two CPU replicas, the router, Prometheus)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from support import ROOT
from support.compose import compose_binary
from support.docker import docker
from support.drain import assert_drained, drain_stream
from support.measured import measured
from support.processes import free_port
from support.scale import (
    BASE,
    ENV_FILE,
    ROUTER_IMAGE,
    SCALE,
    build_target,
    compose_config,
    ports,
    services,
    side_image,
)

from arcvllm.client.api import WaitTimeout, wait_until
from arcvllm.client.metrics import Metrics, PrefixCache, block_size, prefix_cache


def bind_mounts(service: dict) -> dict[str, str]:
    """target -> host source of the bind mounts, in either form."""
    out = {}
    for v in service.get("volumes", []):
        if isinstance(v, str):
            source, target = v.split(":")[:2]
            if source.startswith("/"):
                out[target] = source
        elif v["type"] == "bind":
            out[v["target"]] = v["source"]
    return out


@pytest.fixture
def four(tmp_path) -> Path:
    """The replicas' file `arcvllm scale up` writes on a host with four B70s."""
    from support.hosts import FOUR, fake_host

    from arcvllm.operate import replicas

    cards = replicas.pick(fake_host(tmp_path, FOUR), 4)
    return replicas.write(cards, SCALE, tmp_path / "state")


@pytest.mark.parametrize("profiles", [("scale",), ("cpu-scale",), ("monitoring",)])
def test_every_profile_validates(profiles, four):
    for extra in ((), (four,)):
        result = compose_config(*profiles, extra=extra)
        assert result.returncode == 0, result.stderr


def test_a_broken_scale_file_fails_validation(tmp_path):
    broken = tmp_path / "compose.scale.yaml"
    broken.write_text(SCALE.read_text().replace("read_only: true", "read_only: [yes]", 1))
    result = compose_config("scale", scale=broken)
    assert result.returncode != 0
    assert "read_only" in result.stderr


def test_one_b70_per_replica_no_host_ports_behind_the_router(four):
    """(Each replica's own render node: tests/operate/test_replicas.py.)"""
    env = {"BIND_ADDRESS": "0.0.0.0", "PORT": "8080"}
    svc = services("scale", env=env, extra=(four,))
    masks = [svc[f"vllm-{i}"]["environment"]["ZE_AFFINITY_MASK"] for i in range(4)]
    assert masks == ["0", "0", "0", "0"]  # each sees one GPU: its own is device 0
    for i in range(4):
        replica = svc[f"vllm-{i}"]
        assert "ports" not in replica, replica.get("ports")
        assert len(replica["devices"]) == 1
        # The default stack, xpu-0.33 (vLLM 0.33), needs it for the router's tokenizing.
        assert "--enable-scale-out" in replica["command"]
    router = svc["router"]
    assert "ports" not in router  # the gateway is the way in
    assert ports(svc["gateway"]) == [("0.0.0.0", 8080, 8443)]
    assert svc["gateway"]["environment"]["GATEWAY_UPSTREAM"] == "http://router:8000"
    assert router["environment"]["ROUTER_POLICY"] == "cache_aware"
    # compose v2 renders a command as its words
    assert router["command"][1:] == [f"http://vllm-{i}:8000" for i in range(4)]
    two = services("scale", env={"ROUTER_WORKER_URLS": "http://vllm-2:8000"}, extra=(four,))
    assert two["router"]["command"] == ["--worker-urls", "http://vllm-2:8000"]  # scale up's
    assert (router["build"]["target"], router["build"]["args"]) == ("side", {"SIDE": "router"})


def test_router_policy_thresholds_and_scale_out_flag_are_settings(four):
    env = {
        "ROUTER_POLICY": "round_robin",
        "ROUTER_CACHE_THRESHOLD": "0.5",
        "SCALE_OUT_ARGS": "--enable-scale-out",
        "IMAGE": "arcvllm:xpu-0.33",
    }
    svc = services("scale", env=env, extra=(four,))
    assert svc["router"]["environment"]["ROUTER_POLICY"] == "round_robin"
    assert svc["router"]["environment"]["ROUTER_CACHE_THRESHOLD"] == "0.5"
    assert svc["vllm-0"]["image"] == "arcvllm:xpu-0.33"
    assert svc["vllm-0"]["command"][1:] == ["--enable-scale-out"]


def test_cpu_replicas_answer_as_vllm_0_and_1_with_scale_out_and_a_cpu_set_each():
    svc = services("cpu-scale")
    for i in range(2):
        replica = svc[f"vllm-cpu-{i}"]
        assert replica["image"] == "arcvllm:cpu"
        assert replica["command"] == ["tiny-hybrid-cpu", "--enable-scale-out"]
        assert replica["networks"]["default"]["aliases"] == [f"vllm-{i}"]
        assert replica["cpuset"] == str(i)
        assert "ports" not in replica
    assert svc["router-cpu"]["networks"]["default"]["aliases"] == ["router"]


def test_prometheus_publishes_no_port():
    """It has no authentication (tests/deploy/test_gateway.py: only the gateway is published)."""
    svc = services("monitoring", env={"BIND_ADDRESS": "0.0.0.0"})
    assert ports(svc["prometheus"]) == []
    assert [str(p) for p in svc["prometheus"]["expose"]] == ["9090"]


def test_prometheus_mounts_the_targets_of_its_n(four):
    target = "/etc/arcvllm/prometheus/targets/replicas.yml"
    prom = services("monitoring")["prometheus"]
    assert (prom["build"]["target"], prom["build"]["args"]) == ("side", {"SIDE": "prometheus"})
    source = Path(bind_mounts(prom)[target])  # cpu-scale's two, as the file names them
    assert source == ROOT / "deploy" / "prometheus" / "targets" / "replicas.yml"
    assert [t["labels"]["replica"] for t in yaml.safe_load(source.read_text())] == [
        "vllm-0",
        "vllm-1",
    ]
    source = Path(bind_mounts(services("monitoring", extra=(four,))["prometheus"])[target])
    assert source == four.parent / "targets.yml"
    assert [t["labels"]["replica"] for t in yaml.safe_load(source.read_text())] == [
        f"vllm-{i}" for i in range(4)
    ]


# ---- the CI deployment: two CPU replicas + router + Prometheus, for real ----------------
# One deployment for the tests below, in their order: prefix affinity (cache_aware),
# Prometheus against direct scrapes, a round_robin control (the router recreated, then
# back to cache_aware), and last the fail-over of a killed replica (its restart is slow).

PROJECT = "arcvllm-scale-ci"
HEALTH_TIMEOUT = 600
PROMETHEUS_IMAGE = side_image("prometheus")
CHECK_INTERVAL, FAILURE_THRESHOLD = 2, 2  # the router's health checking in this test
API_KEY = "scale-test-key"  # the replicas' key (the clients' Bearer passes the router)
MEASURED: dict[str, object] = {}  # printed at the end (docs/scale.md quotes it)


@dataclass
class Deployment:
    compose: list[str]
    env: dict[str, str]
    router: str
    prometheus: str

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [*self.compose, *args], capture_output=True, text=True, timeout=timeout, env=self.env
        )
        assert result.returncode == 0, f"compose {' '.join(args)}: {result.stderr[-3000:]}"
        return result

    def container(self, service: str) -> str:
        return self.run("ps", "-q", service).stdout.strip()

    def scrape(self, service: str, port: int = 8000) -> Metrics:
        """/metrics from inside the container (replicas publish no port). A replica's API
        server answers between engine steps: on a 2-core machine running other servers
        beside it, a scrape took over 10 s once in CI."""
        code = (
            "import urllib.request; print(urllib.request.urlopen("
            f"'http://127.0.0.1:{port}/metrics', timeout=60).read().decode())"
        )
        out = docker("exec", self.container(service), "python3", "-c", code, timeout=90)
        return Metrics.parse(out.stdout)

    def logs(self) -> str:
        return subprocess.run(
            [*self.compose, "logs", "--no-color", "--tail=40"],
            capture_output=True,
            text=True,
            timeout=60,
            env=self.env,
        ).stdout[-6000:]


def router_ready(url: str, workers: int) -> bool:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        r = httpx.get(f"{url}/readiness", timeout=5)
        return r.status_code == 200 and r.json().get("healthy_workers") == workers
    return False


def replicas_healthy(dep: Deployment) -> bool:
    for service in ("vllm-cpu-0", "vllm-cpu-1"):
        state = docker("inspect", "-f", "{{.State.Health.Status}}", dep.container(service))
        if state.stdout.strip() != "healthy":
            return False
    return True


def wait_for(condition, timeout: float, what: str, deployment: Deployment | None = None):
    """wait_until, failing the test with the deployment's logs."""
    try:
        wait_until(condition, timeout, 1, what)
    except WaitTimeout as exc:
        pytest.fail(f"{exc}\n{deployment.logs() if deployment else ''}")


@pytest.fixture(scope="module")
def deployment(request, tmp_path_factory):
    image = request.getfixturevalue("cpu_image")  # tests/builder/test_image.py: make build's image
    start = t0 = time.monotonic()
    build_target("router", ROUTER_IMAGE)
    build_target("prometheus", PROMETHEUS_IMAGE)
    MEASURED["image_builds_s"] = round(time.monotonic() - t0, 1)
    port, prom_port = free_port(), free_port()
    # The replicas serve with a key, as in production (compose secret api-key); UID 1000
    # in the containers reads the file.
    secrets = tmp_path_factory.mktemp("scale-secrets")
    key_file = secrets / "api-key"
    key_file.write_text(API_KEY + "\n")
    key_file.chmod(0o644)
    env = {
        **os.environ,
        "VLLM_API_KEY_FILE": str(key_file),
        "CPU_IMAGE": image,
        "BIND_ADDRESS": "127.0.0.1",
        "PORT": str(port),
        "PROMETHEUS_PORT": str(prom_port),
        "ROUTER_POLICY": "cache_aware",
        "ROUTER_HEALTH_CHECK_INTERVAL_SECS": str(CHECK_INTERVAL),
        "ROUTER_HEALTH_FAILURE_THRESHOLD": str(FAILURE_THRESHOLD),
    }
    # The router and Prometheus publish no port (the gateway is the way in:
    # tests/deploy/test_gateway.py); this test measures routing and reads Prometheus, so it
    # publishes both on loopback for itself.
    published = tmp_path_factory.mktemp("scale") / "router-published.yaml"
    published.write_text(
        "services:\n  router-cpu:\n    ports: ['127.0.0.1:${PORT}:8000']\n"
        "  prometheus:\n    ports: ['127.0.0.1:${PROMETHEUS_PORT}:9090']\n"
    )
    compose = [
        *compose_binary(),
        "-p",
        PROJECT,
        "--env-file",
        str(ENV_FILE),
        "-f",
        str(BASE),
        "-f",
        str(SCALE),
        "-f",
        str(published),
        "--profile",
        "cpu-scale",
        "--profile",
        "monitoring",
    ]
    dep = Deployment(compose, env, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{prom_port}")
    dep.run("down", "-v", "--remove-orphans", timeout=180)  # a previous run's leftovers
    t0 = time.monotonic()
    try:
        dep.run("up", "-d", "router-cpu", "prometheus", timeout=300)
        wait_for(lambda: router_ready(dep.router, 2), HEALTH_TIMEOUT, "2 healthy workers", dep)
        wait_for(lambda: replicas_healthy(dep), 120, "both replicas healthy (Docker)", dep)
        MEASURED["healthy_s"] = round(time.monotonic() - t0, 1)
        yield dep
    finally:
        subprocess.run(
            [*compose, "down", "-v", "--remove-orphans", "-t", "20"],
            capture_output=True,
            timeout=300,
            env=env,
        )
        MEASURED["total_s"] = round(time.monotonic() - start, 1)
        measured(f"scale-out measurements: {json.dumps(MEASURED)}")


def complete(url: str, prompt: str, max_tokens: int = 4) -> dict:
    r = httpx.post(
        f"{url}/v1/completions",
        json={"model": "tiny-hybrid", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=120,
    )
    assert r.status_code == 200, r.text[:500]
    return r.json()


def prefixes(seed: int, count: int = 3, words: int = 300) -> list[str]:
    """COUNT prompts that share nothing: seeded random words, a distinct head each."""
    rng = random.Random(seed)
    vocab = [f"{a}{b}" for a in "bcdfghklmnprstvz" for b in ("ar", "en", "il", "or", "us")]
    return [
        f"Document {seed}-{i}: " + " ".join(rng.choice(vocab) for _ in range(words))
        for i in range(count)
    ]


def replica_caches(dep: Deployment) -> dict[str, PrefixCache]:
    return {r: prefix_cache(dep.scrape(f"vllm-cpu-{i}")) for i, r in enumerate(REPLICAS_CPU)}


def router_metrics(dep: Deployment) -> Metrics:
    return dep.scrape("router-cpu", port=29000)


def missing_tokens(dep: Deployment) -> float:
    """The router's decisions made without the prompt's tokens (its render call failed)."""
    return router_metrics(dep).total(
        "vllm_router_prefix_routing_decisions", outcome="missing_tokens"
    )


def affinity_run(dep: Deployment, seed: int, repeats: int) -> dict[str, object]:
    """First sends concurrent, then REPEATS sequential rounds: per repeat, who served, hit?
    And how many of the rounds' routing decisions had no tokens."""
    block = block_size(dep.scrape("vllm-cpu-0"))
    assert block, "no block size on /metrics"
    prompts = prefixes(seed)
    with ThreadPoolExecutor(len(prompts)) as pool:
        first = list(pool.map(lambda p: complete(dep.router, p), prompts))
    tokens = [f["usage"]["prompt_tokens"] for f in first]
    missing_before = missing_tokens(dep)
    assert min(tokens) >= 3 * block + 1, (tokens, block)
    rounds: list[list[tuple[str, bool]]] = []
    hit_tokens = query_tokens = 0.0
    for _ in range(repeats):
        served_by = []
        for i, prompt in enumerate(prompts):
            before = replica_caches(dep)
            complete(dep.router, prompt)
            after = replica_caches(dep)
            delta = {r: after[r] - before[r] for r in after}
            served = [r for r in delta if delta[r].queries > 0]
            assert len(served) == 1, delta  # the other replica's counters stay flat
            owner = served[0]
            served_by.append((owner, delta[owner].hits >= (tokens[i] - 1) // block * block))
            hit_tokens += delta[owner].hits
            query_tokens += delta[owner].queries
        rounds.append(served_by)
    owners = [{rnd[i][0] for rnd in rounds} for i in range(len(prompts))]
    return {
        "block": block,
        "tokens": tokens,
        "rounds": rounds,
        "owners": owners,
        "token_hit_rate": round(hit_tokens / query_tokens, 3),
        "repeat_hit_rate": round(
            sum(hit for rnd in rounds for _, hit in rnd) / (repeats * len(prompts)), 3
        ),
        "missing_tokens": missing_tokens(dep) - missing_before,
    }


REPLICAS_CPU = ("vllm-0", "vllm-1")


@pytest.mark.docker
@pytest.mark.server
def test_cache_aware_keeps_each_prefix_on_its_replica(deployment):
    """vLLM's align mode may checkpoint a prompt's mamba state only on its second pass, so
    an early repeat can miss on the right replica: affinity is asserted on every repeat,
    the hit on the last one."""
    run = affinity_run(deployment, seed=1, repeats=3)
    MEASURED["block_size"] = run["block"]
    MEASURED["prompt_tokens"] = run["tokens"]
    MEASURED["cache_aware"] = {k: run[k] for k in ("token_hit_rate", "repeat_hit_rate")}
    assert all(len(o) == 1 for o in run["owners"]), run
    # Where a new prefix goes is the router's load balance, not its cache awareness: with
    # requests one at a time both replicas are idle, and a CI run put all three prefixes on
    # vllm-1. Each owner must be a replica of the deployment; the round-robin control run
    # (test_round_robin_control_run_misses) shows what routing without affinity does.
    assert set().union(*run["owners"]) <= set(REPLICAS_CPU), run
    assert all(hit for _, hit in run["rounds"][-1]), run
    # One request at a time, the decisions have the prompt's tokens: a replica that refuses
    # the render endpoint (0.32+ without --enable-scale-out) fails every one. A render call
    # that times out is routed without tokens, the router's documented fallback: on a loaded
    # CI machine two of the first, concurrent pass's did (not counted), and once one of
    # the 9 counted here.
    requests = sum(len(rnd) for rnd in run["rounds"])
    assert run["missing_tokens"] < requests / 2, ("the router routed without tokens", run)


def prom_query(dep: Deployment, expr: str) -> list[dict]:
    r = httpx.get(f"{dep.prometheus}/api/v1/query", params={"query": expr}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["data"]["result"]


@pytest.mark.docker
@pytest.mark.server
def test_prometheus_scrapes_all_and_agrees_with_direct_scrapes(deployment):
    from support.prometheus import console_exprs, dashboard_exprs, rules

    def targets_up() -> bool:
        # The canary's target is configured too; this deployment does not start the canary
        # (tests/operate/test_canary.py runs it), so its target is down here.
        r = httpx.get(f"{deployment.prometheus}/api/v1/targets", timeout=10).json()
        jobs = {}
        for t in r["data"]["activeTargets"]:
            jobs.setdefault(t["labels"]["job"], []).append(t["health"])
        assert set(jobs) == {"vllm", "router", "canary"}, jobs
        return len(jobs["vllm"]) == 2 and all(h == "up" for h in jobs["vllm"] + jobs["router"])

    wait_for(targets_up, 60, "all Prometheus targets up", deployment)
    time.sleep(12)  # no traffic now: let two scrapes pass
    direct = replica_caches(deployment)
    for replica, cache in direct.items():
        (q,) = prom_query(
            deployment, f'sum(vllm:prefix_cache_queries_total{{replica="{replica}"}})'
        )
        (h,) = prom_query(deployment, f'sum(vllm:prefix_cache_hits_total{{replica="{replica}"}})')
        assert (float(h["value"][1]), float(q["value"][1])) == (cache.hits, cache.queries)
    exprs = [r["record"] for r in rules() if "record" in r] + console_exprs() + dashboard_exprs()
    empty = [e for e in exprs if not prom_query(deployment, e)]
    assert not empty, f"no data: {empty}"
    page = httpx.get(f"{deployment.prometheus}/consoles/arcvllm.html", timeout=10)
    assert page.status_code == 200
    for replica in REPLICAS_CPU:
        assert f"<tr><th>{replica}</th>" in page.text


@pytest.mark.docker
@pytest.mark.server
def test_round_robin_control_run_misses(deployment):
    """The same measurement with policy round_robin: repeats land on the other replica."""
    deployment.env["ROUTER_POLICY"] = "round_robin"
    deployment.run("up", "-d", "--no-deps", "router-cpu", timeout=300)
    wait_for(lambda: router_ready(deployment.router, 2), 120, "round_robin router", deployment)
    run = affinity_run(deployment, seed=3, repeats=3)
    MEASURED["round_robin"] = {k: run[k] for k in ("token_hit_rate", "repeat_hit_rate")}
    # An odd number of prefixes: every repeat lands on the other replica, the first cold.
    assert all(len(o) == 2 for o in run["owners"]), run
    assert not all(hit for _, hit in run["rounds"][0]), run
    deployment.env["ROUTER_POLICY"] = "cache_aware"  # back, for the tests after this one
    deployment.run("up", "-d", "--no-deps", "router-cpu", timeout=300)
    wait_for(lambda: router_ready(deployment.router, 2), 120, "cache_aware router", deployment)


@pytest.mark.docker
@pytest.mark.server
def test_the_smoke_test_passes_through_the_router(deployment):
    """`arcvllm smoke` against the router, with the replicas' own /metrics summed
    (--metrics-url: the router's /metrics is one replica's). It runs in a replica's container,
    on the deployment's network, because the replicas publish no port."""
    result = docker(
        "exec", deployment.container("vllm-cpu-0"),
        "arcvllm", "smoke", "--base-url", "http://router-cpu:8000", "--model", "tiny-hybrid",
        "--api-key-file", "/run/secrets/api-key",
        "--metrics-url", "http://vllm-0:8000", "--metrics-url", "http://vllm-1:8000",
        timeout=900, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "smoke: PASS" in result.stdout


@pytest.mark.docker
@pytest.mark.server
def test_a_killed_replica_is_routed_around_and_used_again_after_restart(deployment):
    def health(replica: str) -> float:
        return router_metrics(deployment).total(
            "vllm_router_worker_health", worker=f"http://{replica}:8000"
        )

    victim = deployment.container("vllm-cpu-1")
    docker("kill", victim)
    killed = time.monotonic()
    prompts = prefixes(seed=7, count=12, words=40)
    for prompt in prompts:  # every request succeeds (complete asserts 200)
        complete(deployment.router, prompt)
    wait_for(lambda: health("vllm-1") == 0, 60, "vllm-1 marked unhealthy", deployment)
    gap = time.monotonic() - killed
    MEASURED["failover_marked_unhealthy_s"] = round(gap, 1)
    budget = CHECK_INTERVAL * FAILURE_THRESHOLD + 5 + 5  # + check timeout + scrape slack
    assert gap <= budget, gap
    # `docker kill` counts as a manual stop (no automatic restart): start it again.
    t0 = time.monotonic()
    docker("start", victim)
    wait_for(lambda: router_ready(deployment.router, 2), HEALTH_TIMEOUT, "vllm-1 back", deployment)
    MEASURED["restart_to_healthy_s"] = round(time.monotonic() - t0, 1)
    before = router_metrics(deployment).total(
        "vllm_router_processed_requests", worker="http://vllm-1:8000"
    )
    fresh = prefixes(seed=11, count=6, words=60)
    with ThreadPoolExecutor(len(fresh)) as pool:
        list(pool.map(lambda p: complete(deployment.router, p), fresh))
    after = router_metrics(deployment).total(
        "vllm_router_processed_requests", worker="http://vllm-1:8000"
    )
    assert after > before, "the restarted replica gets no requests"


@pytest.mark.docker
@pytest.mark.server
def test_a_stream_in_flight_across_scale_down_completes_with_all_its_tokens(deployment):
    """Last: `arcvllm scale down` takes the deployment down while a stream runs through the
    router. The replicas stop first and drain (the preset's shutdown_timeout) with the
    router still in front; then the rest goes. The volumes stay (no --purge)."""

    def stop() -> None:
        done = subprocess.run(
            [sys.executable, "-m", "arcvllm", "scale", "down", "--project", PROJECT,
             "--env-file", str(ENV_FILE)],
            capture_output=True, text=True, timeout=600, cwd=ROOT, env=deployment.env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]

    seen = drain_stream(deployment.router, "tiny-hybrid", API_KEY, True, stop)
    assert_drained(seen)
    MEASURED["drain_stream_left_at_stop_s"] = round(seen["stream_end"] - seen["stop_asked"], 1)
    MEASURED["drain_stream_tokens"] = seen["tokens"]
    assert deployment.run("ps", "-a", "-q").stdout.strip() == ""
    volumes = docker(
        "volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}"
    )
    assert volumes.stdout.split(), "scale down removed the volumes"
