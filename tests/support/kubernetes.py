"""deploy/kubernetes as the tests read it: an overlay built with `kubectl kustomize`, a
manifest validated strictly against a pinned Kubernetes release's schemas
(kubernetes-validate, offline), one object of a build."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from support import ROOT

KUBE = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.32.0"  # the release the manifests are validated against


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail("no kubectl: `make tools` fetches Debian trixie's kubectl (any user)")
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
