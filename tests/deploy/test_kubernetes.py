"""deploy/kubernetes: every overlay builds with `kubectl kustomize` and validates strictly
against a pinned Kubernetes release's schemas (kubernetes-validate, offline)."""

from __future__ import annotations

import ipaddress
import json
import re
import shutil
import subprocess
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from support import ROOT
from support.kubernetes import KUBE, built, kustomize, one, validate

from arcvllm import presets

OVERLAYS = ("one-b70", "scale", "scale-xpu-0.33", "scale-2x2-b70", "four-b70-tp4")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_builds_and_validates_strictly(overlay, tmp_path):
    result = kustomize(KUBE / "overlays" / overlay)
    assert result.returncode == 0, result.stderr
    manifest = tmp_path / f"{overlay}.yaml"
    manifest.write_text(result.stdout)
    checked = validate(manifest)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_broken_manifest_fails_validation(tmp_path):
    docs = built("scale")
    sts = one(docs, "StatefulSet", "vllm")
    sts["spec"]["template"]["spec"]["containers"][0]["gpus"] = 1  # no such field
    manifest = tmp_path / "broken.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    result = validate(manifest)
    assert result.returncode != 0
    assert "gpus" in result.stdout + result.stderr


def test_an_overlay_with_a_missing_resource_fails_to_build(tmp_path):
    shutil.copytree(KUBE, tmp_path / "kubernetes")
    overlay = tmp_path / "kubernetes" / "overlays" / "scale"
    kustomization = overlay / "kustomization.yaml"
    kustomization.write_text(
        kustomization.read_text().replace("  - router.yaml\n", "  - no-such-file.yaml\n")
    )
    result = kustomize(overlay)
    assert result.returncode != 0
    assert "no-such-file.yaml" in result.stderr


def test_another_namespace_carries_the_router_binding_along(tmp_path):
    shutil.copytree(KUBE, tmp_path / "kubernetes")
    mine = tmp_path / "kubernetes" / "overlays" / "mine"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text("namespace: llm\nresources:\n  - ../scale\n")
    result = kustomize(mine)
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    binding = one(docs, "RoleBinding", "router-pod-discovery")
    assert binding["metadata"]["namespace"] == "llm"
    assert binding["subjects"][0]["namespace"] == "llm"


