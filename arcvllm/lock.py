"""Our XPU lock: the release's own resolved XPU lock, cut to what vLLM needs at run time.

vLLM's sdist carries `requirements/test/xpu.txt`, a `uv pip compile` of its XPU test
requirements against `requirements/xpu.txt`: exact versions from the XPU index, each with a
`# via` note naming who requires it. Its runtime part is the closure of vLLM's own
requirements (the names in `requirements/common.txt` and `requirements/xpu.txt`): a lock
entry belongs to it when it is one of those names or one of its `# via` parents does.
Test-only tools (pytest, lm-eval, ...) fall out. Pure functions: text in, text out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)")
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


def render(source: Source, stack: str, entries: Mapping[str, Entry], roots: Iterable[str]) -> str:
    """The lock file: a header that says where every line came from, then `name==version`."""
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
        "# No --hash pins: the +xpu wheels (torch, torchvision, triton-xpu) come from",
        "#   PyTorch's XPU index, which the host that wrote this file cannot reach: their",
        "#   sums are unknown here, so the lock pins versions only.",
    ]
    if missing:
        header.append("# Not in the release's lock (its ranges resolve at build time):")
        line = "#  "
        for name in missing:
            if len(line) + len(name) + 1 > 90:
                header.append(line)
                line = "#  "
            line += f" {name}"
        header.append(line)
    body = [f"{e.name}=={e.version}" for e in sorted(entries.values(), key=lambda e: e.name)]
    return "\n".join(header + body) + "\n"
