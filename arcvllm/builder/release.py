"""A release: every image built reproducibly, pushed, signed, its SBOM attached, one manifest.

Runs on the build host. For each stack of configs/stacks.yaml (and each side image):
build to an OCI layout with timestamps rewritten to the commit's time (arcvllm.builder.image),
push it as `arcvllm:<stack>-<version>` and `arcvllm:<stack>` to the registry, check the
registry holds the layout's digest, sign that digest with cosign (a key pair from
a file; the hosted workflow signs keyless), attach the image's own SBOM
(/opt/arcvllm/sbom.cdx.json) as a signed CycloneDX attestation, and write manifest.json
(stack -> digest, tags, vLLM version, patch plan, SBOM, signature). `verify` checks a
manifest's every digest against a public key, or the keyless signer's identity: an
unsigned, foreign-signed or altered digest fails.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from arcvllm.builder import disk, image
from arcvllm.errors import ArcvllmError, CheckFailed, UsageError

SBOM_PATH = "/opt/arcvllm/sbom.cdx.json"
KEYLESS = "keyless"  # --key keyless: cosign's keyless signing (the hosted workflow's OIDC)


@dataclass(frozen=True)
class Target:
    """One image of a release: a stack's server (kind server) or a side image."""

    name: str  # the stack or side image name
    kind: str  # server | side

    def repository(self) -> str:
        if self.kind == "server":
            return "arcvllm"
        from arcvllm import stack

        return stack.side_images()[self.name].image

    def tags(self, version: str) -> list[str]:
        if self.kind == "server":
            return [f"{self.name}-{version}", self.name]
        from arcvllm import stack

        tag = stack.side_images()[self.name].tag
        return [f"{tag}-{version}", tag]


def targets(stacks: Sequence[str] | None, sides: Sequence[str] | None) -> list[Target]:
    """The release's images: the named stacks (default all) and side images (default all)."""
    from arcvllm import stack

    all_stacks, _ = stack.load()
    all_sides = stack.side_images()
    chosen = list(stacks) if stacks is not None else list(all_stacks)
    for name in chosen:
        if name not in all_stacks:
            raise UsageError(f"unknown stack {name!r}; stacks: {', '.join(all_stacks)}")
    side_names = list(sides) if sides is not None else list(all_sides)
    for name in side_names:
        if name not in all_sides:
            raise UsageError(f"unknown side image {name!r}; {', '.join(all_sides)}")
    return [Target(n, "server") for n in chosen] + [Target(n, "side") for n in side_names]


def layout_digest(layout: Path) -> str:
    """The manifest digest an OCI layout directory holds (index.json's one manifest)."""
    index_file = layout / "index.json"
    if not index_file.is_file():
        raise ArcvllmError(f"{layout}: not an OCI layout (no index.json)")
    manifests = json.loads(index_file.read_text()).get("manifests") or []
    if len(manifests) != 1:
        raise ArcvllmError(f"{layout}: expected one manifest, found {len(manifests)}")
    return manifests[0]["digest"]


def _blob(layout: Path, digest: str) -> Path:
    path = layout / "blobs" / "sha256" / digest.split(":", 1)[1]
    if not path.is_file():
        raise ArcvllmError(f"{layout}: no blob {digest}")
    return path


def _manifest(layout: Path) -> dict:
    return json.loads(_blob(layout, layout_digest(layout)).read_bytes())


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


@contextlib.contextmanager
def _layer(path: Path) -> Iterator[tarfile.TarFile]:
    """A layer blob as a tar read front to back: gzip, uncompressed or zstd (the release's
    default; the standard library reads no zstd, the `stack` extra's zstandard does)."""
    with path.open("rb") as blob:
        if blob.read(4) != ZSTD_MAGIC:
            blob.seek(0)
            with tarfile.open(fileobj=blob, mode="r|*") as tar:
                yield tar
            return
        import zstandard

        blob.seek(0)
        with (
            zstandard.ZstdDecompressor().stream_reader(blob) as stream,
            tarfile.open(fileobj=stream, mode="r|") as tar,
        ):
            yield tar


