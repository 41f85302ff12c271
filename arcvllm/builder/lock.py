"""Our XPU lock: the release's own resolved XPU lock, cut to what vLLM needs at run time.

vLLM's sdist carries `requirements/test/xpu.txt`, a `uv pip compile` of its XPU test
requirements against `requirements/xpu.txt`: exact versions from the XPU index, each with a
`# via` note naming who requires it. Its runtime part is the closure of vLLM's own
requirements (the names in `requirements/common.txt` and `requirements/xpu.txt`): a lock
entry belongs to it when it is one of those names or one of its `# via` parents does.
Test-only tools (pytest, lm-eval, ...) fall out.

Where the release's lock leaves some of vLLM's own requirements out (0.20 and 0.23 compile
their test lock without requirements/common.txt), `compile_missing` resolves them once, on
the host that writes the lock, with the tool the release used (`uv pip compile`), within
vLLM's own ranges, the release's lock as constraints and only files published before the
release (--exclude-newer: the sdist's upload time), and the lock pins the result below a
`# Resolved here` line: the image build resolves nothing. Everything else: text in, text out.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from arcvllm.errors import Unavailable

_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)")
_HASH = re.compile(r"\s+--hash=sha256:[0-9a-f]{64}")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;#,]+)")


def normalize(name: str) -> str:
    """PEP 503 name: lower case, runs of `-_.` as one `-`."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Entry:
    """One pinned package of a uv-compiled lock and the parents its `# via` note names."""

    name: str
    version: str
    via: tuple[str, ...]


def parse_lock(text: str) -> dict[str, Entry]:
    """Entries by normalized name; `-r file` / `-c file` parents are kept as written."""
    entries: dict[str, Entry] = {}
    current: tuple[str, str] | None = None
    via: list[str] = []

    def close() -> None:
        if current is not None:
            entries[current[0]] = Entry(current[0], current[1], tuple(via))

    for line in text.splitlines():
        if m := _PIN.match(line):
            close()
            current, via = (normalize(m.group(1)), m.group(2)), []
            continue
        stripped = line.strip()
        if not stripped.startswith("#") or current is None:
            continue
        note = stripped.lstrip("#").strip()
        if note.startswith("via"):
            note = note[3:].strip()
        if note and not note.startswith(("This file", "uv ")):
            via.append(note if note.startswith("-") else normalize(note))
    close()
    return entries


def requirement_names(text: str) -> list[str]:
    """Normalized project names a requirements file asks for (options and `-r` skipped)."""
    names = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        if m := _NAME.match(line):
            names.append(normalize(m.group(1)))
    return names


def requirement_pins(text: str) -> dict[str, str]:
    """Exact versions a requirements file names: `name==v`, or `name @ .../name-v-*.whl`."""
    pins = {}
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if m := _PIN.match(line):
            pins[normalize(m.group(1))] = m.group(2)
        elif (m := _NAME.match(line)) and " @ " in line:
            wheel = line.split(" @ ", 1)[1].strip().rsplit("/", 1)[-1]
            if wheel.endswith(".whl") and wheel.count("-") >= 2:
                pins[normalize(m.group(1))] = wheel.split("-")[1]
    return pins


def closure(entries: Mapping[str, Entry], roots: Iterable[str]) -> dict[str, Entry]:
    """The entries that are ROOTS or are required (`# via`) by one that is, in file order."""
    keep = {normalize(r) for r in roots} & set(entries)
    grew = True
    while grew:
        grew = False
        for name, entry in entries.items():
            if name not in keep and any(parent in keep for parent in entry.via):
                keep.add(name)
                grew = True
    return {name: entry for name, entry in entries.items() if name in keep}


@dataclass(frozen=True)
class Source:
    """Where a lock came from: the release, its sdist and the lock file inside it."""

    vllm_version: str
    sdist: str
    sdist_sha256: str
    member: str
    member_sha256: str


