"""The package's layout: its import graph has no cycle (every import between arcvllm's
modules, at the top of a module or inside a function, plus the commands arcvllm.cli imports
by name), each subpackage says where its code runs, and the product wheel (built as the
image builds it) holds no CI stand-in."""

from __future__ import annotations

import ast
import graphlib
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support import ROOT

from arcvllm import cli


def modules(package: Path) -> dict[str, Path]:
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def import_sites(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(module of KNOWN, line) for each import NAME (at PATH) makes, at its top or inside a
    function."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name in known]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            for alias in node.names:
                member = f"{base}.{alias.name}"
                target = member if member in known else base if base in known else None
                found += [(target, node.lineno)] if target else []
    return [(target, line) for target, line in found if target != name]


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of KNOWN that NAME (at PATH) imports."""
    return {target for target, _ in import_sites(name, path, known)}


def graph(package: Path) -> dict[str, set[str]]:
    found = modules(package)
    edges = {name: imports(name, path, set(found)) for name, path in found.items()}
    edges["arcvllm.cli"] |= {f"arcvllm.{m}" for m in cli.COMMANDS}
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


# The layers, lowest first: a part of arcvllm (a subpackage, or a module at the top) may
# import its own modules and those of the parts this table allows it, nothing else: no
# import runs up (docs/architecture.md). Imports inside functions count as much as those at
# the top: a lazy import still ties the lower part to the higher one.
CORE = {"arcvllm", "errors", "paths", "text", "options", "docker", "stack", "modelconfig"}
PRESET_MODEL = {"presets", "defects", "model"}
BELOW_OPERATE = CORE | PRESET_MODEL | {"client", "serving", "smoke", "bench", "verify"}
ALLOWED = {
    **dict.fromkeys(CORE, CORE),
    "ci": CORE,  # CI's stand-ins: data and their reader (left out of the wheel)
    **dict.fromkeys(PRESET_MODEL, CORE | PRESET_MODEL),
    "client": CORE | PRESET_MODEL,
    "patching": CORE | PRESET_MODEL,
    "serving": CORE | PRESET_MODEL,
    "smoke": CORE | PRESET_MODEL | {"client"},
    "bench": CORE | PRESET_MODEL | {"client"},
    "verify": CORE | PRESET_MODEL | {"client"},
    "builder": CORE | PRESET_MODEL | {"patching", "ci"},
    "operate": BELOW_OPERATE,
    "commands": BELOW_OPERATE | {"patching", "builder", "ci", "operate"},
    "cli": CORE | {"commands", "ci"},
    "__main__": {"cli"},
}


def part(module: str) -> str:
    """The part of arcvllm MODULE belongs to: arcvllm.builder.image -> builder."""
    return module.split(".")[1] if "." in module else module


def upward(edges: dict[str, list[tuple[str, int]]]) -> list[str]:
    """Every import the table does not allow, one line each, naming both modules."""
    return [
        f"{source}:{line} imports {target}: {part(source)} may import only "
        f"{', '.join(sorted(ALLOWED.get(part(source), set())))}"
        for source, sites in sorted(edges.items())
        for target, line in sites
        if part(target) != part(source) and part(target) not in ALLOWED.get(part(source), set())
    ]


def sites(package: Path) -> dict[str, list[tuple[str, int]]]:
    found = modules(package)
    return {name: import_sites(name, path, set(found)) for name, path in found.items()}


def test_every_part_of_the_package_is_in_the_table_of_layers():
    assert {part(m) for m in modules(ROOT / "arcvllm")} == set(ALLOWED)


def test_no_import_runs_from_a_lower_layer_up_to_a_higher_one():
    assert upward(sites(ROOT / "arcvllm")) == []


def test_an_upward_import_is_found_and_named():
    edges = sites(ROOT / "arcvllm")
    edges["arcvllm.presets"].append(("arcvllm.builder.kernels", 7))  # the preset model -> build
    (found,) = upward(edges)
    assert found.startswith("arcvllm.presets:7 imports arcvllm.builder.kernels: presets may ")


def test_the_commands_cli_names_exist():
    """Every command module cli names exists, and every module of arcvllm/commands/ is named:
    one module a command, CI's in arcvllm/ci/ (left out of the wheel)."""
    known = modules(ROOT / "arcvllm")
    assert {f"arcvllm.{m}" for m in cli.COMMANDS} <= set(known)
    layer = {m for m in known if m.startswith("arcvllm.commands.")}
    assert layer == {f"arcvllm.{m}" for m in cli.COMMANDS if m.startswith("commands.")}
    assert all(m.startswith("ci.") for m in cli.CI_ONLY)


def test_each_subpackage_says_where_its_code_runs():
    for init in sorted((ROOT / "arcvllm").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.split()) >= 12, init
        first = doc.split("\n\n")[0]  # its first paragraph says where: a host, the image, CI
        assert re.search(r"\b(host|image|CI)\b", first), init


@pytest.fixture(scope="module")
def product_wheel(tmp_path_factory) -> zipfile.ZipFile:
    """The arcvllm wheel as the image's arcvllm-wheel stage builds it (the same lock)."""
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True)
    pip = [str(tmp / "venv" / "bin" / "pip"), "-q"]
    lock = ROOT / "configs" / "locks" / "arcvllm-build.txt"
    subprocess.run([*pip, "install", "--require-hashes", "--no-deps", "-r", str(lock)], check=True)
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(tmp), str(ROOT)],
        check=True,
        cwd=tmp,
    )
    (wheel,) = tmp.glob("arcvllm-*.whl")
    return zipfile.ZipFile(wheel)


