"""The stacks as `arcvllm stack` prints them, on a host or in CI: the list, a flavour's
default, one stack, its build args, one arg's value (each a JSON document and its text)."""

from __future__ import annotations

from pathlib import Path

from arcvllm import stack
from arcvllm.errors import ArcvllmError, UsageError
from arcvllm.text import Shown


def listing(stacks_file: Path | None = None) -> Shown:
    """Every stack, one a line: its name, flavour, vLLM, description and whether it is its
    flavour's default."""
    stacks, defaults = stack.load(stacks_file)
    doc = [
        {
            "name": s.name,
            "flavor": s.flavor,
            "vllm": s.vllm_version,
            "description": s.description,
            "default": defaults.get(s.flavor) == s.name,
        }
        for s in stacks.values()
    ]
    return Shown(doc, stack.render_table(stacks, defaults))


def default(flavor: str, stacks_file: Path | None = None) -> Shown:
    """FLAVOR's default stack (UsageError: the flavour has none)."""
    _, defaults = stack.load(stacks_file)
    if flavor not in defaults:
        raise UsageError(f"no default stack for flavour {flavor!r}")
    return Shown({"flavor": flavor, "stack": defaults[flavor]}, defaults[flavor], indent=None)


def named(name: str, stacks_file: Path | None = None, flavor: str | None = None) -> stack.Stack:
    """The stack NAME named on the command line (UsageError: no such stack, or not FLAVOR)."""
    try:
        return stack.get(name, stacks_file, flavor)
    except ArcvllmError as exc:
        raise UsageError(str(exc)) from None


def build_args(chosen: stack.Stack, ci: bool = False, standins_dir: Path | None = None) -> Shown:
    """CHOSEN's Docker build args: CI's (its stand-ins) when CI, else with the sdist's URL."""
    from arcvllm.builder import image, index

    values = image.ci_build_args(chosen, standins_dir) if ci else index.build_args(chosen)
    return Shown(values, stack.render_build_args(values))


def value(chosen: stack.Stack, key: str) -> Shown:
    """One build arg's value (UsageError: CHOSEN has no KEY)."""
    try:
        found = stack.lookup(chosen, key)
    except ArcvllmError as exc:  # a key named on the command line
        raise UsageError(str(exc)) from None
    return Shown({"stack": chosen.name, "key": key, "value": found}, found, indent=None)


def answer(
    action: str | None,
    name: str | None = None,
    stacks_file: Path | None = None,
    flavor: str | None = None,
    key: str | None = None,
    ci: bool = False,
    standins_dir: Path | None = None,
) -> Shown:
    """What `arcvllm stack ACTION` prints: list (no ACTION), default, show, build-args, get."""
    if action in (None, "list"):
        return listing(stacks_file)
    if action == "default":
        return default(str(name), stacks_file)
    chosen = named(str(name), stacks_file, flavor)
    if action == "show":
        return Shown(stack.stack_json(chosen), stack.render_stack(chosen))
    if action == "build-args":
        return build_args(chosen, ci, standins_dir)
    return value(chosen, str(key))
