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

import argparse
import hashlib
import json
import re
import shlex
import sys
import tarfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from arcvllm import options
from arcvllm.builder import dockerfile, index, lock
from arcvllm.errors import ArcvllmError, Unavailable, UsageError
from arcvllm.paths import data_root
from arcvllm.text import columns

RELEASE_FILES = {
    "dockerfile": "docker/Dockerfile.xpu",
    "xpu": "requirements/xpu.txt",
    "common": "requirements/common.txt",
    "lock": "requirements/test/xpu.txt",
}
# Python packages whose version is part of the image's identity on XPU.
PINNED = ("torch", "triton", "triton-xpu", "vllm-xpu-kernels")
# The oneAPI runtime wheels torch +xpu (or the release's Dockerfile) pins.
ONEAPI_WHEEL = re.compile(
    r"^(intel-[a-z0-9-]+|dpcpp-cpp-rt|onemkl-[a-z0-9-]+|oneccl[a-z0-9-]*|impi-rt|umf|tcmlib|mkl|tbb)$"
)
# ENV our side sets that the audit compares even where the release sets none: the device
# runtime's own variables (oneCCL, MPI/libfabric, Level Zero, SYCL, the loader path).
DEVICE_ENV_PREFIXES = re.compile(r"^(CCL_|I_MPI_|FI_|ZE_|SYCL_|ONEAPI_|UR_|NEO_|IGC_|LD_)")


# ---- the release's files -------------------------------------------------------------------


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


# ---- Dockerfiles, shell commands and variables ---------------------------------------------