def gpu_problems(docs: list[dict]) -> list[str]:
    """What in the vLLM pod is not `the GPUs its preset's TP group spans, on the xe driver,
    and the host memory the preset needs`."""
    from arcvllm.operate.replicas import tensor_parallel

    (vllm,) = one(docs, "StatefulSet", "vllm")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    preset = presets.get_preset(env["ARCVLLM_PRESET"])
    problems = []
    for kind in ("requests", "limits"):
        gpus = vllm["resources"][kind].get("gpu.intel.com/xe")
        if gpus != tensor_parallel(preset) or gpus != preset.gpus:
            problems.append(f"{kind} gpu.intel.com/xe {gpus} for {preset.name}")
    if "gpu.intel.com/i915" in str(vllm["resources"]):
        problems.append("an i915 GPU")
    limit = vllm["resources"]["limits"]["memory"]
    if not limit.endswith("Gi") or int(limit[:-2]) < preset.host_ram_gib:
        problems.append(f"memory limit {limit} < {preset.host_ram_gib} GiB for {preset.name}")
    return problems


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_replica_gets_its_presets_b70s_on_the_xe_driver_and_waits_for_its_model(overlay):
    docs = built(overlay)
    assert gpu_problems(docs) == []
    pod = one(docs, "StatefulSet", "vllm")["spec"]["template"]["spec"]
    (vllm,) = pod["containers"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert vllm[probe]["httpGet"] == {"path": "/health", "port": "http"}
    startup = vllm["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 15 * 60
    mounts = {m["mountPath"]: m for m in vllm["volumeMounts"]}
    assert mounts["/models"]["readOnly"] is True
    assert "/var/cache/arcvllm" in mounts and "/dev/shm" in mounts


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_everything_lands_in_one_namespace(overlay):
    for doc in built(overlay):
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == "arcvllm", doc["metadata"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_runs_as_non_root_without_privileges(overlay):
    docs = built(overlay)
    pods = [
        d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")
    ]
    assert pods
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        for c in pod["containers"] + pod.get("initContainers", []):
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    ns = one(docs, "Namespace", "arcvllm")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.parametrize(
    ("overlay", "count", "gpus", "preset"),
    [
        ("scale-2x2-b70", 2, 2, "qwen3.6-35b-a3b-w4a16-2xb70"),
        ("four-b70-tp4", 1, 4, "qwen3-next-80b-a3b-w4a16-4xb70"),
    ],
)
def test_the_4x_b70_overlays_ask_k_gpus_a_replica_for_a_tp_k_preset(overlay, count, gpus, preset):
    sts = one(built(overlay), "StatefulSet", "vllm")
    (vllm,) = sts["spec"]["template"]["spec"]["containers"]
    assert sts["spec"]["replicas"] == count
    assert vllm["resources"]["limits"]["gpu.intel.com/xe"] == gpus
    assert {e["name"]: e.get("value") for e in vllm["env"]}["ARCVLLM_PRESET"] == preset
    assert vllm["image"] == "arcvllm:xpu-0.33"


def test_a_component_of_k_gpus_with_a_preset_of_another_tp_is_caught(tmp_path):
    """The check above can fail: the TP=2 component under the one-GPU preset."""
    shutil.copytree(KUBE, tmp_path / "kubernetes")
    mine = tmp_path / "kubernetes" / "overlays" / "mine"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(
        "resources:\n  - ../scale\ncomponents:\n  - ../../components/gpus-per-replica-2\n"
    )
    result = kustomize(mine)
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert gpu_problems(docs) == [
        "requests gpu.intel.com/xe 2 for qwen3.6-35b-a3b-w4a16-1xb70",
        "limits gpu.intel.com/xe 2 for qwen3.6-35b-a3b-w4a16-1xb70",
    ]


def test_a_component_of_k_gpus_over_a_moved_request_fails_to_build(tmp_path):
    shutil.copytree(KUBE, tmp_path / "kubernetes")
    sts = tmp_path / "kubernetes" / "base" / "vllm-statefulset.yaml"
    sts.write_text(sts.read_text().replace("gpu.intel.com/xe: 1", "gpu.intel.com/xe: 3", 1))
    result = kustomize(tmp_path / "kubernetes" / "overlays" / "scale-2x2-b70")
    assert result.returncode != 0
    assert "test" in result.stderr


def test_the_router_discovers_pods_in_its_namespace_with_the_least_rbac():
    docs = built("scale")
    assert one(docs, "StatefulSet", "vllm")["spec"]["replicas"] == 2
    router = one(docs, "Deployment", "router")["spec"]["template"]["spec"]
    args = router["containers"][0]["args"]
    assert "--service-discovery" in args
    assert args[args.index("--service-discovery-namespace") + 1] == "$(POD_NAMESPACE)"
    assert args[args.index("--service-discovery-port") + 1] == "8000"
    assert router["serviceAccountName"] == "router"
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    role = one(docs, "Role", "router-pod-discovery")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    binding = one(docs, "RoleBinding", "router-pod-discovery")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "router", "namespace": "arcvllm"}
    ]
    assert binding["metadata"]["namespace"] == "arcvllm"
    # The replicas never talk to the API server.
    vllm = one(docs, "StatefulSet", "vllm")["spec"]["template"]["spec"]
    assert vllm["automountServiceAccountToken"] is False
    service = one(docs, "Service", "router")
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "router"
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"


def test_scale_out_flag_only_where_the_release_needs_it():
    def args(overlay: str) -> list[str]:
        pod = one(built(overlay), "StatefulSet", "vllm")["spec"]["template"]["spec"]
        return pod["containers"][0].get("args", [])

    assert "--enable-scale-out" not in args("scale")  # xpu-0.23: render without the flag
    assert args("scale-xpu-0.33") == ["$(ARCVLLM_PRESET)", "--enable-scale-out"]


# ---- the GPU's device node: the runtime hands it to the pod's user, no GID is shipped ----

DEPLOY_DOC = ROOT / "docs" / "deploy.md"


def image_uid() -> int:
    """The serving user's UID in the runtime stage of docker/Dockerfile (ARG UID=...)."""
    text = (ROOT / "docker" / "Dockerfile").read_text()
    runtime = text[text.index(" AS runtime-content\n") :]
    return int(re.search(r"^ARG UID=(\d+)$", runtime, flags=re.M).group(1))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_vllm_pod_runs_as_the_images_user_and_names_no_render_gid(overlay):
    """A render GID (it was 992) is right on some nodes only; with the runtime's
    device_ownership_from_security_context the node belongs to runAsUser/runAsGroup."""
    pod = one(built(overlay), "StatefulSet", "vllm")["spec"]["template"]["spec"]
    uid = image_uid()
    context = pod["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"], context["fsGroup"]) == (uid, uid, uid)
    assert "supplementalGroups" not in context
    for container in pod["containers"]:
        assert "supplementalGroups" not in container.get("securityContext", {})


def test_no_shipped_manifest_carries_a_numeric_group():
    for path in sorted(KUBE.rglob("*.yaml")):
        text = path.read_text()
        assert not re.search(r"supplementalGroups:\s*\[?\s*-?\s*\d", text), path


def docs_overlay(doc: Path, marker: str, tmp_path: Path) -> list[dict]:
    """The one kustomization in DOC's yaml blocks that mentions MARKER, built over a copy
    of deploy/kubernetes as an operator's own overlay would be."""
    (block,) = [
        textwrap.dedent(b)
        for b in re.findall(r"```yaml\n(.*?)```", doc.read_text(), flags=re.S)
        if marker in b
    ]
    shutil.copytree(KUBE, tmp_path / "deploy" / "kubernetes")
    mine = tmp_path / "my-overlay"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(block)
    result = kustomize(mine)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def test_the_docs_overlay_for_clusters_without_device_ownership_adds_the_nodes_gid(tmp_path):
    docs = docs_overlay(DEPLOY_DOC, "supplementalGroups", tmp_path)
    context = one(docs, "StatefulSet", "vllm")["spec"]["template"]["spec"]["securityContext"]
    assert context["supplementalGroups"] == [993] and context["runAsUser"] == image_uid()
    manifest = tmp_path / "mine.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    checked = validate(manifest)
    assert checked.returncode == 0, checked.stdout + checked.stderr


