"""Fidelity audit: what a vLLM release's own XPU image installs, against what ours does.

The release's sdist (pinned by sha256 in configs/stacks.yaml) carries its
`docker/Dockerfile.xpu`, `requirements/xpu.txt` and `requirements/test/xpu.txt` (its
uv-resolved XPU lock). From those, and from our docker/Dockerfile with the stack's build
args, the audit extracts the same facts on both sides (base image, apt packages, GPU
user-space debs, oneCCL installer, ENV, torch / triton / kernels pins, oneAPI runtime
wheels, uninstalls, Python) and compares them one by one. Every difference must be listed
under the stack's `differences:` with a reason; an unlisted one fails, and so does a listed
one that no longer differs. The stack's XPU lock must be what `arcvllm stack lock` writes.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from arcvllm.builder import index, lock
from arcvllm.builder.facts import Facts, our_facts, release_facts, requirement_facts
from arcvllm.builder.sdist import Release, default_cache, release_of
from arcvllm.errors import ArcvllmError, Unavailable, UsageError
from arcvllm.paths import data_root
from arcvllm.text import Shown, columns

if TYPE_CHECKING:  # (imported where used: the stacks module is loaded on demand)
    from arcvllm.stack import Stack

# ENV our side sets that the audit compares even where the release sets none: the device
# runtime's own variables (oneCCL, MPI/libfabric, Level Zero, SYCL, the loader path).
DEVICE_ENV_PREFIXES = re.compile(r"^(CCL_|I_MPI_|FI_|ZE_|SYCL_|ONEAPI_|UR_|NEO_|IGC_|LD_)")


# ---- comparison ----------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditedFact:
    """One audited fact: the release's value, ours, and its status against the listed ones."""

    key: str
    release: str | None
    ours: str | None
    status: str  # same | listed | unlisted | stale
    reason: str = ""


def compare(
    release: Facts, ours: Facts, listed: Mapping[str, str], lock_status: str = "current"
) -> list[AuditedFact]:
    """Every audited fact, side by side, with its status against the listed differences."""
    removals = {f"uninstall:{n}" for n in release.uninstalled | ours.uninstalled}
    keys = set(release.values) | set(ours.values) | set(listed) | removals
    rows = []
    for key in sorted(keys, key=_order):
        theirs, mine = release.values.get(key), ours.values.get(key)
        if key.startswith("env:") and theirs is None and not DEVICE_ENV_PREFIXES.match(key[4:]):
            mine = None  # our own settings (cache paths, presets): not the release's business
        if key in removals:
            name = key.split(":", 1)[1]
            theirs = "installed" if name in release.installed else "removed"
            mine = "installed" if name in ours.installed else "removed"
            if name not in release.uninstalled and name not in release.packages:
                theirs = mine = None  # removing what the release never installs is a no-op
        if key == "lock":
            continue
        differs = theirs != mine
        if key in listed:
            status = "listed" if differs else "stale"
        elif differs:
            status = "unlisted"
        elif theirs is None:
            continue
        else:
            status = "same"
        rows.append(AuditedFact(key, theirs, mine, status, listed.get(key, "")))
    if "lock" in listed:
        status = "listed" if lock_status != "current" else "stale"
    else:
        status = "same" if lock_status == "current" else "unlisted"
    rows.append(AuditedFact("lock", "current", lock_status, status, listed.get("lock", "")))
    return rows


_KINDS = (
    "base", "python", "deb", "oneccl-installer", "apt", "env", "pin", "wheel", "uninstall", "req",
)  # fmt: skip


def _order(key: str) -> tuple[int, str]:
    kind = key.split(":", 1)[0]
    return (_KINDS.index(kind) if kind in _KINDS else len(_KINDS), key)


def problems(stack: str, rows: Sequence[AuditedFact]) -> list[str]:
    """One line per unlisted or stale difference."""
    out = []
    for row in rows:
        if row.status == "unlisted":
            out.append(
                f"{stack}: unlisted difference {row.key} "
                f"(release {row.release or '-'}, ours {row.ours or '-'})"
            )
        elif row.status == "stale":
            out.append(f"{stack}: listed difference {row.key} no longer differs: remove it")
    return out


def table(rows: Sequence[AuditedFact]) -> str:
    table = [("FACT", "RELEASE", "OURS", "STATUS")]
    table += [(r.key, r.release or "-", r.ours or "-", r.status) for r in rows]
    return columns(table)


# ---- the stack side and the commands -------------------------------------------------------


@dataclass(frozen=True)
class Audit:
    stack: str
    vllm_version: str
    rows: list[AuditedFact]

    def problems(self) -> list[str]:
        return problems(self.stack, self.rows)

    def as_json(self) -> dict:
        return {
            "stack": self.stack,
            "vllm": self.vllm_version,
            "ok": not self.problems(),
            "facts": [r.__dict__ for r in self.rows],
            "problems": self.problems(),
        }


def _stack_entry(name: str, file: Path | None) -> tuple[Stack, Mapping[str, str]]:
    """The XPU stack NAME and its `differences:` mapping (missing = empty)."""
    from arcvllm import stack as stacks

    try:
        found = stacks.get(name, file, flavor="xpu")
    except ArcvllmError as exc:
        raise UsageError(str(exc)) from None
    return found, found.differences


def lock_path(args: Mapping[str, str], stack: str) -> str:
    """Where the stack's XPU lock lives (XPU_LOCK, or configs/locks/STACK.txt)."""
    return args.get("XPU_LOCK") or f"configs/locks/{stack}.txt"


