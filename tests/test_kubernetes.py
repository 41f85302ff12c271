"""deploy/kubernetes: every overlay builds with `kubectl kustomize` and validates strictly
against a pinned Kubernetes release's schemas (kubernetes-validate, offline)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from arcvllm import presets

KUBE = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("one-b70", "scale", "scale-xpu-0.33")
KUBERNETES_VERSION = "1.32.0"  # the release the manifests are validated against


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail("no kubectl: `make tools` as root installs Debian's kubernetes-client")
    return path


def kubernetes_validate() -> str:
    path = Path(sys.executable).parent / "kubernetes-validate"
    if not path.exists():
        pytest.fail("no kubernetes-validate next to this Python: pip install -e '.[dev]'")
    return str(path)


def kustomize(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=60
    )


def validate(manifest: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [kubernetes_validate(), "-k", KUBERNETES_VERSION, "--strict", "--quiet", str(manifest)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def built(overlay: str) -> list[dict]:
    result = kustomize(KUBE / "overlays" / overlay)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def one(docs: list[dict], kind: str, name: str) -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


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


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_replica_gets_one_b70_on_the_xe_driver_and_waits_for_its_model(overlay):
    pod = one(built(overlay), "StatefulSet", "vllm")["spec"]["template"]["spec"]
    (vllm,) = pod["containers"]
    assert vllm["resources"]["limits"]["gpu.intel.com/xe"] == 1
    assert vllm["resources"]["requests"]["gpu.intel.com/xe"] == 1
    assert "gpu.intel.com/i915" not in str(vllm["resources"])
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
    service = one(docs, "Service", "arcvllm")
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "router"


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
    runtime = text[text.index(" AS runtime\n") :]
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


# ---- safe to expose: who reaches what, disruptions, shutdown, placement, key, model -----

ROUTER = {"app.kubernetes.io/name": "arcvllm", "app.kubernetes.io/component": "router"}
VLLM = {"app.kubernetes.io/name": "arcvllm", "app.kubernetes.io/component": "vllm"}
PROMETHEUS = {
    "namespaceSelector": {"matchLabels": {"arcvllm/prometheus": "true"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}
GATEWAY = {"namespaceSelector": {"matchLabels": {"arcvllm/gateway": "true"}}}
REPLICA_PEERS = [({"podSelector": {"matchLabels": ROUTER}}, 8000), (PROMETHEUS, 8000)]


def selects(selector: dict, labels: dict) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # no matchExpressions here
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def allowed(docs: list[dict], pod_labels: dict) -> list[tuple[dict, int]]:
    """(peer, port) for every ingress rule of every NetworkPolicy that selects the pod."""
    out = []
    for policy in (d for d in docs if d["kind"] == "NetworkPolicy"):
        if not selects(policy["spec"]["podSelector"], pod_labels):
            continue
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        for rule in policy["spec"]["ingress"]:
            for peer in rule["from"]:  # a rule without `from` would admit every source
                for port in rule["ports"]:
                    out.append((peer, port["port"]))
    return out


def canon(peer_port: tuple[dict, int]) -> str:
    return json.dumps(peer_port, sort_keys=True)


def pod_template(docs: list[dict], kind: str, name: str) -> dict:
    return one(docs, kind, name)["spec"]["template"]


@pytest.mark.parametrize("overlay", ("scale", "scale-xpu-0.33"))
def test_the_replicas_accept_only_the_router_and_prometheus(overlay):
    docs = built(overlay)
    labels = pod_template(docs, "StatefulSet", "vllm")["metadata"]["labels"]
    peers = allowed(docs, labels)
    assert sorted(map(canon, peers)) == sorted(map(canon, REPLICA_PEERS))
    # The router peer has no namespaceSelector: the router of this namespace only.
    router = pod_template(docs, "Deployment", "router")["metadata"]["labels"]
    assert any(selects(p.get("podSelector", {}), router) and len(p) == 1 for p, _ in peers)


def test_the_router_accepts_the_gateway_and_prometheus_on_its_own_ports():
    docs = built("scale")
    labels = pod_template(docs, "Deployment", "router")["metadata"]["labels"]
    assert sorted(map(canon, allowed(docs, labels))) == sorted(
        map(canon, [(GATEWAY, 8000), (PROMETHEUS, 29000)])
    )


def test_one_replica_without_a_router_takes_clients_from_the_gateway_namespace():
    docs = built("one-b70")
    labels = pod_template(docs, "StatefulSet", "vllm")["metadata"]["labels"]
    assert sorted(map(canon, allowed(docs, labels))) == sorted(
        map(
            canon,
            [({"podSelector": {"matchLabels": ROUTER}}, 8000), (PROMETHEUS, 8000), (GATEWAY, 8000)],
        )
    )


def test_a_policy_that_admits_everyone_is_caught():
    docs = built("scale")
    policy = one(docs, "NetworkPolicy", "vllm")
    policy["spec"]["ingress"][0]["from"].append({"namespaceSelector": {}})
    labels = pod_template(docs, "StatefulSet", "vllm")["metadata"]["labels"]
    assert sorted(map(canon, allowed(docs, labels))) != sorted(map(canon, REPLICA_PEERS))


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