def lock_text(
    source: Source, stack: str, entries: Mapping[str, Entry], roots: Iterable[str]
) -> str:
    """The release part of the lock file: a header that says where every line came from,
    then `name==version`."""
    missing = sorted({normalize(r) for r in roots} - set(entries))
    header = [
        f"# XPU lock of stack {stack}: vLLM {source.vllm_version}'s runtime requirements at the",
        "# exact versions the release's own resolved XPU lock gives them. Written by",
        f"# `arcvllm stack lock {stack}`; `arcvllm stack audit {stack}` fails when it is stale.",
        f"# from: {source.member}",
        f"#   sha256 {source.member_sha256}",
        f"# in:   {source.sdist}",
        f"#   sha256 {source.sdist_sha256}",
        "# kept: requirements/common.txt + requirements/xpu.txt and every entry whose `# via`",
        "#   names one kept (test-only tools such as pytest and lm-eval fall out).",
        "# Hashes: a pin the package index serves lists the sha256 the index publishes for",
        "#   each of its wheels the image can take. The +xpu wheels (torch, torchvision,",
        "#   torchaudio, triton-xpu) and what only the XPU index serves have none: the host",
        "#   that wrote this file cannot reach that index, so they pin versions only.",
    ]
    if missing:
        header.append("# Not in the release's lock:")
        line = "#  "
        for name in missing:
            if len(line) + len(name) + 1 > 90:
                header.append(line)
                line = "#  "
            line += f" {name}"
        header.append(line)
    body = [f"{e.name}=={e.version}" for e in sorted(entries.values(), key=lambda e: e.name)]
    return "\n".join(header + body) + "\n"


# ---- what the release's lock leaves out ------------------------------------------------------

RESOLVED = "# Resolved here"
# Served by PyTorch's XPU index or pinned in stacks.yaml (the kernels wheel), never by the
# package index the lock is compiled against.
XPU_INDEX = frozenset({"torch", "torchaudio", "torchvision", "triton-xpu", "vllm-xpu-kernels"})
# The image: Ubuntu 24.04 (glibc 2.39), x86_64, the release's Python.
PLATFORM = "x86_64-manylinux_2_39"


def split(text: str) -> tuple[str, str]:
    """(release part, resolved part) of a lock file's text."""
    head, mark, tail = text.partition(f"\n{RESOLVED}")
    return (head.rstrip("\n") + "\n", mark.lstrip("\n") + tail) if mark else (text, "")


def requirement_lines(text: str, names: Iterable[str]) -> list[str]:
    """The lines of a requirements file that ask for NAMES, as written (ranges, markers)."""
    wanted = {normalize(n) for n in names}
    lines = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        m = _NAME.match(line) if line and not line.startswith(("#", "-")) else None
        if m and normalize(m.group(1)) in wanted:
            lines.append(line)
    return lines


@dataclass(frozen=True)
class Compile:
    """One `uv pip compile` of vLLM's requirements the release's lock lacks."""

    requirements: tuple[str, ...]  # vLLM's own lines for them
    constraints: Mapping[str, Entry]  # the release's lock (its runtime part)
    torch: str  # the release's torch version (+xpu): resolved as the index's plain build
    python: str
    exclude_newer: str  # RFC 3339, the sdist's upload time
    index: str

    def run(self, uv: str = "uv") -> dict[str, Entry]:
        """The pins the requirements add to the lock: their closure without torch (and what
        only torch's plain build needs, e.g. CUDA libraries), minus what the lock has.
        A constraint the index does not serve (the release's lock took it from the XPU
        index) is left out of the compile; the lock keeps it pinned."""
        public_torch = self.torch.split("+", 1)[0]
        constraints = {
            e.name: f"{e.name}=={e.version}"
            for e in self.constraints.values()
            if "+" not in e.version and e.name not in XPU_INDEX
        }
        while True:  # each retry drops one constraint: it ends
            try:
                compiled = self._compile(uv, list(constraints.values()), public_torch)
                break
            except Unavailable as exc:
                absent = _ABSENT.search(str(exc))
                if not absent or normalize(absent.group(1)) not in constraints:
                    raise
                del constraints[normalize(absent.group(1))]
        compiled.pop("torch", None)
        roots = [m.group(1) for line in self.requirements if (m := _NAME.match(line))]
        kept = closure(compiled, roots)
        return {n: e for n, e in kept.items() if n not in self.constraints}

    def _compile(self, uv: str, constraints: list[str], torch: str) -> dict[str, Entry]:
        # a local version (`==3.8.0+xpu`) is served by an XPU index only
        requirements = [r for r in self.requirements if not _LOCAL.search(r)]
        with tempfile.TemporaryDirectory(prefix="arcvllm-lock-") as tmp:
            folder = Path(tmp)
            (folder / "requirements.txt").write_text("\n".join(requirements) + "\n")
            (folder / "constraints.txt").write_text("\n".join(constraints) + "\n")
            (folder / "overrides.txt").write_text(f"torch=={torch}\n")
            command = [
                uv, "pip", "compile", "--quiet", "--no-header", "--no-config", "--system-certs",
                "--python-version", self.python, "--python-platform", PLATFORM,
                "--exclude-newer", self.exclude_newer, "--index-url", self.index,
                "-c", "constraints.txt", "--override", "overrides.txt",
                "-o", "compiled.txt", "requirements.txt",
            ]  # fmt: skip
            try:
                subprocess.run(command, cwd=folder, check=True, capture_output=True, text=True)
            except FileNotFoundError:
                raise Unavailable(f"no {uv}: install the 'stack' extra (uv)") from None
            except subprocess.CalledProcessError as exc:
                why = " ".join((exc.stderr or "(no output)").split())
                raise Unavailable(f"uv pip compile failed: {why[-400:]}") from None
            return parse_lock((folder / "compiled.txt").read_text())