# ---- who reaches what: the NetworkPolicies, evaluated for real and forged pods ---------
#
# Each policy is read as the API server would hold it and evaluated in Python for a set
# of candidates: the pods these manifests make, the cluster's DNS and Prometheus, pods an
# ordinary workload could make (any labels in any namespace it may use, labels on a
# namespace it may edit), and addresses outside the cluster. A connection is allowed
# when the source's egress and the destination's ingress both allow it; a pod no policy
# selects for a direction is open in that direction (NetworkPolicy's semantics).

NAMESPACE = "arcvllm"
ROUTER = {"app.kubernetes.io/name": "arcvllm", "app.kubernetes.io/component": "router"}
MONITORING = "monitoring"  # where the manifests expect the cluster's Prometheus
PORTS = [(53, "UDP"), (53, "TCP"), (443, "TCP"), (6443, "TCP"), (8000, "TCP")]
PORTS += [(8443, "TCP"), (9400, "TCP"), (29000, "TCP"), (9999, "TCP")]


@dataclass
class Peer:
    """A pod (its labels, namespace and the namespace's labels) or an address."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    namespace: str | None = None  # None: an address outside the cluster's pods
    namespace_labels: dict[str, str] = field(default_factory=dict)
    ip: str = "10.244.9.9"

    @property
    def ns_labels(self) -> dict[str, str]:
        # Set by the API server on every namespace, from its name: nobody can forge it.
        if self.namespace is None:
            return {}
        return {**self.namespace_labels, "kubernetes.io/metadata.name": self.namespace}


def selects(selector: dict, labels: dict) -> bool:
    """A label selector (matchLabels and matchExpressions); {} selects everything."""
    assert set(selector) <= {"matchLabels", "matchExpressions"}, selector
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def policies(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["kind"] == "NetworkPolicy"]


def policy_types(policy: dict) -> list[str]:
    spec = policy["spec"]
    return spec.get("policyTypes") or ["Ingress"] + (["Egress"] if "egress" in spec else [])


def peer_matches(peer: dict, other: Peer, policy_namespace: str) -> bool:
    if "ipBlock" in peer:
        # Matched against pod addresses too: some plugins (Calico) do.
        block = peer["ipBlock"]
        address = ipaddress.ip_address(other.ip)
        return address in ipaddress.ip_network(block["cidr"]) and not any(
            address in ipaddress.ip_network(e) for e in block.get("except", [])
        )
    if other.namespace is None:
        return False
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], other.ns_labels):
            return False
    elif other.namespace != policy_namespace:
        return False
    return selects(peer.get("podSelector", {}), other.labels)


def port_matches(rule: dict, port: int, protocol: str) -> bool:
    if not rule.get("ports"):
        return True
    for p in rule["ports"]:
        if p.get("protocol", "TCP") != protocol:
            continue
        if "port" not in p:
            return True
        assert isinstance(p["port"], int), f"named port {p['port']}: give the number"
        if p["port"] <= port <= p.get("endPort", p["port"]):
            return True
    return False


def admits(docs: list[dict], pod: Peer, other: Peer, port: int, protocol: str, way: str) -> bool:
    """Does POD's side allow the connection with OTHER (way: Ingress or Egress)?"""
    if pod.namespace is None:
        return True  # an address outside: no policy of ours applies to it
    field_, peers_key = ("ingress", "from") if way == "Ingress" else ("egress", "to")
    isolating = [
        p
        for p in policies(docs)
        if p["metadata"]["namespace"] == pod.namespace
        and selects(p["spec"]["podSelector"], pod.labels)
        and way in policy_types(p)
    ]
    if not isolating:
        return True
    for policy in isolating:
        for rule in policy["spec"].get(field_) or []:
            peers = rule.get(peers_key)
            matched = not peers or any(
                peer_matches(peer, other, policy["metadata"]["namespace"]) for peer in peers
            )
            if matched and port_matches(rule, port, protocol):
                return True
    return False


def reaches(docs: list[dict], src: Peer, dst: Peer, port: int, protocol: str = "TCP") -> bool:
    return admits(docs, src, dst, port, protocol, "Egress") and admits(
        docs, dst, src, port, protocol, "Ingress"
    )


def pod_template(docs: list[dict], kind: str, name: str) -> dict:
    return one(docs, kind, name)["spec"]["template"]


def workloads(docs: list[dict]) -> dict[str, Peer]:
    """The pods these manifests make, by workload name, with their namespace's labels."""
    ns = one(docs, "Namespace", NAMESPACE)["metadata"].get("labels", {})
    return {
        d["metadata"]["name"]: Peer(
            d["metadata"]["name"],
            d["spec"]["template"]["metadata"]["labels"],
            d["metadata"]["namespace"],
            ns,
            f"10.244.1.{i}",
        )
        for i, d in enumerate(docs)
        if d["kind"] in ("Deployment", "StatefulSet")
    }


