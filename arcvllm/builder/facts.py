"""The facts of an XPU image, read on the build host from its Dockerfile without building
it: base, Python, apt packages, GPU user-space debs, the oneCCL installer, ENV, the pins of
torch / triton / the kernels and the oneAPI runtime wheels, uninstalls, vLLM's own
requirements. The same reading for a release's docker/Dockerfile.xpu (release_facts) and
for ours with a stack's build args (our_facts): what the fidelity audit compares.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from arcvllm.builder import dockerfile, lock, shell
from arcvllm.builder.sdist import RELEASE_FILES, Release
from arcvllm.errors import Unavailable

# Python packages whose version is part of the image's identity on XPU.
PINNED = ("torch", "triton", "triton-xpu", "vllm-xpu-kernels")
# The oneAPI runtime wheels torch +xpu (or the release's Dockerfile) pins.
ONEAPI_WHEEL = re.compile(
    r"^(intel-[a-z0-9-]+|dpcpp-cpp-rt|onemkl-[a-z0-9-]+|oneccl[a-z0-9-]*|impi-rt|umf|tcmlib|mkl|tbb)$"
)


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
    stages = dockerfile.parse_stages(text, build_args)
    if not stages:
        raise Unavailable("the Dockerfile has no FROM")
    final = dockerfile.by_name(stages).get(target.lower()) if target else stages[-1]
    if final is None:
        raise Unavailable(f"the Dockerfile has no stage {target}")
    serving = dockerfile.chain(stages, final)
    facts = Facts()
    facts.values["base"] = serving[0].parent
    apt: list[str] = []
    env: dict[str, str] = {}
    state: dict[str, str] = {}
    removed: list[str] = []
    in_chain = {s.name for s in serving}
    for stage in dockerfile.venv_stages(stages, final):
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
                    args[key] = shell.substitute(shell.unquote(default), {**args, **stage_env})
                else:
                    args.setdefault(key, "")
                values = {**args, **stage_env}
                if key == "PYTHON_VERSION" and stage.name in in_chain:
                    facts.values["python"] = args[key]
            elif instruction == "ENV" and stage.name in in_chain:
                for key, raw in dockerfile.env_pairs(value).items():
                    env[key] = shell.substitute(raw, {**args, **env})
                values = {**args, **env}
            elif instruction == "RUN":
                mounts, script = shell.run_mounts(value)
                for words in shell.commands(shell.substitute(script, values)):
                    if words[:1] == ["grep"] and ">" in words[:-1]:
                        # `grep ... LOCK > PART`: PART holds lines of LOCK (pins read as LOCK's)
                        at = words.index(">")
                        mounts = {**mounts, words[at + 1]: shell.mounted(words[at - 1], mounts)}
                    found = [words]
                    if (
                        run := script_file(shell.mounted(words[0], mounts, program=True))
                    ) is not None:
                        found += list(shell.script_commands(run, words[1:], values))
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
                path = shell.mounted(rest[i + 1], mounts)
                pins.update(requirement_file(shell.substitute(path, values)) or {})
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