_LOCAL = re.compile(r"==\s*[^\s;,]*\+")
_ABSENT = re.compile(r"there is no version of ([A-Za-z0-9][A-Za-z0-9._-]*)==")


def render_resolved(
    entries: Mapping[str, Entry], job: Compile, tool: str, derived: Mapping[str, str]
) -> str:
    """The resolved part: how it was compiled, then `name==version` lines."""
    header = [
        f"{RESOLVED}: vLLM's requirements the release's lock lacks (and what they need),",
        f"#   compiled by {tool} for CPython {job.python} {PLATFORM} within vLLM's ranges,",
        "#   the lines above as constraints, and only files uploaded before the release:",
        f"#   --exclude-newer {job.exclude_newer} (the sdist's upload time).",
    ]
    for name, why in sorted(derived.items()):
        header.append(f"#   {name}: {why}")
    body = [f"{e.name}=={e.version}" for e in sorted(entries.values(), key=lambda e: e.name)]
    return "\n".join(header + body) + "\n"


def unpinned(text: str, roots: Iterable[str]) -> list[str]:
    """vLLM's own requirements a lock file pins nowhere (the kernels come from stacks.yaml)."""
    pinned = set(parse_lock(text))
    return sorted({normalize(r) for r in roots} - pinned - {"vllm-xpu-kernels"})


# ---- hashes ------------------------------------------------------------------------------


def without_hashes(text: str) -> str:
    """TEXT with every `--hash=sha256:...` removed (what the audit compares)."""
    return _HASH.sub("", text)


def wheel_tags(python: str) -> frozenset:
    """The wheel tags the image's interpreter takes: CPython PYTHON on PLATFORM and older
    manylinux levels, x86_64."""
    from packaging import tags

    major, minor = (int(x) for x in python.split(".")[:2])
    glibc = int(PLATFORM.rsplit("_", 1)[-1])
    platforms = [f"manylinux_2_{n}_x86_64" for n in range(glibc, 4, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    platforms += ["linux_x86_64"]
    found = set(tags.cpython_tags((major, minor), platforms=platforms))
    found |= set(tags.compatible_tags((major, minor), f"cp{major}{minor}", platforms))
    return frozenset(found)


def file_hashes(files: Iterable[tuple[str, str | None]], version: str, accepted) -> list[str]:
    """The sha256 of each wheel of VERSION among FILES ((filename, sha256) as the index lists
    them) whose tags the image takes, sorted."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename
    from packaging.version import Version

    sums = set()
    for filename, sha256 in files:
        if not filename.endswith(".whl") or not sha256:
            continue
        try:
            _, got, _, tags = parse_wheel_filename(filename)
        except InvalidWheelFilename:
            continue
        if got == Version(version) and tags & accepted:
            sums.add(sha256)
    return sorted(sums)


def with_hashes(text: str, hashes: Mapping[str, list[str]]) -> str:
    """TEXT with each pin of a name in HASHES followed by its `--hash=sha256:` options."""
    out = []
    for line in without_hashes(text).splitlines():
        m = _PIN.match(line)
        sums = hashes.get(normalize(m.group(1))) if m else None
        out.append(line + "".join(f" --hash=sha256:{h}" for h in sums) if sums else line)
    return "\n".join(out) + "\n"