def others(docs: list[dict]) -> dict[str, Peer]:
    """The cluster around, and what a workload that is not ours could make itself."""
    return {
        "prometheus": Peer(
            "prometheus", {"app.kubernetes.io/name": "prometheus"}, MONITORING, ip="10.244.2.1"
        ),
        "kube-dns": Peer("kube-dns", {"k8s-app": "kube-dns"}, "kube-system", ip="10.244.2.2"),
        "apiserver": Peer("apiserver", ip=apiserver_address(docs)),
        "client outside": Peer("client outside", ip="203.0.113.7"),
        # Ordinary labels: anyone who may run a pod can set them.
        "pod labelled arcvllm/gateway=true": Peer(
            "pod labelled arcvllm/gateway=true", {"arcvllm/gateway": "true"}, NAMESPACE
        ),
        "pod in a namespace labelled arcvllm/gateway=true": Peer(
            "pod in a namespace labelled arcvllm/gateway=true",
            {"app.kubernetes.io/name": "ingress-nginx"},
            "ingress-nginx",
            {"arcvllm/gateway": "true"},
        ),
        "prometheus-named pod in a namespace labelled arcvllm/prometheus=true": Peer(
            "prometheus-named pod in a namespace labelled arcvllm/prometheus=true",
            {"app.kubernetes.io/name": "prometheus"},
            "team-a",
            {"arcvllm/prometheus": "true"},
        ),
        "pod of another namespace": Peer(
            "pod of another namespace", {"app": "web"}, "default", ip="10.244.3.1"
        ),
    }


def apiserver_address(docs: list[dict]) -> str:
    """The address the router's egress names for the API server (a placeholder ships)."""
    blocks = [
        peer["ipBlock"]["cidr"]
        for p in policies(docs)
        if selects(p["spec"]["podSelector"], ROUTER)
        for rule in p["spec"].get("egress") or []
        for peer in rule.get("to") or []
        if "ipBlock" in peer
    ]
    return str(ipaddress.ip_network(blocks[0])[0]) if blocks else "192.0.2.1"


def reachability(docs: list[dict]) -> set[tuple[str, str, int, str]]:
    """(source, destination, port, protocol) for every allowed connection that involves a
    pod of this namespace."""
    peers = {**workloads(docs), **others(docs)}
    return {
        (src.name, dst.name, port, protocol)
        for src in peers.values()
        for dst in peers.values()
        if src is not dst and NAMESPACE in (src.namespace, dst.namespace)
        for port, protocol in PORTS
        if reaches(docs, src, dst, port, protocol)
    }


def into(matrix: set, name: str) -> set[tuple[str, int, str]]:
    return {(s, port, proto) for s, d, port, proto in matrix if d == name}


def out_of(matrix: set, name: str) -> set[tuple[str, int, str]]:
    return {(d, port, proto) for s, d, port, proto in matrix if s == name}


DNS = {("kube-dns", 53, "UDP"), ("kube-dns", 53, "TCP")}
SCALE_OVERLAYS = ("scale", "scale-xpu-0.33", "scale-2x2-b70")


def outside_the_namespace(docs: list[dict]) -> list[str]:
    return [p.name for p in others(docs).values() if p.namespace != NAMESPACE]