def layout_files(layout: Path) -> dict[str, str]:
    """Every file of an OCI layout's image, layer by layer: path -> what it holds (mode,
    owner, mtime, size and sha256; the last layer that names a path wins), plus its config."""
    manifest = _manifest(layout)
    config = _blob(layout, manifest["config"]["digest"]).read_bytes()
    files = {"<image config>": hashlib.sha256(config).hexdigest()}
    for number, layer in enumerate(manifest["layers"]):
        with _layer(_blob(layout, layer["digest"])) as inner:
            for m in inner:
                # (a file member always has a reader)
                body = inner.extractfile(m).read() if m.isfile() else m.linkname.encode()  # type: ignore[union-attr]
                files[m.name] = (
                    f"layer {number} mode {m.mode:o} {m.uid}:{m.gid} mtime {m.mtime} "
                    f"size {m.size} sha256 {hashlib.sha256(body).hexdigest()[:16]}"
                )
    return files


def compare(first: Path, second: Path) -> list[str]:
    """The files that differ between two OCI layouts (empty when their digests agree)."""
    if layout_digest(first) == layout_digest(second):
        return []
    a, b = layout_files(first), layout_files(second)
    return [
        f"{path}: {a.get(path, 'absent')} | {b.get(path, 'absent')}"
        for path in sorted(set(a) | set(b))
        if a.get(path) != b.get(path)
    ]


def _run(argv: Sequence[str], what: str) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise ArcvllmError(f"{what} failed: {detail[-1] if detail else proc.returncode}")
    return proc.stdout


def cosign_flags(registry: str) -> list[str]:
    """A registry on this machine speaks plain http; any other is https."""
    return ["--allow-http-registry"] if _local(registry) else []


def provenance(spec: image.Build, digest: str, src: image.Source) -> dict:
    """A SLSA v1 provenance predicate: what built the image from which commit and inputs."""
    args = {**spec.args, **spec.extra_args}
    return {
        "buildDefinition": {
            "buildType": "https://github.com/arcvllm/arcvllm/make-release@v1",
            "externalParameters": {
                "target": spec.target,
                "stack": spec.stack.name,
                "dockerfile": "docker/Dockerfile",
            },
            "internalParameters": {"build_args": args, "source_date_epoch": src.epoch},
            "resolvedDependencies": [
                {"uri": f"git+{image.SOURCE}", "digest": {"gitCommit": src.revision}}
            ],
        },
        "runDetails": {
            "builder": {"id": "https://github.com/arcvllm/arcvllm/make-release"},
            "metadata": {"invocationId": digest},
        },
    }


def sbom_summary(path: Path) -> dict:
    """What the manifest says of an SBOM file: its name, sha256, format and size."""
    data = path.read_bytes()
    doc = json.loads(data)
    return {
        "file": path.name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "format": f"CycloneDX {doc.get('specVersion')}",
        "components": len(doc.get("components", [])),
    }


def layout_config(layout: Path) -> dict:
    """The image config of an OCI layout (its labels under config.Labels)."""
    return json.loads(_blob(layout, _manifest(layout)["config"]["digest"]).read_bytes())


def layout_file(layout: Path, path: str) -> bytes:
    """One file of the image in an OCI layout, from the last small layer that holds it."""
    name = path.lstrip("/")
    for layer in reversed(_manifest(layout)["layers"]):
        if layer.get("size", 0) > 64 << 20:  # the SBOM's layer is small: skip big ones
            continue
        found = None
        with _layer(_blob(layout, layer["digest"])) as inner:
            for member in inner:
                if member.name == name and member.isfile():
                    found = inner.extractfile(member).read()  # type: ignore[union-attr]  # a file: a reader
        if found is not None:
            return found
    raise ArcvllmError(f"{layout.name}: no {path} in its layers")


