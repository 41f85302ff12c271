"""The package's import graph has no cycle: every import between arcvllm's modules (at the
top of a module or inside a function), plus the commands arcvllm.cli imports by name."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

from conftest import ROOT

from arcvllm import cli


def modules(package: Path) -> dict[str, Path]:
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of KNOWN that NAME (at PATH) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            for alias in node.names:
                member = f"{base}.{alias.name}"
                found |= {member} if member in known else {base} & known
    return found - {name}


def graph(package: Path) -> dict[str, set[str]]:
    found = modules(package)
    edges = {name: imports(name, path, set(found)) for name, path in found.items()}
    named = [*cli.COMMANDS, *(m for inner in cli.NESTED.values() for m in inner)]
    edges["arcvllm.cli"] |= {f"arcvllm.{m}" for m in named}
    return edges


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    try:
        tuple(graphlib.TopologicalSorter(edges).static_order())
    except graphlib.CycleError as exc:
        return exc.args[1]
    return None


def test_no_module_of_the_package_imports_itself_round_a_circle():
    assert cycle(graph(ROOT / "arcvllm")) is None


def test_a_circle_is_found_and_named():
    edges = graph(ROOT / "arcvllm")
    edges["arcvllm.options"].add("arcvllm.cli")  # options -> cli -> options
    found = cycle(edges)
    assert found and {"arcvllm.cli", "arcvllm.options"} <= set(found)


def test_the_commands_cli_names_exist():
    known = modules(ROOT / "arcvllm")
    named = [*cli.COMMANDS, *(m for inner in cli.NESTED.values() for m in inner)]
    assert {f"arcvllm.{m}" for m in named} <= set(known)