POLICIES = {"default-deny", "gateway", "gateway-upstream", "prometheus-to-vllm", "vllm"}
POLICIES_OF_THE_ROUTER = {"router", "router-to-apiserver", "prometheus-to-router"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_policy_is_one_a_test_below_reads(overlay):
    docs = built(overlay)
    expected = POLICIES | (POLICIES_OF_THE_ROUTER if overlay in SCALE_OVERLAYS else set())
    assert sorted(p["metadata"]["name"] for p in policies(docs)) == sorted(expected)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_policy_default_deny_isolates_every_pod_of_the_namespace_both_ways(overlay):
    docs = built(overlay)
    (deny,) = [p for p in policies(docs) if p["metadata"]["name"] == "default-deny"]
    assert deny["spec"]["podSelector"] == {}
    assert sorted(deny["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    assert not deny["spec"].get("ingress") and not deny["spec"].get("egress")
    # A pod these manifests do not make gets nothing in and nothing out, DNS included.
    matrix = reachability(docs)
    stranger = "pod labelled arcvllm/gateway=true"
    assert into(matrix, stranger) == set()
    assert out_of(matrix, stranger) == set()


@pytest.mark.parametrize("overlay", SCALE_OVERLAYS)
def test_policy_vllm_behind_the_router_takes_the_router_and_prometheus_sends_only_dns(overlay):
    docs = built(overlay)
    one(docs, "NetworkPolicy", "vllm")
    matrix = reachability(docs)
    assert into(matrix, "vllm") == {("router", 8000, "TCP"), ("prometheus", 8000, "TCP")}
    assert out_of(matrix, "vllm") == DNS


def test_policy_vllm_alone_takes_the_gateway_and_prometheus_sends_only_dns():
    docs = built("one-b70")
    one(docs, "NetworkPolicy", "vllm")
    matrix = reachability(docs)
    assert into(matrix, "vllm") == {("gateway", 8000, "TCP"), ("prometheus", 8000, "TCP")}
    assert out_of(matrix, "vllm") == DNS


@pytest.mark.parametrize("overlay", SCALE_OVERLAYS)
def test_policy_router_takes_the_gateway_and_prometheus_reaches_replicas_and_apiserver(overlay):
    docs = built(overlay)
    one(docs, "NetworkPolicy", "router")
    one(docs, "NetworkPolicy", "router-to-apiserver")
    matrix = reachability(docs)
    assert into(matrix, "router") == {("gateway", 8000, "TCP"), ("prometheus", 29000, "TCP")}
    assert out_of(matrix, "router") == DNS | {
        ("vllm", 8000, "TCP"),
        ("apiserver", 443, "TCP"),
        ("apiserver", 6443, "TCP"),
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_policy_gateway_takes_anyone_on_its_port_and_reaches_only_its_upstream(overlay):
    docs = built(overlay)
    one(docs, "NetworkPolicy", "gateway")
    one(docs, "NetworkPolicy", "gateway-upstream")
    matrix = reachability(docs)
    # The entry: TLS and the key are its defence, any address may try them. Pods of this
    # namespace cannot (their egress is denied).
    assert into(matrix, "gateway") == {(n, 8443, "TCP") for n in outside_the_namespace(docs)}
    upstream = "router" if "router" in workloads(docs) else "vllm"
    assert out_of(matrix, "gateway") == DNS | {(upstream, 8000, "TCP")}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_policy_prometheus_reaches_vllms_port_and_the_routers_metrics_port_only(overlay):
    """A policy cannot restrict paths: the Prometheus pods reach every path of vLLM's port
    (docs/deploy.md says which); the router only on its metrics port."""
    docs = built(overlay)
    scrapes = [p for p in policies(docs) if p["metadata"]["name"].startswith("prometheus-to-")]
    assert scrapes
    for scrape in scrapes:
        (rule,) = scrape["spec"]["ingress"]
        assert rule["from"] == [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": MONITORING}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
            }
        ]
    expected = {("vllm", 8000, "TCP")}
    if "router" in workloads(docs):
        expected.add(("router", 29000, "TCP"))
    reached = out_of(reachability(docs), "prometheus")
    assert reached - {("gateway", 8443, "TCP")} == expected


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_label_an_ordinary_pod_or_namespace_can_carry_opens_vllm_or_the_router(overlay):
    docs = built(overlay)
    matrix = reachability(docs)
    forged = {n for n in others(docs) if "labelled" in n}
    for name in ("vllm", "router"):
        assert not {s for s, _, _ in into(matrix, name)} & forged, name
    # Every peer that opens a port of ours is a pod of these manifests (selected in this
    # namespace by its own labels), a namespace by its name, or an address block.
    own = [p.labels for p in workloads(docs).values()]
    for policy in policies(docs):
        rules = policy["spec"].get("ingress", []) + policy["spec"].get("egress", [])
        for rule in rules:
            for peer in rule.get("from", []) + rule.get("to", []):
                if "namespaceSelector" in peer:
                    (key,) = peer["namespaceSelector"]["matchLabels"]
                    assert key == "kubernetes.io/metadata.name", policy["metadata"]["name"]
                elif "podSelector" in peer:
                    assert any(selects(peer["podSelector"], labels) for labels in own)
                    assert "app.kubernetes.io/component" in peer["podSelector"]["matchLabels"]


@pytest.mark.parametrize("overlay", SCALE_OVERLAYS)
def test_a_pod_given_the_gateways_own_labels_here_passes_as_the_gateway(overlay):
    """The limit docs/deploy.md states: in this namespace a pod is who its labels say;
    only RBAC that lets nobody else create pods here keeps an impostor out."""
    docs = built(overlay)
    labels = pod_template(docs, "Deployment", "gateway")["metadata"]["labels"]
    impostor = Peer("impostor", labels, NAMESPACE)
    router = workloads(docs)["router"]
    assert reaches(docs, impostor, router, 8000)
    assert not reaches(docs, impostor, workloads(docs)["vllm"], 8000)
    text = DEPLOY_DOC.read_text()
    assert "What someone who can create pods in `arcvllm` can do" in text
    assert "kubectl auth can-i create pods -n arcvllm" in text


def test_a_policy_that_admits_everyone_is_caught():
    docs = built("scale")
    policy = one(docs, "NetworkPolicy", "vllm")
    policy["spec"]["ingress"][0]["from"].append({"namespaceSelector": {}})
    matrix = reachability(docs)
    assert ("pod of another namespace", 8000, "TCP") in into(matrix, "vllm")
    assert into(matrix, "vllm") != {("router", 8000, "TCP"), ("prometheus", 8000, "TCP")}


def test_a_namespace_label_as_the_gateway_is_caught():
    """The opening the manifests had: a namespace anyone may label arcvllm/gateway=true."""
    docs = built("scale")
    rule = one(docs, "NetworkPolicy", "router")["spec"]["ingress"][0]
    rule["from"].append({"namespaceSelector": {"matchLabels": {"arcvllm/gateway": "true"}}})
    matrix = reachability(docs)
    assert ("pod in a namespace labelled arcvllm/gateway=true", 8000, "TCP") in into(
        matrix, "router"
    )


def test_an_egress_rule_without_peers_is_caught():
    docs = built("scale")
    one(docs, "NetworkPolicy", "vllm")["spec"]["egress"].append({"ports": [{"port": 443}]})
    assert ("client outside", 443, "TCP") in out_of(reachability(docs), "vllm")


# ---- the gateway: the only entry ---------------------------------------------------------

ENTRYPOINT = ROOT / "docker" / "gateway-entrypoint.sh"


def gateway(docs: list[dict]) -> tuple[dict, dict]:
    """The gateway's pod spec and its one container."""
    pod = pod_template(docs, "Deployment", "gateway")["spec"]
    (container,) = pod["containers"]
    return pod, container


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_gateways_service_is_the_only_one_exposed(overlay):
    docs = built(overlay)
    services = [d for d in docs if d["kind"] == "Service"]
    exposed = [s for s in services if s["spec"].get("type", "ClusterIP") != "ClusterIP"]
    assert [s["metadata"]["name"] for s in exposed] == ["arcvllm"]
    (entry,) = exposed
    labels = pod_template(docs, "Deployment", "gateway")["metadata"]["labels"]
    assert selects({"matchLabels": entry["spec"]["selector"]}, labels)
    assert entry["spec"]["ports"] == [
        {"name": "https", "port": 443, "protocol": "TCP", "targetPort": "https"}
    ]
    # The client's own address reaches the gateway: its rate limit is per client.
    assert entry["spec"]["externalTrafficPolicy"] == "Local"
    for service in services:
        assert not service["spec"].get("externalIPs"), service["metadata"]["name"]
    assert not [d for d in docs if d["kind"] in ("Ingress", "Gateway", "HTTPRoute")]
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            pod = d["spec"]["template"]["spec"]
            assert not pod.get("hostNetwork")
            for c in pod["containers"]:
                assert all("hostPort" not in p for p in c.get("ports", []))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_gateway_reads_the_key_and_its_certificate_from_required_secrets(overlay):
    docs = built(overlay)
    pod, container = gateway(docs)
    env = {e["name"]: e.get("value") for e in container["env"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}

    def secret_file(path: str) -> tuple[str, str]:
        folder, _, item = path.rpartition("/")
        mount = mounts[folder]
        assert mount["readOnly"] is True
        secret = volumes[mount["name"]]["secret"]
        assert secret["optional"] is False
        assert item in [i["path"] for i in secret["items"]]
        return secret["secretName"], next(i["key"] for i in secret["items"] if i["path"] == item)

    assert secret_file(env["VLLM_API_KEY_FILE"]) == ("arcvllm-api-key", "key")  # vLLM's too
    assert secret_file(env["GATEWAY_TLS_CERT"]) == ("arcvllm-gateway-tls", "tls.crt")
    assert secret_file(env["GATEWAY_TLS_KEY"]) == ("arcvllm-gateway-tls", "tls.key")
    assert "VLLM_API_KEY" not in env
    assert env["GATEWAY_DIAGNOSTIC_ROUTES"] == "0"


def entrypoint_settings() -> set[str]:
    """What docker/gateway-entrypoint.sh reads: ${NAME...}, and `given NAME` (a file)."""
    text = ENTRYPOINT.read_text()
    return set(re.findall(r"\$\{(\w+)[:}-]", text) + re.findall(r"\bgiven (\w+)", text))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_gateway_setting_is_one_its_entrypoint_reads(overlay):
    _, container = gateway(built(overlay))
    env = container["env"]
    referenced = set(re.findall(r"\$\((\w+)\)", json.dumps(env)))
    for e in env:
        assert e["name"] in entrypoint_settings() | referenced, e["name"]


@pytest.mark.parametrize(("overlay", "service"), [("one-b70", "vllm"), ("scale", "router")])
def test_the_gateway_proxies_its_overlays_server_by_its_full_name(overlay, service):
    """nginx resolves the upstream itself, per request, without resolv.conf's search list:
    the name is the Service's full one, in the pod's own namespace."""
    docs = built(overlay)
    _, container = gateway(docs)
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    names = [e["name"] for e in container["env"]]
    assert names.index("POD_NAMESPACE") < names.index("GATEWAY_UPSTREAM")
    upstream = env["GATEWAY_UPSTREAM"]["value"]
    assert upstream == f"http://{service}.$(POD_NAMESPACE).svc.cluster.local:8000"
    (pattern,) = re.findall(
        r"check GATEWAY_UPSTREAM \"\$UPSTREAM\" '([^']+)'", ENTRYPOINT.read_text()
    )
    assert re.fullmatch(pattern, upstream.replace("$(POD_NAMESPACE)", NAMESPACE))
    target = one(docs, "Service", service)
    assert 8000 in [p["port"] for p in target["spec"]["ports"]]
    upstream_pods = workloads(docs)[service].labels
    assert selects({"matchLabels": target["spec"]["selector"]}, upstream_pods)


def test_another_namespace_moves_the_gateways_upstream_along(tmp_path):
    shutil.copytree(KUBE, tmp_path / "kubernetes")
    mine = tmp_path / "kubernetes" / "overlays" / "mine"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text("namespace: llm\nresources:\n  - ../scale\n")
    result = kustomize(mine)
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    _, container = gateway(docs)
    env = {e["name"]: e for e in container["env"]}
    assert "$(POD_NAMESPACE)" in env["GATEWAY_UPSTREAM"]["value"]
    assert {p["metadata"]["namespace"] for p in policies(docs)} == {"llm"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_gateway_runs_read_only_with_its_run_folder_in_memory(overlay):
    pod, container = gateway(built(overlay))
    assert pod["automountServiceAccountToken"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # The entrypoint writes the config and the key map under $TMPDIR (default /tmp).
    (tmp,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == tmp["name"]]
    assert volume["emptyDir"]["medium"] == "Memory" and volume["emptyDir"]["sizeLimit"]
    assert container["resources"]["requests"]["cpu"]
    assert container["resources"]["limits"]["memory"]
    (port,) = container["ports"]
    assert port == {"name": "https", "containerPort": 8443}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env.get("GATEWAY_PORT", "8443") == "8443"
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["tcpSocket"] == {"port": "https"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_gateway_stops_gracefully_within_the_servers_grace_period(overlay):
    """Kubernetes sends SIGTERM (nginx's fast stop, which cuts streams); the preStop hook
    asks nginx (PID 1: the entrypoint execs it) for its graceful stop and waits."""
    docs = built(overlay)
    pod, container = gateway(docs)
    (command,) = [container["lifecycle"]["preStop"]["exec"]["command"]]
    assert command[:2] == ["/bin/sh", "-c"]
    assert re.search(r"^sleep \d+; kill -QUIT 1;", command[2])
    assert "exec nginx" in ENTRYPOINT.read_text()
    vllm = pod_template(docs, "StatefulSet", "vllm")["spec"]
    assert pod["terminationGracePeriodSeconds"] >= vllm["terminationGracePeriodSeconds"]


def test_the_docs_overlay_for_another_prometheus_namespace_and_the_apiserver(tmp_path):
    docs = docs_overlay(DEPLOY_DOC, "kubernetes.io~1metadata.name", tmp_path)
    manifest = tmp_path / "mine.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    checked = validate(manifest)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    prometheus = Peer(
        "prometheus", {"app.kubernetes.io/name": "prometheus"}, "observability", ip="10.244.2.1"
    )
    pods = workloads(docs)
    assert reaches(docs, prometheus, pods["vllm"], 8000)
    assert reaches(docs, prometheus, pods["router"], 29000)
    assert not reaches(docs, others(docs)["prometheus"], pods["vllm"], 8000)
    assert apiserver_address(docs) == "10.0.0.10"
    assert reaches(docs, pods["router"], Peer("apiserver", ip="10.0.0.10"), 6443)
    assert not reaches(docs, pods["router"], Peer("elsewhere", ip="10.0.0.11"), 6443)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_workload_has_a_disruption_budget(overlay):
    docs = built(overlay)
    budgets = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    for workload in (d for d in docs if d["kind"] in ("Deployment", "StatefulSet")):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        (pdb,) = [b for b in budgets if selects(b["spec"]["selector"], labels)]
        spec = pdb["spec"]
        if workload["kind"] == "StatefulSet":
            assert spec == {**spec, "maxUnavailable": 1}  # one replica reloads at a time
        else:
            assert spec["minAvailable"] == 1 and workload["spec"]["replicas"] == 2


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_vllm_drops_out_of_the_endpoints_and_drains_within_its_grace_period(overlay):
    pod = pod_template(built(overlay), "StatefulSet", "vllm")["spec"]
    (vllm,) = pod["containers"]
    command = vllm["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep" and 5 <= int(command[1]) <= 15
    # The pod's preset drains (its own --shutdown-timeout), and any preset it could be
    # switched to drains within the grace period too.
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert presets.get_preset(env["ARCVLLM_PRESET"]).shutdown_timeout
    longest = max(p.shutdown_timeout or 0 for p in presets.load_all().values())
    assert pod["terminationGracePeriodSeconds"] > int(command[1]) + longest


def test_two_routers_spread_over_nodes():
    pod = pod_template(built("scale"), "Deployment", "router")["spec"]
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == ROUTER
    assert pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_replicas_land_on_b70_nodes_only(overlay):
    """Every term (they are ORed) needs Intel's GPU label and the B70's PCI device label."""
    pod = pod_template(built(overlay), "StatefulSet", "vllm")["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms
    for term in terms:
        keys = {e["key"]: e for e in term["matchExpressions"]}
        assert keys["intel.feature.node.kubernetes.io/gpu"]["values"] == ["true"]
        (device,) = [k for k in keys if k.startswith("gpu.intel.com/device-id.")]
        assert re.fullmatch(r"gpu\.intel\.com/device-id\.03[08]0-e223\.present", device)
        assert keys[device]["operator"] == "In" and keys[device]["values"] == ["true"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_api_key_secret_is_required_and_a_file(overlay):
    pod = pod_template(built(overlay), "StatefulSet", "vllm")["spec"]
    assert "optional: true" not in yaml.safe_dump(pod)
    (vllm,) = pod["containers"]
    env = {e["name"]: e for e in vllm["env"]}
    assert "VLLM_API_KEY" not in env  # never the key itself in the environment spec
    (volume,) = [v for v in pod["volumes"] if v["name"] == "api-key"]
    assert volume["secret"]["secretName"] == "arcvllm-api-key"
    assert volume["secret"]["optional"] is False
    (mount,) = [m for m in vllm["volumeMounts"] if m["name"] == "api-key"]
    assert mount["readOnly"] is True
    (item,) = volume["secret"]["items"]
    assert env["VLLM_API_KEY_FILE"]["value"] == f"{mount['mountPath']}/{item['path']}"


def model_check(overlay: str = "scale") -> dict:
    pod = pod_template(built(overlay), "StatefulSet", "vllm")["spec"]
    (init,) = pod["initContainers"]
    return init


def test_the_model_check_looks_where_the_preset_serves_from():
    sts = one(built("scale"), "StatefulSet", "vllm")["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in sts["containers"][0]["env"] if "value" in e}
    preset = yaml.safe_load(
        (ROOT / "configs" / "presets" / f"{env['ARCVLLM_PRESET']}.yaml").read_text()
    )
    init = model_check()
    assert {e["name"]: e["value"] for e in init["env"]}["MODEL_DIR"] == preset["model"]
    assert init["securityContext"]["allowPrivilegeEscalation"] is False
    assert init["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert {"mountPath": "/models", "name": "models", "readOnly": True} in init["volumeMounts"]


@pytest.mark.parametrize("filled", [False, True])
def test_an_empty_model_claim_stops_the_pod_in_one_line(tmp_path, filled):
    init = model_check()
    model = tmp_path / "models" / "m"
    model.mkdir(parents=True)
    if filled:
        (model / "config.json").write_text("{}")
    result = subprocess.run(
        init["command"],
        env={"PATH": "/usr/bin:/bin", "MODEL_DIR": str(model)},
        capture_output=True,
        text=True,
        timeout=10,
    )
    if filled:
        assert result.returncode == 0 and result.stderr == ""
    else:
        assert result.returncode == 3
        assert result.stderr.splitlines() == [
            f"arcvllm: no model in {model} (no config.json): fill the claim models first"
            " (docs/scale.md, Kubernetes prerequisites)"
        ]


def test_the_model_claim_names_a_storage_class():
    claim = one(built("scale"), "PersistentVolumeClaim", "models")["spec"]
    assert claim["accessModes"] == ["ReadOnlyMany"]
    assert claim["storageClassName"]


def test_the_docs_overlay_names_the_storage_class_of_the_model_claim(tmp_path):
    docs = docs_overlay(ROOT / "docs" / "scale.md", "storageClassName", tmp_path)
    assert one(docs, "PersistentVolumeClaim", "models")["spec"]["storageClassName"] == "nfs-ro"


# ---- the canary (components/canary) -----------------------------------------------------


def with_canary(tmp_path: Path, overlay: str = "one-b70") -> list[dict]:
    """OVERLAY with the canary component, as an operator's overlay adds it (kustomize takes
    relative paths only: over a copy of deploy/kubernetes)."""
    kube = tmp_path / "deploy" / "kubernetes"
    shutil.copytree(KUBE, kube)
    mine = kube / "overlays" / "with-canary"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": NAMESPACE,
                "resources": [f"../{overlay}"],
                "components": ["../../components/canary"],
            }
        )
    )
    result = kustomize(mine)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def test_the_canary_builds_validates_and_runs_as_the_images_user_without_privileges(tmp_path):
    docs = with_canary(tmp_path)
    manifest = tmp_path / "canary.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    checked = validate(manifest)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    pod = pod_template(docs, "Deployment", "canary")["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == image_uid()
    (container,) = pod["containers"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    # The image of the deployment (kustomize's images: the same tag as the replica's).
    replica = pod_template(docs, "StatefulSet", "vllm")["spec"]["containers"][0]
    assert container["image"] == replica["image"]
    args = container["args"]
    assert args[:2] == ["arcvllm", "canary"]
    assert "--base-url=https://arcvllm.$(POD_NAMESPACE).svc" in args
    assert "--metrics-url=http://vllm.$(POD_NAMESPACE).svc:8000" in args
    # Its arguments parse as the command's own (the Secrets' files where it mounts them).
    from arcvllm import cli

    key, cert = tmp_path / "key", tmp_path / "tls.crt"
    key.write_text("k" * 32 + "\n")
    cert.write_text("")
    local = {
        "$(POD_NAMESPACE)": "arcvllm",
        "/run/secrets/arcvllm/key": str(key),
        "/run/secrets/arcvllm-tls/tls.crt": str(cert),
    }
    given = []
    for arg in args[1:]:
        for mounted, here in local.items():
            arg = arg.replace(mounted, here)
        given.append(arg)
    parsed = cli.build_parser().parse_args(given)
    assert parsed.metrics_url == ["http://vllm.arcvllm.svc:8000"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/run/secrets/arcvllm", "/run/secrets/arcvllm-tls"} <= mounts


def test_the_canary_reaches_the_gateway_and_the_replica_and_prometheus_reaches_it(tmp_path):
    docs = with_canary(tmp_path)
    assert {p["metadata"]["name"] for p in policies(docs)} == POLICIES | {
        "canary",
        "canary-to-vllm",
    }
    matrix = reachability(docs)
    assert out_of(matrix, "canary") == DNS | {("gateway", 8443, "TCP"), ("vllm", 8000, "TCP")}
    assert into(matrix, "canary") == {("prometheus", 9400, "TCP")}
    # The replica takes the canary beside the gateway and Prometheus, nobody else new.
    assert into(matrix, "vllm") == {
        ("gateway", 8000, "TCP"),
        ("prometheus", 8000, "TCP"),
        ("canary", 8000, "TCP"),
    }
    # Without the component nothing of it is there.
    base = built("one-b70")
    assert "canary" not in workloads(base)