def _local(ref: str) -> bool:
    """REF (a registry, or an image in one) is on this machine."""
    return ref.split("/")[0].split(":")[0] in ("127.0.0.1", "localhost", "::1")


def push_layout(layout: Path, refs: Sequence[str], digest: str) -> None:
    """Copy the layout's image to the first of REFS as it is (skopeo: no re-compression, one
    digest), then within the registry to the others (their layers are there: only the
    manifest moves); each ref must hold DIGEST."""
    tls = ["--dest-tls-verify=false"] if _local(refs[0]) else []
    # --preserve-digests: skopeo would otherwise compress uncompressed layers on the way
    copy = ["skopeo", "copy", "-q", "--preserve-digests", *tls]
    _run([*copy, f"oci:{layout}", f"docker://{refs[0]}"], f"push {refs[0]}")
    src_tls = ["--src-tls-verify=false"] if tls else []
    for ref in refs[1:]:
        _run([*copy, *src_tls, f"docker://{refs[0]}", f"docker://{ref}"], f"push {ref}")
    inspect = ["skopeo", "inspect", *(["--tls-verify=false"] if tls else [])]
    for ref in refs:
        pushed = _run([*inspect, "--format", "{{.Digest}}", f"docker://{ref}"], f"inspect {ref}")
        if pushed.strip() != digest:
            raise ArcvllmError(f"{ref}: the registry holds {pushed.strip()}, the build {digest}")


def sign(by_digest: str, key: Path, sbom_file: Path, provenance_file: Path) -> None:
    """Sign the image BY_DIGEST and attest its SBOM (CycloneDX) and its provenance (SLSA v1)
    with KEY: a key file signs offline (no transparency log), `keyless` with the CI's OIDC
    identity (Fulcio and Rekor)."""
    signer = ["-y", *cosign_flags(by_digest.split("/")[0])]
    signer += [] if str(key) == KEYLESS else ["--key", str(key), "--tlog-upload=false"]
    _run(["cosign", "sign", *signer, by_digest], f"cosign sign {by_digest}")
    attest = ["cosign", "attest", *signer, "--type", "cyclonedx", "--predicate", str(sbom_file)]
    _run([*attest, by_digest], f"cosign attest {by_digest}")
    attest = ["cosign", "attest", *signer, "--type", "slsaprovenance1"]
    _run([*attest, "--predicate", str(provenance_file), by_digest], "cosign attest provenance")


