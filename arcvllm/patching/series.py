"""The patch series: which patch fits which vLLM release, read from patches/vllm/series.yaml.

Pure data and selection; nothing here touches a vLLM tree.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from arcvllm.errors import ArcvllmError, CheckFailed
from arcvllm.paths import patches_dir

# DEP-3 fields every patch header must carry (Applied-Upstream only where it applies).
REQUIRED_HEADER_FIELDS = ("Description", "Origin", "Bug", "Forwarded", "Last-Update")

# What the series expects of a patch on one release.
APPLY = "apply"  # the release carries the bug and a variant fits it
UPSTREAM = "upstream"  # the release carries upstream's fix
UNPATCHED = "unpatched"  # the release carries the bug and no variant fits it
NOT_APPLICABLE = "not-applicable"  # the bug (the code the patch fixes) is not in this release


@dataclass(frozen=True)
class Variant:
    file: Path
    versions: SpecifierSet
    sha256: str

    def matches(self, version: Version) -> bool:
        return self.versions.contains(version, prereleases=True)


@dataclass(frozen=True)
class Patch:
    name: str
    probe: str
    variants: tuple[Variant, ...]
    upstream_version: Version | None
    upstream_by: str | None
    # Releases whose code carries the bug; None: every release below upstream's fix.
    affected: SpecifierSet | None = None
    # The first release without the code the patch fixes (and its probe runs), and what
    # became of it; None: every release since has it.
    removed_version: Version | None = None
    removed_what: str | None = None

    def variant_for(self, version: Version) -> Variant | None:
        return next((v for v in self.variants if v.matches(version)), None)

    def removed(self, version: Version) -> bool:
        """Is the code this patch fixes gone from this release?"""
        return self.removed_version is not None and version >= self.removed_version

    def fixed_upstream(self, version: Version) -> bool:
        return self.upstream_version is not None and version >= self.upstream_version

    def affects(self, version: Version) -> bool:
        """Does this release carry the bug (whether or not a variant fits it)?"""
        if self.fixed_upstream(version):
            return False
        return self.affected is None or self.affected.contains(version, prereleases=True)


@dataclass(frozen=True)
class Series:
    supported: SpecifierSet
    patches: tuple[Patch, ...]

    def supports(self, version: Version) -> bool:
        return self.supported.contains(version, prereleases=True)


@dataclass(frozen=True)
class SeriesEntry:
    """One patch of the series as it stands for one release: what to expect, which variant."""

    patch: Patch
    expect: str  # APPLY, UPSTREAM, UNPATCHED or NOT_APPLICABLE
    variant: Variant | None


def entries_for(series: Series, version: Version) -> list[SeriesEntry]:
    """Decide, from the version alone, what each patch should do for this release.

    A supported release that carries a bug no variant fits is UNPATCHED, never
    NOT_APPLICABLE: the bug is there and the image does not fix it.
    """
    entries = []
    for patch in series.patches:
        variant = patch.variant_for(version)
        if patch.removed(version):
            entries.append(SeriesEntry(patch, NOT_APPLICABLE, None))
        elif variant is not None:
            entries.append(SeriesEntry(patch, APPLY, variant))
        elif patch.fixed_upstream(version):
            entries.append(SeriesEntry(patch, UPSTREAM, None))
        elif patch.affects(version) and series.supports(version):
            entries.append(SeriesEntry(patch, UNPATCHED, None))
        else:
            entries.append(SeriesEntry(patch, NOT_APPLICABLE, None))
    return entries


def summary(states: dict[str, str]) -> str:
    """One line, `name=state,...` sorted by name: the form of the image label."""
    return ",".join(f"{name}={state}" for name, state in sorted(states.items()))


def parse_version(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise ArcvllmError(f"not a vLLM version: {text!r}") from None


def load(path: Path | None = None) -> Series:
    """Read and check the series: specifiers parse, files exist and match their sha256."""
    import yaml

    path = (path or patches_dir() / "series.yaml").resolve()
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise CheckFailed(f"series file not found: {path}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise CheckFailed(f"{path}: not valid YAML{where}") from None
    if not isinstance(data, dict) or not isinstance(data.get("patches"), list):
        raise CheckFailed(f"{path}: needs a `supported` specifier and a `patches` list")
    supported = _specifier(path, "supported", data.get("supported"))
    patches = tuple(_patch(path, entry) for entry in data["patches"])
    names = [p.name for p in patches]
    if len(set(names)) != len(names):
        raise CheckFailed(f"{path}: a patch name appears twice")
    return Series(supported, patches)


def _specifier(path: Path, where: str, text: object) -> SpecifierSet:
    if not isinstance(text, str):
        raise CheckFailed(f"{path}: {where}: needs a version specifier string")
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise CheckFailed(f"{path}: {where}: not a PEP 440 specifier: {text!r}") from None


def _patch(path: Path, entry: object) -> Patch:
    if not isinstance(entry, dict) or not {"name", "probe", "variants"} <= entry.keys():
        raise CheckFailed(f"{path}: each patch needs name, probe and variants: {entry!r}")
    name = entry["name"]
    variants = []
    for raw in entry["variants"] or []:
        if not isinstance(raw, dict) or not {"file", "versions", "sha256"} <= raw.keys():
            raise CheckFailed(f"{path}: {name}: each variant needs file, versions and sha256")
        file = path.parent / raw["file"]
        if not file.is_file():
            raise CheckFailed(f"{path}: {name}: patch file missing: {raw['file']}")
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        if digest != raw["sha256"]:
            raise CheckFailed(
                f"{name}: {raw['file']} has sha256 {digest}, the series says {raw['sha256']}"
            )
        check_header(file)
        versions = _specifier(path, f"{name}: versions", raw["versions"])
        variants.append(Variant(file, versions, raw["sha256"]))
    upstream = entry.get("upstream") or {}
    upstream_version = parse_version(str(upstream["version"])) if "version" in upstream else None
    affected = (
        _specifier(path, f"{name}: affected", entry["affected"]) if "affected" in entry else None
    )
    removed = entry.get("removed") or {}
    if removed and not {"version", "what"} <= removed.keys():
        raise CheckFailed(f"{path}: {name}: removed needs version and what")
    removed_version = parse_version(str(removed["version"])) if removed else None
    for variant in variants:
        if removed_version is None:
            continue
        if variant.matches(removed_version):
            raise CheckFailed(
                f"{path}: {name}: variant {variant.file.name} claims {removed_version}, "
                "where the code it patches is removed"
            )
        if (floor := lower_bound(variant.versions)) is not None and floor >= removed_version:
            raise CheckFailed(
                f"{path}: {name}: variant {variant.file.name} claims releases from {floor} on, "
                f"after the code it patches is removed ({removed_version}): never applied"
            )
    return Patch(
        name,
        entry["probe"],
        tuple(variants),
        upstream_version,
        upstream.get("by"),
        affected,
        removed_version,
        removed.get("what"),
    )


def lower_bound(versions: SpecifierSet) -> Version | None:
    """The least release VERSIONS can hold, as its specifiers bound it from below (None:
    unbounded)."""
    floors = [
        parse_version(spec.version.removesuffix(".*"))
        for spec in versions
        if spec.operator in (">=", ">", "==", "~=", "===")
    ]
    return max(floors, default=None)


def header(file: Path) -> dict[str, str]:
    """The DEP-3 header of a patch file: the fields before the first `---` or diff line."""
    fields: dict[str, str] = {}
    last = None
    for line in file.read_text().splitlines():
        if line.startswith(("---", "diff ", "Index: ")):
            break
        if line.startswith((" ", "\t")) and last:
            fields[last] += "\n" + line.strip()
        elif ":" in line:
            last, _, value = line.partition(":")
            fields[last] = value.strip()
    return fields


def check_header(file: Path) -> None:
    fields = header(file)
    missing = [f for f in REQUIRED_HEADER_FIELDS if not fields.get(f)]
    if missing:
        raise CheckFailed(f"{file.name}: DEP-3 header lacks {', '.join(missing)}")


def touched_files(file: Path) -> list[str]:
    """Paths (relative to the tree root, -p1) that a unified diff changes."""
    return [
        line[4:].split("\t")[0].removeprefix("b/")
        for line in file.read_text().splitlines()
        if line.startswith("+++ ")
    ]