def test_the_product_wheel_holds_no_ci_stand_in_and_every_module_it_names(product_wheel):
    names = product_wheel.namelist()
    assert not [n for n in names if n.startswith("arcvllm/ci/") or "standin" in n]
    assert "arcvllm/stack.py" in names and "arcvllm/_data/configs/stacks.yaml" in names
    (points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    modules = re.findall(r"= *([\w.]+):", product_wheel.read(points).decode())
    assert modules and all(f"{m.replace('.', '/')}.py" in names for m in modules), modules
    commands = [m for m in cli.COMMANDS if m not in cli.CI_ONLY]
    assert all(
        f"arcvllm/{m.replace('.', '/')}.py" in names
        or f"arcvllm/{m.replace('.', '/')}/__init__.py" in names
        for m in commands
    ), commands


def test_no_test_module_imports_another():
    """What tests share lives in tests/support/ (or conftest.py), never in a test module."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0].startswith("test_")]
    assert found == []


# Folders of tests/ that hold no tests: what they share, and requirements they read.
NOT_MIRRORS = {"support", "requirements"}
# Folders of the repository whose files are tested as such (compose files, deploy/'s
# configurations), each under a tests/ folder of its own name.
FILES_TESTED = {"deploy", "docker"}


def test_the_tests_mirror_the_package():
    """Each folder of tests/ is a subpackage of arcvllm, or a folder of the repository whose
    files it tests, and holds its tests; the commands every life shares (cli, errors,
    presets, the layout itself) and the documents' commands are tested at the top."""
    subpackages = {p.parent.name for p in (ROOT / "arcvllm").glob("*/__init__.py")}
    assert all((ROOT / name).is_dir() for name in FILES_TESTED)
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir()} - NOT_MIRRORS
    folders.discard("__pycache__")
    assert folders <= subpackages | FILES_TESTED, folders - subpackages - FILES_TESTED
    for folder in folders:
        assert list((ROOT / "tests" / folder).glob("test_*.py")), folder
    top = sorted(p.name for p in (ROOT / "tests").glob("test_*.py"))
    assert top == [
        "test_cli.py",
        "test_defects.py",
        "test_docs.py",
        "test_errors.py",
        "test_model.py",
        "test_package.py",
        "test_presets.py",
    ], top


def test_without_the_ci_package_every_command_but_the_stand_ins_still_runs():
    """The wheel has no arcvllm.ci: `arcvllm` must still parse (the image's patch stage runs
    `arcvllm patches ...`), `standins` is not offered, and `stack build-args --ci` says why."""
    hide = "import sys; sys.modules['arcvllm.ci'] = None; from arcvllm.cli import main; "
    helped = subprocess.run(
        [sys.executable, "-c", hide + "sys.exit(main(['--help']))"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert " patches " in helped.stdout and " standins " not in helped.stdout
    ci = subprocess.run(
        [
            sys.executable,
            "-c",
            hide + "sys.exit(main(['stack', 'build-args', 'xpu-0.23', '--ci']))",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert ci.returncode == 3, ci.stderr[-2000:]
    assert ci.stderr.strip().splitlines() == [
        "arcvllm: CI's stand-ins come with a checkout of arcvllm, not with its wheel"
    ]


# The one place each side names the Docker client: the engine's provisioning (which installs
# Debian's and exports it as DOCKER to what it runs) and arcvllm.docker (which takes DOCKER).
DOCKER_CHOICES = {"scripts/ci/engine.sh", "arcvllm/docker.py"}


def test_one_finder_of_the_checkout_root():
    """arcvllm.paths.checkout_root() for the product and its scripts, tests/support's ROOT for
    the tests (the shell scripts' `cd "$(dirname "$0")/../.."` is the shell's one idiom):
    no other Python file walks up from its own path to the checkout."""
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    walk = re.compile(r"Path\(__file__\)[\w().]*?\.parent\.parent|__file__\)[\w().]*parents\[")
    found = {rel for rel in tracked if walk.search((ROOT / rel).read_text(errors="replace"))}
    assert found == {"tests/support/__init__.py"}


def test_one_choice_of_the_docker_client():
    found = set()
    tracked = subprocess.run(
        ["git", "ls-files", "*.py", "*.sh", "Makefile", ".ci/run"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    for rel in tracked:
        if rel.startswith("tests/"):
            continue
        if re.search(r"/usr/bin/docker(?![-\w])", (ROOT / rel).read_text(errors="replace")):
            found.add(rel)
    assert found == DOCKER_CHOICES