def engine_root(fallback: Path) -> Path:
    """The engine's data root (where a build's layers and cache go), if this machine holds
    it; else FALLBACK (the release's folder)."""
    from arcvllm.docker import docker_binary

    done = subprocess.run(
        [docker_binary(), "info", "--format", "{{.DockerRootDir}}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    root = Path(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else None
    return root if root is not None and root.exists() else fallback


def release_one(
    target: Target,
    version: str,
    registry: str,
    key: Path,
    out: Path,
    src: image.Source,
    root: Path | None = None,
) -> dict:
    """Build, push, sign and attest one image of the commit SRC (the checkout ROOT); its
    manifest entry. The layout is pushed as it is, never loaded into the engine: one copy
    of each image on disk."""
    if target.kind == "server":
        spec = image.spec_for(target.name)
    else:
        spec = image.spec_for(None, side=target.name)
    repo = target.repository()
    tags = target.tags(version)
    layout = out / f"{repo}-{tags[0]}.oci"
    spec.tags = [f"{repo}:{tags[0]}"]
    spec.oci_layout = layout
    print(f"release: building {spec.tags[0]} ({spec.target})", file=sys.stderr)
    with disk.watch(engine_root(out)) as room:  # the runner's 14 GB: each build's peak said
        image.build(spec, root)
    print(f"release: {room.line(spec.tags[0])}", file=sys.stderr)
    digest = layout_digest(layout)
    push_layout(layout, [f"{registry}/{repo}:{tag}" for tag in tags], digest)
    by_digest = f"{registry}/{repo}@{digest}"
    sbom_file = out / f"{repo}-{tags[0]}.cdx.json"
    sbom_file.write_bytes(layout_file(layout, SBOM_PATH))
    provenance_file = out / f"{repo}-{tags[0]}.provenance.json"
    provenance_file.write_text(json.dumps(provenance(spec, digest, src), indent=2) + "\n")
    sign(by_digest, key, sbom_file, provenance_file)
    labels = layout_config(layout).get("config", {}).get("Labels") or {}
    print(f"release: {by_digest} pushed, signed, SBOM attested", file=sys.stderr)
    return {
        "name": target.name,
        "kind": target.kind,
        "repository": f"{registry}/{repo}",
        "tags": tags,
        "digest": digest,
        "ref": by_digest,
        "layout": layout.name,
        "vllm": labels.get("org.arcvllm.vllm.version", ""),
        "patches": labels.get("org.arcvllm.patches", ""),
        "sbom": sbom_summary(sbom_file),
        "signature": f"{registry}/{repo}:{digest.replace(':', '-')}.sig",
        "attestation": f"{registry}/{repo}:{digest.replace(':', '-')}.att",
    }


def check_registry(registry: str) -> None:
    """REGISTRY is host[:port][/path], its path in lower case (OCI repository names are:
    `ghcr.io/${{ github.repository_owner }}` of an owner with capitals is not one)."""
    import re

    if not re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9._/-]+)?", registry):
        raise UsageError(
            f"release: REGISTRY {registry!r} is not host[:port][/path] (the path in lower case)"
        )


