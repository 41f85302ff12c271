"""The documents as tests: every shell block of README.md and docs/*.md is classified (run,
parse, b70: tests/support/documents.py); each one's commands, options, make targets and
variables, paths and environment variables exist; CI runs the `run` blocks as written.
Each check is shown failing on a sabotaged copy of a real document."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import ROOT, documents

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _read() -> tuple[list[tuple[documents.Block, dict[str, str]]], list[str]]:
    """Every block with the variables its document's earlier blocks set, and every marker
    problem."""
    blocks, problems = [], []
    for path in DOCUMENTS:
        found, wrong = documents.read(path, path.relative_to(ROOT).as_posix())
        problems += wrong
        earlier: dict[str, str] = {}
        for block in found:
            blocks.append((block, earlier))
            earlier = documents.defines(block, earlier)
    return blocks, problems


BLOCKS, MARKER_PROBLEMS = _read()
RUN = [block for block, _ in BLOCKS if block.kind == "run"]


@pytest.fixture(scope="module")
def repo() -> documents.Repository:
    return documents.repository(ROOT)


def sabotaged(
    tmp_path: Path, name: str, old: str, new: str
) -> tuple[list[documents.Block], list[str], int]:
    """A copy of document NAME with OLD (in it once) replaced by NEW: its blocks, its marker
    problems and the line of the change."""
    text = (ROOT / name).read_text()
    assert text.count(old) == 1, f"{name} no longer holds {old!r} once: choose another"
    copy = tmp_path / name
    copy.parent.mkdir(parents=True, exist_ok=True)
    changed = text.replace(old, new)
    copy.write_text(changed)
    blocks, problems = documents.read(copy, name)
    return blocks, problems, text[: text.index(old)].count("\n") + 1


def broken(tmp_path: Path, repo, name: str, old: str, new: str) -> tuple[list[str], str]:
    """The problems of every block of the sabotaged copy of NAME (as test_block_names_...
    sees them), and NAME:LINE of the change."""
    blocks, _, line = sabotaged(tmp_path, name, old, new)
    out, earlier = [], {}
    for block in blocks:
        out += documents.check(block, repo, earlier)
        earlier = documents.defines(block, earlier)
    return out, f"{name}:{line}"


# ---- the documents -----------------------------------------------------------------------


def test_every_shell_block_is_classified():
    assert BLOCKS, "no shell block found: has the parser stopped finding fences?"
    assert not MARKER_PROBLEMS, "\n".join(MARKER_PROBLEMS)


@pytest.mark.parametrize("block, earlier", BLOCKS, ids=[b.at(-1) for b, _ in BLOCKS])
def test_block_names_only_commands_options_paths_and_variables_that_exist(block, earlier, repo):
    problems = documents.check(block, repo, earlier)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("block", RUN, ids=[b.at(-1) for b in RUN])
def test_run_block_exits_zero_as_written(block, repo, tmp_path):
    problem = documents.run(block, documents.scratch_copy(ROOT, tmp_path))
    assert problem is None, problem


def test_a_few_blocks_run():
    """The run class is in use: a document's cheap commands run in CI, not only parse."""
    assert len(RUN) >= 2, [b.at(-1) for b in RUN]


# ---- each check, failing on a broken document ----------------------------------------------


def test_an_unmarked_block_fails(tmp_path):
    _, problems, line = sabotaged(tmp_path, "docs/operate.md", "<!-- doc-test: run -->\n", "")
    assert problems == [
        f"docs/operate.md:{line}: a shell block without a doc-test marker: {documents.HOW}"
    ]


def test_an_unknown_class_or_a_loose_marker_fails(tmp_path):
    marker = "<!-- doc-test: maybe -->\n"
    _, problems, line = sabotaged(
        tmp_path, "docs/operate.md", "<!-- doc-test: run -->\n", marker + "\n"
    )
    assert problems == [
        f"docs/operate.md:{line}: doc-test class 'maybe' is none of run, parse, cpu, b70",
        f"docs/operate.md:{line}: a doc-test marker not on the line right above its block",
        f"docs/operate.md:{line + 2}: a shell block without a doc-test marker: {documents.HOW}",
    ]


def test_an_unknown_subcommand_fails(tmp_path, repo):
    problems, at = broken(
        tmp_path, repo, "docs/operate.md", "arcvllm defects  ", "arcvllm defect   "
    )
    assert len(problems) == 1 and problems[0].startswith(
        f"{at}: arcvllm: no command 'defect' (it has "
    ), problems


def test_an_unknown_option_fails(tmp_path, repo):
    problems, at = broken(
        tmp_path, repo, "docs/operate.md", "defects --stack xpu-0.23", "defects --stak xpu-0.23"
    )
    assert len(problems) == 1 and problems[0].startswith(
        f"{at}: arcvllm defects: no option --stak (it has "
    ), problems


