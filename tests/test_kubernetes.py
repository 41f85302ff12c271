"""deploy/kubernetes: every overlay builds with `kubectl kustomize` and validates strictly
against a pinned Kubernetes release's schemas (kubernetes-validate, offline)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

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
        for c in pod["containers"]:
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


def test_the_docs_overlay_for_clusters_without_device_ownership_adds_the_nodes_gid(tmp_path):
    text = DEPLOY_DOC.read_text()
    (block,) = [
        b for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.S) if "supplementalGroups" in b
    ]
    shutil.copytree(KUBE, tmp_path / "deploy" / "kubernetes")
    mine = tmp_path / "my-overlay"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(block)
    result = kustomize(mine)
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    context = one(docs, "StatefulSet", "vllm")["spec"]["template"]["spec"]["securityContext"]
    assert context["supplementalGroups"] == [993] and context["runAsUser"] == image_uid()
    manifest = tmp_path / "mine.yaml"
    manifest.write_text(result.stdout)
    checked = validate(manifest)
    assert checked.returncode == 0, checked.stdout + checked.stderr