_VAR = re.compile(
    r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*|[0-9]+)(?:(:-|:\+|:\?|#)([^}]*))?\}"
    r"|([A-Za-z_][A-Za-z0-9_]*|[0-9]))"
)


def substitute(text: str, values: Mapping[str, str]) -> str:
    """`$X`, `${X}`, `${X:-d}`, `${X:+w}`, `${X:?m}`, `${X#prefix}` from VALUES.

    A name VALUES does not know stays as written (it comes from the base image or the shell).
    """

    def one(m: re.Match[str]) -> str:
        name, op, word = m.group(1) or m.group(4), m.group(2), m.group(3)
        if name not in values:
            return substitute(word, values) if op == ":-" else m.group(0)
        value = values[name]
        if op == ":-" and not value:
            return substitute(word, values)
        if op == ":+":
            return substitute(word, values) if value else ""
        if m.group(2) == "#" and value.startswith(m.group(3)):
            return value[len(m.group(3)) :]
        return value

    return _VAR.sub(one, text)


@dataclass
class Stage:
    """One build stage: its name, what it is FROM (resolved), and its instructions."""

    name: str
    parent: str
    instructions: list[tuple[str, str]] = field(default_factory=list)


def parse_stages(text: str, build_args: Mapping[str, str]) -> list[Stage]:
    """The stages of a Dockerfile (dockerfile-parse), FROM lines resolved with global ARGs."""
    stages: list[Stage] = []
    global_args: dict[str, str] = {}
    for instruction, value in dockerfile.instructions(text):
        if instruction == "FROM":
            words = [w for w in value.split() if not w.startswith("--platform")]
            parent = substitute(words[0], global_args)
            name = words[2] if len(words) >= 3 and words[1].lower() == "as" else str(len(stages))
            stages.append(Stage(name, parent))
        elif not stages:
            if instruction == "ARG":
                key, _, default = value.partition("=")
                global_args[key.strip()] = build_args.get(key.strip(), dockerfile.unquote(default))
        else:
            stages[-1].instructions.append((instruction, value))
    for stage in stages:
        stage.instructions.insert(0, ("GLOBALS", json.dumps(global_args)))
    return stages


def _by_name(stages: Sequence[Stage]) -> dict[str, Stage]:
    return {s.name.lower(): s for s in stages}


def chain(stages: Sequence[Stage], final: Stage) -> list[Stage]:
    """FINAL and the stages it is FROM, root first."""
    names, out, stage = _by_name(stages), [], final
    while stage is not None and stage not in out:
        out.insert(0, stage)
        stage = names.get(stage.parent.lower())
    return out


def venv_stages(stages: Sequence[Stage], final: Stage) -> list[Stage]:
    """Stages whose pip steps reach FINAL: its chain and, recursively, its COPY --from ones."""
    names, keep, todo = _by_name(stages), set(), [final]
    while todo:
        for stage in chain(stages, todo.pop()):
            if stage.name in keep:
                continue
            keep.add(stage.name)
            for instruction, value in stage.instructions:
                m = re.search(r"--from=(\S+)", value) if instruction == "COPY" else None
                if m and (source := names.get(m.group(1).lower())) is not None:
                    todo.append(source)
    return [s for s in stages if s.name in keep]


def _mounts(value: str) -> tuple[dict[str, str], str]:
    """(target -> source of the context's bind mounts, the command) of a RUN's value."""
    m = re.match(r"^((?:--\S+\s+)*)(.*)$", value.strip(), re.DOTALL)
    flags, command = (m.group(1), m.group(2)) if m else ("", value)
    mounts = {}
    for flag in flags.split():
        if flag.startswith("--mount="):
            opts = dict(o.partition("=")[::2] for o in flag[len("--mount=") :].split(","))
            source = opts.get("source") or opts.get("src")
            if "target" in opts and source and "from" not in opts:
                mounts[opts["target"]] = source
    return mounts, command


def _mounted(path: str, mounts: Mapping[str, str], program: bool = False) -> str:
    """PATH inside a RUN, as the build-context path a bind mount (file or folder) gives it
    (a PROGRAM without a slash is looked up on PATH: a mount target of that name)."""
    for target, source in mounts.items():
        if path == target or (program and "/" not in path and target.endswith("/" + path)):
            return source
        if path.startswith(target.rstrip("/") + "/"):
            return source.rstrip("/") + path[len(target.rstrip("/")) :]
    return path


def _test(words: Sequence[str]) -> bool:
    """A `[ ... ]` condition over resolved words; anything unknown counts as true."""
    body = [w for w in words if w not in ("[", "]", "[[", "]]")]
    if len(body) == 2 and body[0] == "-n":
        return body[1] != "" and not body[1].startswith("$")
    if len(body) == 2 and body[0] == "-z":
        return body[1] == ""
    if len(body) == 3 and body[1] in ("=", "==", "!=") and "$" not in body[0] + body[2]:
        return (body[0] == body[2]) == (body[1] != "!=")
    return True


def commands(script: str) -> Iterator[list[str]]:
    """The simple commands of a resolved shell script that run, `if [ ... ]` evaluated."""
    try:
        lexer = shlex.shlex(script, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        tokens = script.split()
    segments: list[list[str]] = [[]]
    for token in tokens:
        if token and set(token) <= set(";&|"):
            segments.append([])
        else:
            segments[-1].append(token)
    active, frames = True, []
    for words in segments:
        while words and words[0] in ("if", "then", "else", "elif", "fi", "do", "done"):
            keyword = words.pop(0)
            if keyword == "if":
                cond = _test(words)
                frames.append((active, cond))
                active, words = active and cond, []
            elif keyword == "elif" and frames:
                parent, taken = frames[-1]
                cond = _test(words)
                frames[-1] = (parent, taken or cond)
                active, words = parent and not taken and cond, []
            elif keyword == "else" and frames:
                parent, taken = frames[-1]
                active = parent and not taken
            elif keyword == "fi" and frames:
                active = frames.pop()[0]
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            words.pop(0)
        if words and active:
            yield words


# ---- facts ---------------------------------------------------------------------------------


@dataclass
class Facts:
    """One side's facts by key (`base`, `apt:vim`, `pin:torch`, ...); absent = not there.

    Python projects: `packages` it ever installs, `installed` at the end, and `uninstalled`
    by an explicit uninstall step (the `uninstall:NAME` facts are made from these three).
    """

    values: dict[str, str] = field(default_factory=dict)
    packages: set[str] = field(default_factory=set)
    installed: set[str] = field(default_factory=set)
    uninstalled: set[str] = field(default_factory=set)
    resolves: bool = False  # a pip step installs vLLM with its dependencies resolved


_OPTS_WITH_VALUE = {
    "-r", "--requirement", "-c", "--constraint", "-e", "--editable", "-i", "--index-url",
    "--extra-index-url", "-f", "--find-links", "-t", "--target", "--prefix", "--root",
    "-p", "--python", "--no-binary", "--only-binary", "--platform", "--upgrade-strategy",
    "--index-strategy", "--torch-backend", "--cache-dir",
}  # fmt: skip


def _pip(words: list[str]) -> tuple[str, list[str]] | None:
    """(sub-command, its words) when WORDS run pip (pip, pip3, uv pip, python -m pip)."""
    for i, word in enumerate(words[:4]):
        base = word.rsplit("/", 1)[-1]
        if base in ("pip", "pip3") and (i == 0 or words[i - 1] in ("uv", "-m")):
            rest = words[i + 1 :]
            return (rest[0], rest[1:]) if rest else None
    return None


def _deb(url: str) -> tuple[str, str]:
    """(package, version) of a .deb URL: `name_version_arch.deb`."""
    from urllib.parse import unquote

    parts = unquote(url.rsplit("/", 1)[-1])[: -len(".deb")].split("_")
    return parts[0], parts[1] if len(parts) > 1 else ""


def dockerfile_facts(
    text: str,
    build_args: Mapping[str, str],
    requirement_file: Callable[[str], dict[str, str] | None],
    target: str | None = None,
    script_file: Callable[[str], str | None] = lambda _: None,
) -> Facts:
    """Facts of the image stage TARGET (default: the last) of TEXT builds, with BUILD_ARGS.

    apt packages, debs, the oneCCL installer and ENV come from the last stage's FROM chain
    (what its filesystem and environment start from); pip steps also from the stages it
    copies from (our runtime copies /opt/venv). REQUIREMENT_FILE maps a `-r`/`-c` path
    (bind mounts followed to their source) to the pins it holds, or None if unknown;
    SCRIPT_FILE gives the text of a script a RUN bind-mounts and runs, read as part of it.
    """
    stages = parse_stages(text, build_args)
    if not stages:
        raise Unavailable("the Dockerfile has no FROM")
    final = _by_name(stages).get(target.lower()) if target else stages[-1]
    if final is None:
        raise Unavailable(f"the Dockerfile has no stage {target}")
    serving = chain(stages, final)
    facts = Facts()
    facts.values["base"] = serving[0].parent
    apt: list[str] = []
    env: dict[str, str] = {}
    state: dict[str, str] = {}
    removed: list[str] = []
    in_chain = {s.name for s in serving}
    for stage in venv_stages(stages, final):
        args = dict(json.loads(stage.instructions[0][1]))
        values = {**args}
        stage_env = env if stage.name in in_chain else {}
        for instruction, value in stage.instructions[1:]:
            if instruction == "ARG":
                key, eq, default = value.partition("=")
                key = key.strip()
                if key in build_args:
                    args[key] = build_args[key]
                elif eq:
                    args[key] = substitute(dockerfile.unquote(default), {**args, **stage_env})
                else:
                    args.setdefault(key, "")
                values = {**args, **stage_env}
                if key == "PYTHON_VERSION" and stage.name in in_chain:
                    facts.values["python"] = args[key]
            elif instruction == "ENV" and stage.name in in_chain:
                for key, raw in dockerfile.env_pairs(value).items():
                    env[key] = substitute(raw, {**args, **env})
                values = {**args, **env}
            elif instruction == "RUN":
                mounts, script = _mounts(value)
                for words in commands(substitute(script, values)):
                    if words[:1] == ["grep"] and ">" in words[:-1]:
                        # `grep ... LOCK > PART`: PART holds lines of LOCK (pins read as LOCK's)
                        at = words.index(">")
                        mounts = {**mounts, words[at + 1]: _mounted(words[at - 1], mounts)}
                    found = [words]
                    if (text := script_file(_mounted(words[0], mounts, program=True))) is not None:
                        found += list(script_commands(text, words[1:], values))
                    for command in found:
                        if stage.name in in_chain:
                            apt = _apt(command, apt)
                            _downloads(command, facts)
                        _pip_step(command, mounts, values, requirement_file, state, removed, facts)
    for name in apt:
        facts.values[f"apt:{name}"] = "installed"
    for key, value in env.items():
        facts.values[f"env:{key}"] = value
    for name, version in state.items():
        if name in PINNED or ONEAPI_WHEEL.match(name):
            facts.values[f"{'pin' if name in PINNED else 'wheel'}:{name}"] = version or "unpinned"
    facts.installed = set(state)
    facts.uninstalled = set(removed)
    return facts


def script_commands(
    text: str, argv: Sequence[str], values: Mapping[str, str]
) -> Iterator[list[str]]:
    """The commands of a shell script run with ARGV: positional parameters and plain
    `name=value` assignments resolved line by line."""
    known = {**values, **{str(i): a for i, a in enumerate(argv, start=1)}}
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        words = line.split()
        if all(re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w) for w in words):
            for word in words:
                key, _, raw = word.partition("=")
                known[key] = dockerfile.unquote(substitute(raw, known))
            continue
        yield from commands(substitute(line, known))


def _downloads(words: list[str], facts: Facts) -> None:
    """GPU user-space .debs and the oneCCL installer a command fetches."""
    for word in words:
        if re.match(r"^https?://\S+\.deb$", word):
            name, version = _deb(word)
            facts.values[f"deb:{name}"] = version
        elif re.match(r"^https?://\S*oneccl\S*\.sh$", word, re.IGNORECASE):
            facts.values["oneccl-installer"] = word.rsplit("/", 1)[-1]


def _apt(words: list[str], installed: list[str]) -> list[str]:
    if not words or words[0].rsplit("/", 1)[-1] not in ("apt-get", "apt"):
        return installed
    rest, skip = [], False
    for word in words[1:]:
        if not skip and not word.startswith("-"):
            rest.append(word)
        skip = word in ("-o", "-t", "-c")  # options that take a value
    if not rest or rest[0] not in ("install", "purge", "remove"):
        return installed
    names = [w.split("=", 1)[0] for w in rest[1:] if not w.endswith(".deb") and "/" not in w]
    if rest[0] == "install":
        return installed + [n for n in names if n not in installed]
    return [n for n in installed if n not in names]


def _pip_step(
    words: list[str],
    mounts: Mapping[str, str],
    values: Mapping[str, str],
    requirement_file: Callable[[str], dict[str, str] | None],
    state: dict[str, str],
    removed: list[str],
    facts: Facts,
) -> None:
    found = _pip(words)
    if found is None:
        return
    sub, rest = found
    if sub == "uninstall":
        for word in rest:
            if not word.startswith("-"):
                name = lock.normalize(word)
                state.pop(name, None)
                removed.append(name)
        return
    if sub != "install":
        return
    pins: dict[str, str] = {}
    i = 0
    while i < len(rest):
        word = rest[i]
        if word in _OPTS_WITH_VALUE and i + 1 < len(rest):
            if word in ("-r", "--requirement", "-c", "--constraint"):
                path = _mounted(rest[i + 1], mounts)
                pins.update(requirement_file(substitute(path, values)) or {})
            i += 2
            continue
        if not word.startswith("-"):
            spec = word.split(";", 1)[0].strip()
            if m := re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(\S+)$", spec):
                pins[lock.normalize(m.group(1))] = m.group(2)
            elif m := re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)$", spec):
                pins.setdefault(lock.normalize(m.group(1)), "")
        i += 1
    for name, version in pins.items():
        state[name] = version or state.get(name, "")
        facts.packages.add(name)
    vllm = any(re.search(r"(^|/)vllm-[^/]*\.whl$|^\.$|/src/vllm$", w) for w in rest)
    # docker/install-vllm-xpu.sh: vLLM's own requirements, read from its installed wheel
    requires = any(w.endswith("/vllm-requires.txt") for w in rest)
    if (vllm and "--no-deps" not in rest) or requires:
        facts.resolves = True