def audit(
    name: str,
    file: Path | None = None,
    cache: Path | None = None,
    sdist: Path | None = None,
    dockerfile: Path | None = None,
    root: Path | None = None,
) -> Audit:
    """Audit the XPU stack NAME against its release's own files."""
    stack, listed = _stack_entry(name, file)
    root = root or data_root()
    release = release_of(stack, cache or default_cache(), sdist)
    args = stack.build_args()
    ours_text = (dockerfile or root / "docker" / "Dockerfile").read_text()
    ours = our_facts(ours_text, args, root)
    requirement_facts(release.roots(), ours)
    lock_file = root / lock_path(args, name)
    lock_text = lock_file.read_text() if lock_file.is_file() else None
    if lock_text is None:
        lock_status = "missing"
    elif lock.without_hashes(lock.split(lock_text)[0]) != release.runtime_lock(name):
        lock_status = "stale"
    else:
        lock_status = "current"
    # vLLM's requirements our lock leaves to resolve at build time (unpinned downloads)
    unpinned = lock.unpinned(lock_text, release.roots()) if lock_text is not None else []
    ours.values["lock:unpinned"] = " ".join(unpinned) or "none"
    rows = compare(release_facts(release), ours, listed, lock_status)
    return Audit(name, stack.vllm_version, rows)


def write_lock(
    name: str,
    file: Path | None = None,
    cache: Path | None = None,
    sdist: Path | None = None,
    root: Path | None = None,
    resolve: bool = True,
    hashes: bool = True,
) -> Path:
    """Write the stack's XPU lock from its release's resolved lock, plus what it lacks of
    vLLM's requirements compiled here (unless RESOLVE is false); returns its path."""
    stack, listed = _stack_entry(name, file)
    release = release_of(stack, cache or default_cache(), sdist)
    text = release.runtime_lock(name)
    resolve = resolve and "lock:unpinned" not in listed  # listed: it cannot be compiled
    if resolve and (missing := lock.unpinned(text, release.roots())):
        text += resolved_lock(release, stack.build_args(), text, missing)
    if hashes:
        text = lock.with_hashes(text, published_hashes(text, stack.build_args()["PYTHON_VERSION"]))
    target = (root or data_root()) / lock_path(stack.build_args(), name)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return target


def shown(
    action: str,
    name: str,
    file: Path | None = None,
    cache: Path | None = None,
    sdist: Path | None = None,
    dockerfile: Path | None = None,
) -> Shown:
    """What `arcvllm stack lock|audit NAME` prints: the lock written, or the audit's table
    (its document as JSON) and its problems."""
    if action == "lock":
        written = write_lock(name, file, cache, sdist)
        return Shown({"stack": name, "lock": str(written)}, str(written), indent=None)
    result = audit(name, file, cache, sdist, dockerfile)
    return Shown(result.as_json(), table(result.rows), problems=tuple(result.problems()))


def published_hashes(text: str, python: str) -> dict[str, list[str]]:
    """For each pin of TEXT the package index serves (not the XPU index's +xpu builds), the
    sha256 it lists for the wheels of that version the image can take."""
    from concurrent.futures import ThreadPoolExecutor

    where = index.index_url()
    accepted = lock.wheel_tags(python)
    entries = [
        e
        for e in lock.parse_lock(text).values()
        if "+" not in e.version and e.name not in lock.XPU_INDEX
    ]

    def lookup(entry: lock.Entry) -> tuple[str, list[str]]:
        try:
            files = index.project_files(entry.name, where)
        except Unavailable:
            return entry.name, []  # only the XPU index serves it
        return entry.name, lock.file_hashes(files, entry.version, accepted)

    with ThreadPoolExecutor(max_workers=8) as pool:
        return {name: sums for name, sums in pool.map(lookup, entries) if sums}


def resolved_lock(
    release: Release, args: Mapping[str, str], text: str, missing: Sequence[str]
) -> str:
    """The lock's `# Resolved here` part: MISSING, what the release's lock TEXT lacks of
    vLLM's own requirements, compiled once here (see arcvllm.builder.lock); torchaudio, which only
    the XPU index serves, at the torch version (PyTorch releases the two together)."""
    entries = lock.parse_lock(text)
    where = index.index_url()
    requirements = release.files["common"] + "\n" + release.files["xpu"]
    job = lock.Compile(
        requirements=tuple(  # all of them: fastapi[standard]'s extras are vLLM's too
            lock.requirement_lines(requirements, set(release.roots()) - lock.XPU_INDEX)
        ),
        constraints=entries,
        torch=entries["torch"].version,
        python=args["PYTHON_VERSION"],
        exclude_newer=index.upload_time("vllm", release.sdist, where),
        index=where,
    )
    uv = Path(sys.executable).with_name("uv")
    resolved = job.run(str(uv) if uv.exists() else "uv")  # Unavailable: no uv, no solution
    derived = {}
    if "torchaudio" in missing:
        resolved["torchaudio"] = lock.Entry("torchaudio", entries["torch"].version, ())
        derived["torchaudio"] = (
            f"the torch version ({entries['torch'].version}): only the XPU index serves it"
        )
    tool = "uv " + _uv_version()
    return "\n" + lock.render_resolved(resolved, job, tool, derived)


def _uv_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("uv")
    except PackageNotFoundError:
        return "(not installed)"
