"""One error vocabulary: ArcvllmError and its four named kinds, and nothing beside them."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

from arcvllm import errors

PACKAGE = Path(errors.__file__).resolve().parent
VOCABULARY = {"ArcvllmError", "CheckFailed", "UsageError", "Unavailable", "Degraded"}

# Exceptions beside the vocabulary, each with the reason it earns its own type.
ALLOWED = {
    # wait_until's callers (scale, the client, smoke's startup check) catch this one to
    # tell "not within the time" from an error the condition itself raised.
    ("client/api.py", "WaitTimeout"),
}


def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(), str(path)))
        for path in sorted(PACKAGE.rglob("*.py"))
    ]


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _is_builtin_exception(name: str) -> bool:
    value = getattr(builtins, name, None)
    return isinstance(value, type) and issubclass(value, BaseException)


def exception_classes() -> set[tuple[str, str]]:
    """(module path, class name) of every class under arcvllm/ that derives from an
    exception, builtin or its own (followed by name, to a fixed point)."""
    classes = [
        (where, node.name, [_name(b) for b in node.bases])
        for where, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    ]
    found: set[tuple[str, str]] = set()
    names: set[str] = set()
    while True:
        more = {
            (where, name)
            for where, name, bases in classes
            if any(_is_builtin_exception(b) or b in names for b in bases)
        }
        if more == found:
            return found
        found, names = more, {name for _, name in more}


def test_the_vocabulary_is_the_only_set_of_exceptions():
    own = {(w, n) for w, n in exception_classes() if w != "errors.py"}
    assert own - ALLOWED == set()
    assert {n for w, n in exception_classes() if w == "errors.py"} == VOCABULARY


def test_no_raise_spells_its_exit_status_as_a_number():
    numbered = []
    for where, tree in _modules():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and _name(node.func) in VOCABULARY):
                continue
            given = [*node.args[1:], *(k.value for k in node.keywords if k.arg == "exit_code")]
            if any(isinstance(a, ast.Constant) and isinstance(a.value, int) for a in given):
                numbered.append(f"{where}:{node.lineno}")
    assert numbered == []


@pytest.mark.parametrize(
    ("name", "status"), [("CheckFailed", 1), ("UsageError", 2), ("Unavailable", 3), ("Degraded", 4)]
)
def test_each_kind_carries_its_exit_status(name, status):
    kind = getattr(errors, name)
    assert issubclass(kind, errors.ArcvllmError) and kind.__doc__
    assert kind("x").exit_code == status == kind.exit_code
    assert str(kind("one line")) == "one line"


# `return N` of a constant 1-4 that is not an exit status, each with its reason.
NOT_EXIT_STATUSES = {
    ("patching/probe.py", "dim"),  # a tensor's number of dimensions
}


def test_no_command_spells_an_exit_status_as_a_number():
    """A failed check returns errors.status(...) or raises one of the vocabulary: a literal
    `return 1` (or 2, 3, 4) says nothing of who must act."""
    found = []
    for where, tree in _modules():
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(func):
                if (
                    isinstance(node, ast.Return)
                    and isinstance(node.value, ast.Constant)
                    and type(node.value.value) is int
                    and 1 <= node.value.value <= 4
                    and (where, func.name) not in NOT_EXIT_STATUSES
                ):
                    found.append(f"{where}:{node.lineno} {func.name}: return {node.value.value}")
    assert found == []


@pytest.mark.parametrize(("failed", "code"), [(True, errors.CheckFailed.exit_code), (False, 0)])
def test_a_check_that_printed_its_findings_exits_as_checkfailed(failed, code):
    assert errors.status(failed) == code