def requirement_facts(roots: Sequence[str], facts: Facts) -> None:
    """`req:NAME` for each of vLLM's own requirements FACTS' image installs (installed by a
    pin or a lock, or resolved along with vLLM itself)."""
    for name in roots:
        if facts.resolves or name in facts.installed:
            facts.values[f"req:{name}"] = "installed"


def release_facts(release: Release) -> Facts:
    """The release's image: its Dockerfile.xpu with its requirement files as uv installs them."""
    lock_pins = {n: e.version for n, e in lock.parse_lock(release.files["lock"]).items()}
    xpu_pins = lock.requirement_pins(release.files["xpu"])

    def requirement_file(path: str) -> dict[str, str] | None:
        if path.endswith(RELEASE_FILES["lock"]):
            return lock_pins
        if path.endswith(RELEASE_FILES["xpu"]):
            return {n: xpu_pins.get(n, "") for n in lock.requirement_names(release.files["xpu"])}
        return None

    facts = dockerfile_facts(release.files["dockerfile"], {}, requirement_file)
    facts.packages |= set(lock_pins) | set(xpu_pins)
    facts.resolves = True  # uv pip install -r requirements/xpu.txt resolves vLLM's ranges
    requirement_facts(release.roots(), facts)
    facts.values["lock:unpinned"] = "none"  # what we hold our lock to: every one pinned
    return facts