def release(
    version: str,
    registry: str,
    key: Path,
    out: Path,
    stacks: Sequence[str] | None = None,
    sides: Sequence[str] | None = None,
    root: Path | None = None,
) -> dict:
    """Every image of the release from the checkout ROOT (default: this one); writes
    OUT/manifest.json and returns it. Nothing is built unless git names the commit."""
    import re

    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,100}", version):
        raise UsageError(f"release: VERSION {version!r} is not a tag (e.g. 1.2.0)")
    package = image.__version__  # the images' org.opencontainers.image.version label
    try:
        number = Version(version)
    except InvalidVersion:
        number = None  # a rehearsal's name (ci), not a release number
    if number is not None and number != Version(package):
        raise UsageError(
            f"release: VERSION {version} but arcvllm is {package} (the images' version "
            f"label): set __version__ in arcvllm/__init__.py to {version} first"
        )
    check_registry(registry)
    if str(key) != KEYLESS and not key.is_file():
        raise UsageError(f"no cosign key at {key} (cosign generate-key-pair)")
    public = key.with_suffix(".pub")
    if str(key) != KEYLESS and not public.is_file():
        raise UsageError(f"no public key {public} beside {key} (cosign generate-key-pair)")
    src = image.source(root, release=True)  # no release of `unknown`, dated 1970
    chosen = targets(stacks, sides)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {
        "version": version,
        "revision": src.revision,
        "created": src.created,
        "registry": registry,
        "public_key": None if str(key) == KEYLESS else key.with_suffix(".pub").name,
        "images": [release_one(t, version, registry, key, out, src, root) for t in chosen],
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if str(key) != KEYLESS:  # beside the manifest: what an operator verifies with
        shutil.copyfile(public, out / "cosign.pub")
    return manifest


def assemble(
    parts: Sequence[Path],
    out: Path,
    stacks: Sequence[str] | None = None,
    sides: Sequence[str] | None = None,
) -> dict:
    """One release's manifest from the folders its jobs wrote (the hosted release builds
    one stack, or the side images, per job): each part's manifest.json names the same
    version, commit and registry, and together they hold every image of the release (the
    named stacks and side images, default all) once. Writes OUT/manifest.json, with each
    part's SBOM and provenance files beside it; returns the manifest."""
    manifests = []
    for part in parts:
        file = part / "manifest.json"
        if not file.is_file():
            raise UsageError(f"assemble: no manifest.json in {part}")
        manifests.append((part, json.loads(file.read_text())))
    if not manifests:
        raise UsageError("assemble: name the folders of the release's jobs")
    keys = ("version", "revision", "created", "registry", "public_key")
    first = {k: manifests[0][1].get(k) for k in keys}
    for part, manifest in manifests[1:]:
        differ = [k for k in keys if manifest.get(k) != first[k]]
        if differ:
            said = ", ".join(f"{k} {manifest.get(k)!r} (not {first[k]!r})" for k in differ)
            raise CheckFailed(f"assemble: {part} is another release's: {said}")
    by_name: dict[str, dict] = {}
    for part, manifest in manifests:
        for entry in manifest["images"]:
            if entry["name"] in by_name:
                raise CheckFailed(f"assemble: {entry['name']} is in two parts (again in {part})")
            by_name[entry["name"]] = entry
    wanted = [t.name for t in targets(stacks, sides)]
    missing = [name for name in wanted if name not in by_name]
    if missing:
        raise CheckFailed(f"assemble: no part holds {', '.join(missing)}")
    extra = sorted(set(by_name) - set(wanted))
    if extra:
        raise CheckFailed(f"assemble: not images of this release: {', '.join(extra)}")
    out.mkdir(parents=True, exist_ok=True)
    for part, manifest in manifests:
        for entry in manifest["images"]:
            sbom_file = part / entry["sbom"]["file"]
            shutil.copyfile(sbom_file, out / sbom_file.name)
            provenance_file = sbom_file.with_name(
                sbom_file.name.removesuffix(".cdx.json") + ".provenance.json"
            )
            if provenance_file.is_file():
                shutil.copyfile(provenance_file, out / provenance_file.name)
    manifest = {**first, "images": [by_name[name] for name in wanted]}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def compared(first: Path, second: Path, limit: int = 40) -> list[str]:
    """Both layouts' digests printed, and the files that differ (LIMIT of them named)."""
    differ = compare(first, second)
    print(f"{first.name}: {layout_digest(first)}\n{second.name}: {layout_digest(second)}")
    for line in differ[:limit]:
        print(f"  differs: {line}")
    if len(differ) > limit:
        print(f"  ... and {len(differ) - limit} more")
    if not differ:
        print("the same image: one digest")
    return differ


def reproducible(names: Sequence[str], builds: Sequence[str], out: Path) -> list[str]:
    """Each image of NAMES (a stack or a side image) built as each of BUILDS ("1", "2")
    with no cache, as an uncompressed OCI layout OUT/NAME-N, the two compared, then removed;
    the names whose builds differ. Without build 1, OUT/NAME-1 is an earlier one (CI: the
    release rehearsal's, built on a new engine)."""
    from arcvllm import stack

    if sorted(builds) not in (["1", "2"], ["2"]):
        raise UsageError(f"builds {' '.join(builds)!r}: `1 2`, or `2` beside an earlier NAME-1")
    stacks, _ = stack.load()
    out.mkdir(parents=True, exist_ok=True)
    differ = []
    for name in names:
        first = out / f"{name}-1"
        if "1" not in builds and not (first / "index.json").is_file():
            raise UsageError(f"no {first} layout for build 2 to be compared with")
        for n in builds:
            if name in stacks:
                spec = image.spec_for(name)
                spec.tags = [f"arcvllm:{name}"]
            else:
                spec = image.spec_for(None, side=name)
            spec.oci_layout, spec.flags = out / f"{name}-{n}", ["--no-cache"]
            spec.layer_compression = "uncompressed"
            image.build(spec)
        print(f"reproducible {name}:")
        if compared(first, out / f"{name}-2"):
            differ.append(name)
        shutil.rmtree(first, ignore_errors=True)
        shutil.rmtree(out / f"{name}-2", ignore_errors=True)
    return differ


# Who signs the hosted release: .github/workflows/release.yml of this repository on a tag,
# with the identity GitHub Actions' OIDC issuer vouches for (README's pull path).
GITHUB_OIDC_ISSUER = "https://token.actions.githubusercontent.com"
RELEASE_IDENTITY_REGEXP = (
    r"^https://github\.com/arcvllm/arcvllm/\.github/workflows/release\.yml@refs/tags/v"
)


@dataclass(frozen=True)
class Signer:
    """Who must have signed a release: the public key of a key pair's release, or the
    identity of a keyless one (cosign's --certificate-identity-regexp and
    --certificate-oidc-issuer: the workflow that signed, and who vouched for it)."""

    key: Path | None = None
    identity_regexp: str | None = None
    oidc_issuer: str | None = None

    @classmethod
    def of(cls, key: Path | None, identity_regexp: str | None, oidc_issuer: str | None) -> Signer:
        """The signer a command line names: a key, or an identity and its issuer."""
        identity = identity_regexp is not None or oidc_issuer is not None
        if key is not None and identity:
            raise UsageError(
                "verify: --key (a key pair's release) or --certificate-identity-regexp with "
                "--certificate-oidc-issuer (a keyless one), not both"
            )
        if key is None and not identity:
            raise UsageError(
                "verify: name the signer: --key cosign.pub (a key pair's release), or "
                "--certificate-identity-regexp RE --certificate-oidc-issuer URL (keyless: the "
                "hosted release, README's pull path)"
            )
        if identity and not (identity_regexp and oidc_issuer):
            raise UsageError(
                "verify: a keyless release is verified by both --certificate-identity-regexp "
                "and --certificate-oidc-issuer"
            )
        return cls(key, identity_regexp, oidc_issuer)

    def cosign_flags(self) -> list[str]:
        """cosign's flags for this signer. A key pair's release was signed offline (no
        transparency log entry to check); a keyless one is checked against Rekor's."""
        if self.key is not None:
            return ["--key", str(self.key), "--insecure-ignore-tlog=true"]
        return [
            "--certificate-identity-regexp",
            str(self.identity_regexp),
            "--certificate-oidc-issuer",
            str(self.oidc_issuer),
        ]


def verify_argvs(ref: str, signer: Signer, attestation: bool = True) -> list[list[str]]:
    """cosign's checks of one digest: its signature, then its SBOM and provenance attestations."""
    flags = [*signer.cosign_flags(), *cosign_flags(ref.split("/")[0])]
    checks = [["cosign", "verify", *flags, ref]]
    if attestation:
        for kind in ("cyclonedx", "slsaprovenance1"):
            checks.append(["cosign", "verify-attestation", "--type", kind, *flags, ref])
    return checks


def verify_ref(ref: str, signer: Signer, attestation: bool = True) -> tuple[bool, str]:
    """cosign's verdict on a digest: its signature (and its SBOM and provenance)."""
    for argv in verify_argvs(ref, signer, attestation):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines()
            return False, lines[-1] if lines else f"{argv[1]} exit {proc.returncode}"
    if not attestation:
        return True, "signature verified"
    return True, "signature, SBOM and provenance attestations verified"


def verify(manifest_file: Path, signer: Signer) -> list[dict]:
    """Every image of a manifest checked; a list of {ref, ok, detail}."""
    manifest = json.loads(manifest_file.read_text())
    results = []
    for entry in manifest["images"]:
        ok, detail = verify_ref(entry["ref"], signer)
        results.append({"name": entry["name"], "ref": entry["ref"], "ok": ok, "detail": detail})
    return results


def entry(manifest_file: Path, name: str) -> dict:
    """The manifest's entry for the image NAME (a stack or a side image)."""
    images = json.loads(manifest_file.read_text())["images"]
    found = next((e for e in images if e["name"] == name), None)
    if found is None:
        names = ", ".join(e["name"] for e in images)
        raise UsageError(f"{manifest_file}: no image {name!r} (it has: {names})")
    return found