def test_an_option_of_another_command_fails(tmp_path, repo):
    """--dry-run is serve's, not doctor's: an option is held to the command it is given to."""
    problems, at = broken(tmp_path, repo, "docs/operate.md", "doctor --json ", "doctor --dry-run ")
    assert len(problems) == 1 and problems[0].startswith(
        f"{at}: arcvllm doctor: no option --dry-run "
    ), problems


def test_an_unknown_preset_or_stack_fails(tmp_path, repo):
    problems, at = broken(
        tmp_path,
        repo,
        "docs/operate.md",
        "--preset qwen3.6-35b-a3b-w4a16-2xb70\n",
        "--preset qwen3.6-35b-2xb70\n",
    )
    assert len(problems) == 1 and problems[0].startswith(
        f"{at}: arcvllm doctor: no preset 'qwen3.6-35b-2xb70' (there are "
    ), problems
    problems, at = broken(
        tmp_path,
        repo,
        "docs/development.md",
        "build-xpu-ci STACK=xpu-0.23",
        "build-xpu-ci STACK=xpu-0.22",
    )
    assert len(problems) == 1 and problems[0].startswith(
        f"{at}: make: no stack 'xpu-0.22' (there are "
    ), problems


def test_a_missing_argument_and_an_extra_one_fail(tmp_path, repo):
    problems, at = broken(tmp_path, repo, "README.md", "stack audit xpu-0.23 ", "stack audit ")
    assert problems == [
        f"{at}: arcvllm stack audit: missing arguments (usage: arcvllm stack audit STACK)"
    ]
    problems, at = broken(tmp_path, repo, "README.md", "arcvllm presets    ", "arcvllm presets all")
    assert problems == [f"{at}: arcvllm presets: unexpected argument 'all'"]


def test_a_line_that_is_no_command_fails(tmp_path, repo):
    """A continuation's lost backslash: the option that followed it starts a command."""
    problems, at = broken(
        tmp_path, repo, "docs/operate.md", "http://127.0.0.1:8001 \\\n", "http://127.0.0.1:8001\n"
    )
    line = int(at.rpartition(":")[2]) + 1
    assert problems == [f"docs/operate.md:{line}: '--preset' is not a command"]


def test_an_unknown_make_target_or_variable_fails(tmp_path, repo):
    problems, at = broken(
        tmp_path, repo, "docs/gateway.md", "make gateway-image    ", "make gateway-images   "
    )
    assert problems == [
        f"{at}: make -n gateway-images: make: *** No rule to make target 'gateway-images'.  Stop."
    ]
    problems, at = broken(
        tmp_path, repo, "docs/deploy.md", "FIELD_ARGS=--no-bench", "FIELD_OPTS=--no-bench"
    )
    assert problems == [f"{at}: make: FIELD_OPTS is no variable of the Makefile"]


def test_a_path_the_repository_has_not_fails(tmp_path, repo):
    problems, at = broken(
        tmp_path,
        repo,
        "docs/scale.md",
        "config deploy/prometheus/prometheus.yml",
        "config deploy/prometheus/prometheus.yaml",
    )
    assert problems == [f"{at}: no deploy/prometheus/prometheus.yaml in the repository"]


def test_an_environment_variable_the_project_does_not_define_fails(tmp_path, repo):
    problems, at = broken(
        tmp_path,
        repo,
        "docs/deploy.md",
        "ENV_FILE=$PWD/mine.env RENDER_GID",
        "ENVFILE=$PWD/mine.env RENDER_GID",
    )
    assert problems == [f"{at}: ENVFILE is no variable of the project ({documents.SOURCES})"]
    problems, at = broken(
        tmp_path,
        repo,
        "docs/deploy.md",
        'Bearer $KEY" https://127.0.0.1:8443/v1/models',
        'Bearer $APIKEY" https://127.0.0.1:8443/v1/models',
    )
    assert problems == [f"{at}: $APIKEY is no variable of the project ({documents.SOURCES})"]


def test_a_run_block_that_fails_fails_naming_its_line(tmp_path):
    blocks, _, line = sabotaged(
        tmp_path, "docs/operate.md", "defects --stack xpu-0.23", "defects --stack xpu-9.99"
    )
    (block,) = [b for b in blocks if "xpu-9.99" in b.text]
    (tmp_path / "scratch").mkdir()
    problem = documents.run(block, documents.scratch_copy(ROOT, tmp_path / "scratch"))
    expected = f"docs/operate.md:{line}: exit 2: arcvllm: unknown stack 'xpu-9.99'; stacks: "
    assert problem is not None and problem.startswith(expected), problem


def test_a_run_block_that_does_not_end_is_stopped(tmp_path):
    block = documents.Block("docs/x.md", 10, "sh", "run", "sleep 30\n")
    assert (
        documents.run(block, tmp_path, timeout=1)
        == "docs/x.md:11: the block did not end within 1 s"
    )
