"""A vLLM release's sdist on the build host: fetched through the package index pip is
configured with (or taken from a folder), checked against the stack's sha256, and the four
files of it the fidelity audit and the XPU lock read (docker/Dockerfile.xpu, its
requirements and its uv-resolved XPU lock).
"""

from __future__ import annotations

import hashlib
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from arcvllm.builder import index, lock
from arcvllm.errors import ArcvllmError, Unavailable, UsageError
from arcvllm.paths import data_root

RELEASE_FILES = {
    "dockerfile": "docker/Dockerfile.xpu",
    "xpu": "requirements/xpu.txt",
    "common": "requirements/common.txt",
    "lock": "requirements/test/xpu.txt",
}


@dataclass(frozen=True)
class Release:
    """The four files of a vLLM release the audit reads, and where they came from."""

    version: str
    sdist: str
    sdist_sha256: str
    files: Mapping[str, str]

    def lock_source(self) -> lock.Source:
        text = self.files["lock"]
        return lock.Source(
            vllm_version=self.version,
            sdist=self.sdist,
            sdist_sha256=self.sdist_sha256,
            member=f"vllm-{self.version}/{RELEASE_FILES['lock']}",
            member_sha256=hashlib.sha256(text.encode()).hexdigest(),
        )

    def roots(self) -> list[str]:
        """vLLM's own runtime requirements on XPU: common.txt + xpu.txt."""
        return lock.requirement_names(self.files["common"]) + lock.requirement_names(
            self.files["xpu"]
        )

    def runtime_lock(self, stack: str) -> str:
        """Our lock file's text: the runtime closure of the release's resolved XPU lock."""
        entries = lock.parse_lock(self.files["lock"])
        roots = self.roots()
        return lock.lock_text(self.lock_source(), stack, lock.closure(entries, roots), roots)


def default_cache() -> Path:
    """build/sdists of the checkout (where the Dockerfile build and the tests look too)."""
    return data_root() / "build" / "sdists"


def sdist_name(args: Mapping[str, str], version: str) -> str:
    url = args.get("VLLM_SDIST_URL", "")
    return url.rsplit("/", 1)[-1] if url else f"vllm-{version}.tar.gz"


def fetch_sdist(args: Mapping[str, str], version: str, cache: Path) -> Path:
    """The stack's sdist: from CACHE if there, else downloaded into it; sha256 checked."""
    sha256 = args.get("VLLM_SDIST_SHA256", "")
    if not sha256:
        raise UsageError(f"vllm {version}: the stack pins no VLLM_SDIST_SHA256")
    name = sdist_name(args, version)
    cached = cache / name
    if not cached.exists():
        try:
            url = args.get("VLLM_SDIST_URL") or index.file_url("vllm", name, sha256)
            cached = index.fetch(url, sha256, cache)
        except ImportError as exc:
            where = args.get("VLLM_SDIST_URL") or name
            raise Unavailable(f"cannot fetch {where}: {exc}") from None
        except ArcvllmError as exc:
            raise Unavailable(str(exc)) from None
    got = index.sha256_of(cached)
    if got != sha256:
        raise Unavailable(
            f"{cached}: sha256 {got}, the stack pins {sha256} (remove the file to fetch it again)"
        )
    return cached


def read_release(path: Path, version: str, sha256: str) -> Release:
    """The release files from the sdist at PATH (already verified)."""
    files = {}
    try:
        with tarfile.open(path, "r:gz") as archive:
            for key, member in RELEASE_FILES.items():
                handle = archive.extractfile(f"vllm-{version}/{member}")
                if handle is None:
                    raise KeyError(member)
                files[key] = handle.read().decode()
    except (tarfile.TarError, OSError) as exc:
        raise Unavailable(f"{path}: not a readable sdist: {exc}") from None
    except KeyError as exc:
        raise Unavailable(f"{path}: no vllm-{version}/{exc.args[0]} in the sdist") from None
    return Release(version, path.name, sha256, files)


def release_of(stack, cache: Path, sdist: Path | None = None) -> Release:
    args = stack.build_args()
    if sdist is not None:
        sha256 = args.get("VLLM_SDIST_SHA256", "")
        if not sdist.is_file():
            raise Unavailable(f"no sdist at {sdist}")
        if (got := index.sha256_of(sdist)) != sha256:
            raise Unavailable(f"{sdist}: sha256 {got}, the stack pins {sha256}")
        path = sdist
    else:
        path = fetch_sdist(args, stack.vllm_version, cache)
    return read_release(path, stack.vllm_version, args["VLLM_SDIST_SHA256"])
