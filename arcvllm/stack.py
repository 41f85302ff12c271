"""The pinned stacks (configs/stacks.yaml): which versions go into each image, and why.

The stacks file is the single source of truth; `make build` turns a stack into Docker
build args through `arcvllm stack build-args NAME`, so the Makefile, the Dockerfile and
the presets all read the same pins.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from arcvllm.errors import ArcvllmError
from arcvllm.paths import configs_dir
from arcvllm.text import columns

FLAVORS = ("cpu", "xpu")


@dataclass(frozen=True)
class Pin:
    """One build input: its value and where that value came from."""

    value: str
    source: str


@dataclass(frozen=True)
class Stack:
    name: str
    flavor: str
    description: str
    vllm_version: str
    args: Mapping[str, Pin]
    # XPU stacks: where the stack departs from its release's own files on purpose (a fact
    # `stack audit` reports -> the reason), so the audit passes on it.
    differences: Mapping[str, str] = field(default_factory=dict)

    def build_args(self) -> dict[str, str]:
        """Every Docker build arg this stack sets, stack identity first."""
        identity = {"FLAVOR": self.flavor, "STACK": self.name, "VLLM_VERSION": self.vllm_version}
        return {**identity, **{key: pin.value for key, pin in self.args.items()}}

    @property
    def sdist(self) -> str:
        """The file name of the release's source distribution (pinned by VLLM_SDIST_SHA256)."""
        return f"vllm-{self.vllm_version}.tar.gz"


def stacks_file() -> Path:
    return configs_dir() / "stacks.yaml"


def _pin(stack: str, key: str, raw: object) -> Pin:
    if not isinstance(raw, Mapping) or "value" not in raw or "from" not in raw:
        raise ArcvllmError(f"stack {stack}: {key} needs `value` and `from` (where it came from)")
    value = raw["value"]
    return Pin("" if value is None else " ".join(str(value).split()), str(raw["from"]).strip())


def parse(data: object, source: str = "stacks.yaml") -> tuple[dict[str, Stack], dict[str, str]]:
    """Stacks by name, and the default stack per flavour, from the parsed YAML."""
    if not isinstance(data, Mapping) or not isinstance(data.get("stacks"), Mapping):
        raise ArcvllmError(f"{source}: expected a `stacks:` mapping")
    stacks: dict[str, Stack] = {}
    for name, raw in data["stacks"].items():
        if not isinstance(raw, Mapping):
            raise ArcvllmError(f"{source}: stack {name} is not a mapping")
        flavor = raw.get("flavor")
        if flavor not in FLAVORS:
            raise ArcvllmError(f"{source}: stack {name}: flavor must be one of {FLAVORS}")
        vllm = raw.get("vllm")
        if not isinstance(vllm, Mapping) or "version" not in vllm:
            raise ArcvllmError(f"{source}: stack {name}: needs `vllm: {{version: ...}}`")
        args = raw.get("args") or {}
        differences = raw.get("differences") or {}
        if not isinstance(differences, Mapping):
            raise ArcvllmError(
                f"{source}: stack {name}: `differences:` must map a fact to a reason"
            )
        stacks[str(name)] = Stack(
            name=str(name),
            flavor=flavor,
            description=" ".join(str(raw.get("description", "")).split()),
            vllm_version=str(vllm["version"]),
            args={str(k): _pin(str(name), str(k), v) for k, v in args.items()},
            differences={str(k): " ".join(str(v).split()) for k, v in differences.items()},
        )
    defaults = {str(k): str(v) for k, v in (data.get("defaults") or {}).items()}
    for flavor, name in defaults.items():
        if name not in stacks or stacks[name].flavor != flavor:
            raise ArcvllmError(f"{source}: default for {flavor} is not a {flavor} stack: {name}")
    return stacks, defaults


def read(path: Path | None = None) -> tuple[dict, Path]:
    """The stacks file as YAML (configs/stacks.yaml unless PATH), and its path: the one
    reader of that file."""
    import yaml

    path = path or stacks_file()
    if not path.exists():
        raise ArcvllmError(f"no stacks file at {path}")
    return yaml.safe_load(path.read_text()) or {}, path


def load(path: Path | None = None) -> tuple[dict[str, Stack], dict[str, str]]:
    data, path = read(path)
    return parse(data, str(path))


@dataclass(frozen=True)
class SideImage:
    """An image beside the server (gateway, router, ...): its name, tag and provenance."""

    name: str
    image: str
    tag: str
    source: str

    @property
    def ref(self) -> str:
        return f"{self.image}:{self.tag}"


def side_images(path: Path | None = None) -> dict[str, SideImage]:
    """The side images of the stacks file (`side_images:`), by Dockerfile target."""
    data, path = read(path)
    raw = data.get("side_images") or {}
    out = {}
    for name, entry in raw.items():
        if not isinstance(entry, Mapping) or not {"image", "tag", "from"} <= set(entry):
            raise ArcvllmError(f"{path}: side image {name} needs `image`, `tag` and `from`")
        out[str(name)] = SideImage(str(name), entry["image"], str(entry["tag"]), entry["from"])
    return out


def get(name: str, path: Path | None = None, flavor: str | None = None) -> Stack:
    """The stack NAME; an unknown name (or one of another flavour) lists the valid ones."""
    stacks, _ = load(path)
    if name not in stacks:
        raise ArcvllmError(f"unknown stack {name!r}; stacks: {', '.join(stacks)}")
    stack = stacks[name]
    if flavor is not None and stack.flavor != flavor:
        same = [s.name for s in stacks.values() if s.flavor == flavor]
        raise ArcvllmError(
            f"stack {name} is {stack.flavor}, not {flavor}; {flavor} stacks: {', '.join(same)}"
        )
    return stack


def render_build_args(values: Mapping[str, str]) -> str:
    """`--build-arg K=V ...`, quoted for a shell (values may hold spaces)."""
    return " ".join(f"--build-arg {shlex.quote(f'{k}={v}')}" for k, v in values.items())


def render_table(stacks: Mapping[str, Stack], defaults: Mapping[str, str]) -> str:
    rows = [("STACK", "FLAVOR", "VLLM", "DESCRIPTION")]
    for s in stacks.values():
        mark = " (default)" if defaults.get(s.flavor) == s.name else ""
        rows.append((s.name + mark, s.flavor, s.vllm_version, s.description))
    return columns(rows)


def render_stack(stack: Stack) -> str:
    lines = [f"{stack.name} ({stack.flavor}): {stack.description}", f"vLLM {stack.vllm_version}"]
    for key, pin in stack.args.items():
        lines.append(f"{key}={pin.value or '(empty)'}")
        lines.append(f"    from: {' '.join(pin.source.split())}")
    return "\n".join(lines)


def lookup(stack: Stack, key: str) -> str:
    """One value: a build arg (FLAVOR, VLLM_VERSION, TORCH_VERSION, ...)."""
    values = stack.build_args()
    if key not in values:
        raise ArcvllmError(f"stack {stack.name} has no {key}; keys: {', '.join(values)}")
    return values[key]


def stack_json(stack: Stack) -> dict:
    """What `stack show --json` prints: the render_stack facts as data."""
    return {
        "name": stack.name,
        "flavor": stack.flavor,
        "description": stack.description,
        "vllm": stack.vllm_version,
        "args": {
            k: {"value": p.value, "from": " ".join(p.source.split())} for k, p in stack.args.items()
        },
    }