def lock_path(args: Mapping[str, str], stack: str) -> str:
    """Where the stack's XPU lock lives (XPU_LOCK, or configs/locks/STACK.txt)."""
    return args.get("XPU_LOCK") or f"configs/locks/{stack}.txt"


def our_facts(dockerfile: str, args: Mapping[str, str], root: Path) -> Facts:
    """Our image for a stack: docker/Dockerfile with the stack's build args, plus its
    kernels pin (VLLM_XPU_KERNELS, installed through a file the Dockerfile writes)."""

    def requirement_file(path: str) -> dict[str, str] | None:
        file = root / path
        if file.is_file():
            return {n: e.version for n, e in lock.parse_lock(file.read_text()).items()}
        return None

    def script_file(path: str) -> str | None:
        file = root / path
        return file.read_text() if path.endswith(".sh") and file.is_file() else None

    facts = dockerfile_facts(
        dockerfile, {"FLAVOR": "xpu", **args}, requirement_file, "runtime", script_file
    )
    kernels = lock.requirement_pins(args.get("VLLM_XPU_KERNELS", ""))
    for name, version in kernels.items():
        facts.values[f"pin:{name}"] = version
        facts.packages.add(name)
        facts.installed.add(name)
    return facts


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


def _stack_entry(name: str, file: Path | None) -> tuple[object, Mapping[str, str]]:
    """The XPU stack NAME and its `differences:` mapping (missing = empty)."""
    from arcvllm.builder import stack as stacks

    try:
        found = stacks.get(name, file, flavor="xpu")
    except ArcvllmError as exc:
        raise UsageError(str(exc)) from None
    return found, found.differences


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


def _cmd(args: argparse.Namespace) -> int:
    options = {"file": args.stacks_file, "cache": args.cache_dir, "sdist": args.sdist}
    if args.action == "lock":
        written = write_lock(args.name, **options)
        print(json.dumps({"stack": args.name, "lock": str(written)}) if args.json else written)
        return 0
    result = audit(args.name, dockerfile=args.dockerfile, **options)
    if args.json:
        print(json.dumps(result.as_json(), indent=2))
    else:
        print(table(result.rows))
    for line in result.problems():
        print(f"arcvllm: {line}", file=sys.stderr)
    return 1 if result.problems() else 0


def register(sub: argparse._SubParsersAction) -> None:
    """`stack audit` and `stack lock`, under the `stack` command."""
    for action, text in (
        ("audit", "compare an XPU stack with its release's own Dockerfile.xpu and lock"),
        ("lock", "write an XPU stack's lock from its release's resolved XPU lock"),
    ):
        parser = sub.add_parser(action, help=text, description=text)
        parser.add_argument("name", metavar="STACK")
        parser.add_argument(
            "--cache-dir", type=Path, default=None, help="sdist folder (default: build/sdists)"
        )
        parser.add_argument(
            "--sdist", type=options.existing_file, default=None, help="this sdist file instead"
        )
        if action == "audit":
            options.add_json(parser, help="the facts as JSON")
            parser.add_argument(
                "--dockerfile",
                type=options.existing_file,
                default=None,
                help="another Dockerfile of ours",
            )
        else:
            options.add_json(parser, help="the stack and the lock file written, as JSON")
        parser.set_defaults(func=_cmd)
