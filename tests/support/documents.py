"""The shell blocks of README.md and docs/*.md, and what holds each to the repository.

Every ```sh, ```bash, ```shell or ```console block carries a marker on the line right
above it, an HTML comment the rendered page does not show:

    <!-- doc-test: run -->    cheap and safe on a CPU host: CI runs it as written (bash -e
                              -o pipefail, in a scratch copy of the checkout, with a timeout)
    <!-- doc-test: parse -->  needs what a CPU host's test run has not got (Docker, a running
                              deployment, a registry, a cluster, secrets): checked, not run
    <!-- doc-test: cpu -->    runs on the CPU flavour with a Docker engine and the CPU image:
                              checked as `parse` here, run by a deployment test that names
                              the document (tests/deploy/test_upgrade.py), placeholders such
                              as REGISTRY/arcvllm@sha256:NEW given values
    <!-- doc-test: b70 -->    needs an Arc Pro B70: checked as `parse` (CI has none)

Checked in every block, whatever its class: each `arcvllm ...` command (also behind
`docker run IMAGE` or `compose exec SERVICE`) against the real parser (arcvllm.cli's
build_parser: the sub-command, every option, the number of arguments, the preset and stack
named); each `make ...` against the Makefile (its variables, and the real `make -n` of the
targets); every repository path it names; every environment variable it sets or reads is
one the project defines (the settings file's keys, the Makefile's variables, what the
package reads) or a standard one. A synopsis is allowed in a checked block: `[--x]`,
`[--a A | --b B]`, `...`, and `make up / make down`.

Each problem is one line, `DOC:LINE: what is wrong`.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml
from markdown_it import MarkdownIt

SHELL = frozenset({"sh", "bash", "shell", "console"})
KINDS = ("run", "parse", "cpu", "b70")
MARKER = re.compile(r"<!--\s*doc-test:\s*(.*?)\s*-->")
HOW = "put <!-- doc-test: run|parse|cpu|b70 --> on the line above it (tests/support/documents.py)"

# Variables every shell and host has; the project's own are read from the repository.
STANDARD = frozenset({"HOME", "PATH", "PWD", "USER", "SHELL", "TMPDIR", "LANG", "DOCKER_HOST"})
# Where the variables a block may set or read come from, as its problems say.
SOURCES = "docker/arcvllm.env and the presets, the Makefile, the package, or a standard one"
# A run block's time, and of one `make -n`.
RUN_TIMEOUT = 120
MAKE_TIMEOUT = 30


@dataclass(frozen=True)
class Block:
    """One shell block: its document (as named in the repository), the line of its opening
    fence (1-based), its language, its class (None: no marker) and its text."""

    doc: str
    line: int
    lang: str
    kind: str | None
    text: str

    def at(self, offset: int = 0) -> str:
        """DOC:LINE of the block's line OFFSET (0: the first line inside the fence)."""
        return f"{self.doc}:{self.line + 1 + offset}"

    def script(self) -> str:
        """What a shell runs: a console block's `$ ` lines (and their continuations), each on
        the line it has in the block, so that line numbers still point into the document."""
        if self.lang != "console":
            return self.text
        out, going_on = [], False
        for line in self.text.splitlines():
            if line.startswith("$ ") or going_on:
                out.append(line.removeprefix("$ "))
                going_on = line.endswith("\\")
            else:
                out.append("")
        return "\n".join(out) + "\n"


def read(path: Path, name: str) -> tuple[list[Block], list[str]]:
    """The shell blocks of the Markdown file PATH (named NAME in messages), and the marker
    problems: a block without one, a class that does not exist, a marker above no shell
    block."""
    tokens = MarkdownIt("commonmark").parse(path.read_text())
    found, problems = [], []
    for i, token in enumerate(tokens):
        if token.type == "html_block" and MARKER.search(token.content):
            kind = MARKER.search(token.content).group(1)
            where = f"{name}:{token.map[0] + 1}"
            after = tokens[i + 1] if i + 1 < len(tokens) else None
            if kind not in KINDS:
                problems.append(f"{where}: doc-test class {kind!r} is none of {', '.join(KINDS)}")
            if not (after and after.type == "fence" and _lang(after) in SHELL):
                problems.append(f"{where}: a doc-test marker above no shell block")
            elif after.map[0] != token.map[1]:
                problems.append(f"{where}: a doc-test marker not on the line right above its block")
            continue
        if token.type != "fence" or _lang(token) not in SHELL:
            continue
        before = tokens[i - 1] if i else None
        marked = (
            before is not None and before.type == "html_block" and before.map[1] == token.map[0]
        )
        match = MARKER.search(before.content) if marked else None
        kind = match.group(1) if match and match.group(1) in KINDS else None
        block = Block(name, token.map[0] + 1, _lang(token), kind, token.content)
        if match is None:
            problems.append(f"{block.at(-1)}: a shell block without a doc-test marker: {HOW}")
        found.append(block)
    return found, problems


def _lang(token) -> str:
    return token.info.split()[0] if token.info.strip() else ""


# ---- what a block says: its commands and variables ----------------------------------------


@dataclass(frozen=True)
class Command:
    """A simple command of a block: the block line it starts on (0-based), the variables
    set for it alone (`NAME=value command`), and its words."""

    offset: int
    env: tuple[str, ...]
    words: tuple[str, ...]


SEPARATORS = frozenset({";", "&&", "||", "|", "&", ";;", "(", ")", "|&"})
REDIRECTS = frozenset({">", ">>", "<", ">&", "&>", "<&", "<<", "<<<", ">|"})
ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=")


def logical_lines(text: str) -> list[tuple[int, str]]:
    """The block's lines with backslash continuations joined, each with the offset of its
    first line, comments and synopsis notation taken out (plain)."""
    out: list[tuple[int, str]] = []
    start, parts = 0, []
    for offset, line in enumerate(text.splitlines()):
        if not parts:
            start = offset
        if line.endswith("\\"):
            parts.append(line[:-1])
            continue
        parts.append(line)
        out.append((start, plain(" ".join(parts))))
        parts = []
    if parts:
        out.append((start, plain(" ".join(parts))))
    return out


def plain(line: str) -> str:
    """LINE without its comment, and a synopsis made a command: `[`, `]` and `...` dropped,
    a `|` between brackets a space, a lone ` / ` between two commands a `;`. Quoted text is
    left as it is."""
    out, quote, depth = [], None, 0
    i = 0
    while i < len(line):
        c = line[i]
        word_start = i == 0 or line[i - 1] in " \t"
        word_end = i + 1 == len(line) or line[i + 1] in " \t"
        if quote:
            if c == quote:
                quote = None
            elif c == "\\" and quote == '"' and i + 1 < len(line):
                out.append(c)
                i += 1
                c = line[i]
        elif c in "'\"":
            quote = c
        elif c == "\\" and i + 1 < len(line):
            out.append(c)
            i += 1
            c = line[i]
        elif c == "#" and word_start:
            break
        elif c == "[" and word_start:
            depth += 1
            i += 1
            continue
        elif c == "]" and word_end and depth:
            depth -= 1
            i += 1
            continue
        elif c == "|" and depth:
            c = " "
        elif c == "/" and word_start and word_end:
            c = ";"
        elif (
            line.startswith("...", i)
            and word_start
            and (i + 3 == len(line) or line[i + 3] in " \t")
        ):
            i += 3
            continue
        out.append(c)
        i += 1
    return "".join(out)


def commands(text: str) -> list[Command]:
    """Every simple command of TEXT (a block's script), those inside `$( )` included."""
    out: list[Command] = []
    for offset, line in logical_lines(text):
        try:
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            lexer.commenters = ""
            tokens = list(lexer)
        except ValueError:  # an unbalanced quote: bash would refuse it too
            out.append(Command(offset, (), ("<unbalanced quote>",)))
            continue
        _split(tokens, offset, out)
    return out


def _split(tokens: list[str], offset: int, out: list[Command]) -> None:
    words: list[str] = []
    i = 0

    def close() -> None:
        env = []
        while words and ASSIGNMENT.match(words[0]):
            env.append(words.pop(0))
        if env or words:
            out.append(Command(offset, tuple(env), tuple(words)))
        words.clear()

    while i < len(tokens):
        token = tokens[i]
        if token.endswith("$") and i + 1 < len(tokens) and tokens[i + 1] == "(":
            depth, j = 1, i + 2
            while j < len(tokens) and depth:
                depth += {"(": 1, ")": -1}.get(tokens[j], 0)
                j += 1
            _split(tokens[i + 2 : j - 1], offset, out)  # the substitution's own commands
            words.append(token[:-1] + "$(...)")
            i = j
            continue
        if token in SEPARATORS:
            close()
        elif token in REDIRECTS:
            if words and words[-1].isdigit() and len(words[-1]) == 1:
                words.pop()  # 2>&1: a file descriptor, not an argument
            i += 1  # its target
        else:
            words.append(token)
        i += 1
    close()


REFERENCE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)|([A-Za-z_][A-Za-z0-9_]*))")


def references(text: str) -> list[tuple[int, str]]:
    """(offset, NAME) of every $NAME and ${NAME...} outside single quotes and comments."""
    out = []
    for offset, line in logical_lines(text):
        quote = None
        unquoted = []
        for c in line:
            if quote == "'":
                unquoted.append(" ")
                quote = None if c == "'" else quote
                continue
            if c == "'" and quote is None:
                quote = "'"
            elif c == '"':
                quote = None if quote == '"' else '"'
            unquoted.append(c)
        for match in REFERENCE.finditer("".join(unquoted)):
            out.append((offset, match.group(1) or match.group(2)))
    return out


# ---- what the repository defines ------------------------------------------------------------


@dataclass(frozen=True)
class Repository:
    """What the blocks are held to: the checkout, its CLI parser, the Makefile's variables,
    the variables the project defines, its presets and stacks, its top-level folders."""

    root: Path
    parser: argparse.ArgumentParser
    make_variables: frozenset[str]
    variables: frozenset[str]
    presets: frozenset[str]
    stacks: frozenset[str]
    folders: frozenset[str]
    compose: dict[str, dict[str, frozenset[str]]]  # docker/*.yaml: each service's profiles


@functools.cache
def repository(root: Path) -> Repository:
    from arcvllm import cli, presets, stack
    from arcvllm.operate import settings

    makefile = (root / "Makefile").read_text()
    make_variables = set(
        re.findall(r"^(?:export\s+)?([A-Za-z_]\w*)\s*(?:\?|:|::|\+)?=", makefile, re.M)
    )
    make_variables |= set(re.findall(r"\$[({]([A-Za-z_]\w*)[)}]", makefile))
    make_variables |= set(re.findall(r"\$\((?:origin|value|flavor) ([A-Za-z_]\w*)\)", makefile))
    for names in re.findall(r"^export\s+([A-Za-z_][\w ]*)$", makefile, re.M):
        make_variables |= set(names.split())
    read_by_package = set()
    for path in (root / "arcvllm").rglob("*.py"):
        read_by_package |= set(
            re.findall(
                r"(?:environ(?:\.get)?|getenv)\s*[(\[]\s*[\"']([A-Z][A-Z0-9_]*)[\"']",
                path.read_text(),
            )
        )
    stacks, _ = stack.load()
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return Repository(
        root=root,
        parser=cli.build_parser(),
        make_variables=frozenset(make_variables),
        variables=frozenset(settings.known_keys()) | make_variables | read_by_package | STANDARD,
        presets=frozenset(presets.load_all()),
        stacks=frozenset(stacks),
        folders=frozenset(p.split("/")[0] for p in listed if "/" in p),
        compose={
            path.relative_to(root).as_posix(): {
                name: frozenset(service.get("profiles") or ())
                for name, service in yaml.safe_load(path.read_text())["services"].items()
            }
            for path in sorted((root / "docker").glob("compose*.yaml"))
        },
    )


# ---- the checks ---------------------------------------------------------------------------


def defines(block: Block, earlier: Mapping[str, str] | None = None) -> dict[str, str]:
    """The shell variables BLOCK sets for itself (`NAME=value` alone, `for NAME in`) after
    those of EARLIER blocks, with their values (a reader's shell keeps them for the
    document's later blocks)."""
    local = dict(earlier or {})
    for command in commands(block.script()):
        if not command.words:
            for word in command.env:
                name, _, value = word.partition("=")
                local[name] = expand(value, local)
        elif command.words[:1] == ("for",) and len(command.words) > 1:
            local[command.words[1]] = ""
    return local


def expand(text: str, local: Mapping[str, str]) -> str:
    """TEXT with the block's own $NAME and ${NAME} replaced by their values."""
    return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: local.get(m.group(1), m.group(0)), text)


def check(block: Block, repo: Repository, earlier: Mapping[str, str] | None = None) -> list[str]:
    """Every problem of BLOCK's commands, paths and variables, one line each; EARLIER: the
    variables the document's blocks before it set (defines)."""
    script = block.script()
    problems: list[str] = []
    local = defines(block, earlier)
    for command in commands(script):
        where = block.at(command.offset)
        words = []
        for word in command.words:  # $C (a command prefix the block set) split into words
            known = re.fullmatch(r"\$\{?([A-Za-z_]\w*)\}?", word)
            words += (
                shlex.split(local[known.group(1)]) if known and known.group(1) in local else [word]
            )
        for word in command.env if words else ():
            name = ASSIGNMENT.match(word).group(1)
            if name not in repo.variables:
                problems.append(f"{where}: {name} is no variable of the project ({SOURCES})")
        if words[:1] == ["export"]:
            for word in words[1:]:
                name = word.partition("=")[0]
                if name not in repo.variables:
                    problems.append(f"{where}: {name} is no variable of the project ({SOURCES})")
        if words and re.match(r"[-\d]", words[0]):  # a lost `\`, a settings line
            problems.append(f"{where}: {words[0]!r} is not a command")
        at = arcvllm_at(words)
        if at is not None:
            problems += [f"{where}: {p}" for p in check_arcvllm(words[at:], repo)]
        elif words[:1] == ["make"]:
            problems += [f"{where}: {p}" for p in check_make(words[1:], repo)]
        elif words[:2] == ["docker", "compose"]:
            problems += [f"{where}: {p}" for p in check_compose(words[2:], repo)]
    for offset, name in references(script):
        if name not in local and name not in repo.variables:
            problems.append(
                f"{block.at(offset)}: ${name} is no variable of the project ({SOURCES})"
            )
    problems += [f"{block.at(offset)}: {p}" for offset, p in check_paths(script, repo)]
    return problems


def arcvllm_at(words: list[str]) -> int | None:
    """Where an arcvllm command line starts in WORDS (the index after `arcvllm`): the command
    itself (`arcvllm`, `.venv/bin/arcvllm`, `python -m arcvllm`), or behind another, as in
    `docker run IMAGE arcvllm ...` or `compose exec SERVICE arcvllm ...` (never the value of
    an option: `-p arcvllm`)."""
    if not words:
        return None
    if words[0] == "arcvllm" or words[0].endswith("/bin/arcvllm"):
        return 1
    if words[0].startswith(("python", ".venv/bin/python")) and words[1:3] == ["-m", "arcvllm"]:
        return 3
    inside = words[0] == "docker" and ("run" in words or "exec" in words)
    for i, word in enumerate(words[1:], 1):
        before = words[i - 1]
        if word == "arcvllm" and (before == "--" or (inside and not before.startswith("-"))):
            return i + 1
    return None


def placeholder(value: str) -> bool:
    """A value the reader fills in: NAME, PRESET, HOST/PATH, ..., URL."""
    return "..." in value or bool(re.fullmatch(r"[A-Z][A-Z0-9_/:.\-]*", value))


def check_arcvllm(argv: list[str], repo: Repository) -> list[str]:
    """ARGV (after `arcvllm`) held to the real parser: each sub-command, each option of the
    command it is given to (full names), the number of arguments, the options it requires,
    and the preset or stack it names."""
    parser, prog = repo.parser, "arcvllm"
    problems: list[str] = []
    positional: list[str] = []
    given: set[argparse.Action] = set()
    named: list[tuple[argparse.Action, str]] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            rest = [a for a in _positionals(parser) if a.nargs == argparse.REMAINDER]
            if not rest:
                problems.append(f"{prog}: takes no `-- ARGS`")
            break
        if word.startswith("-") and word != "-" and not re.fullmatch(r"-\d+(\.\d+)?", word):
            name, eq, value = word.partition("=")
            action = parser._option_string_actions.get(name)
            if action is None:
                known = sorted(o for o in parser._option_string_actions if o.startswith("--"))
                problems.append(f"{prog}: no option {name} (it has {', '.join(known)})")
                skip = not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-")
                i += 2 if skip else 1  # and what looks like its value
                continue
            given.add(action)
            takes = action.nargs != 0
            if takes and not eq and action.nargs in (None, 1):
                if i + 1 >= len(argv):
                    problems.append(f"{prog}: {name} needs a value")
                else:
                    value = argv[i + 1]
                    i += 1
            elif takes and not eq and action.nargs == "?":
                if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                    value = argv[i + 1]
                    i += 1
            elif takes and not eq:  # * or +: up to the next option
                while i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                    i += 1
            if value:
                named.append((action, value))
            i += 1
            continue
        sub = _subcommands(parser)
        if sub is not None:
            if word not in sub.choices:
                problems.append(f"{prog}: no command {word!r} (it has {', '.join(sub.choices)})")
                return problems
            problems += _missing(parser, prog, given)
            parser, prog = sub.choices[word], f"{prog} {word}"
            given = set()
            i += 1
            continue
        positional.append(word)
        if any(a.nargs == argparse.REMAINDER for a in _positionals(parser)):
            break  # the rest is the command's own (serve's vLLM arguments)
        i += 1
    if any(isinstance(a, (argparse._HelpAction, argparse._VersionAction)) for a in given):
        return problems  # `arcvllm CMD --help` asks for nothing more
    sub = _subcommands(parser)
    if sub is not None and sub.required:
        problems.append(f"{prog}: which one? ({', '.join(sub.choices)})")
        return problems
    problems += _missing(parser, prog, given)
    low, high = 0, 0
    slots = _positionals(parser)
    for action in slots:
        n = action.nargs
        low += {None: 1, "?": 0, "*": 0, "+": 1, argparse.REMAINDER: 0}.get(
            n, n if isinstance(n, int) else 0
        )
        high += {None: 1, "?": 1}.get(n, n if isinstance(n, int) else 10**6)
    if len(positional) > high:
        problems.append(f"{prog}: unexpected argument {positional[high]!r}")
    elif len(positional) < low:
        names = " ".join((a.metavar or a.dest).upper() for a in slots)
        problems.append(f"{prog}: missing arguments (usage: {prog} {names})")
    for action, value in zip(slots, positional, strict=False):
        named.append((action, value))
    for action, value in named:
        problems += _known_name(prog, action, value, repo)
    return problems


def _positionals(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a for a in parser._actions
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction)
    ]  # fmt: skip


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _missing(parser: argparse.ArgumentParser, prog: str, given: set[argparse.Action]) -> list[str]:
    return [
        f"{prog}: {action.option_strings[-1]} is required"
        for action in parser._actions
        if action.required and action.option_strings and action not in given
    ]


def _known_name(prog: str, action: argparse.Action, value: str, repo: Repository) -> list[str]:
    """A preset or stack the command line names exists (a placeholder is the reader's)."""
    what = (action.metavar or action.dest or "").lower()
    if placeholder(value) or what not in ("preset", "stack"):
        return []
    if action.choices is not None and value not in action.choices:
        return [f"{prog}: {value!r} is none of {', '.join(map(str, action.choices))}"]
    known = repo.presets if what == "preset" else repo.stacks
    if value not in known:
        return [f"{prog}: no {what} {value!r} (there are {', '.join(sorted(known))})"]
    return []


def check_make(args: list[str], repo: Repository) -> list[str]:
    """`make ARGS`: each VAR=value names a variable of the Makefile (and a preset or stack
    that exists), each target exists: the real `make -n` of them, with a shell that runs
    nothing (the lines `make -n` would still run, those that call $(MAKE), do nothing)."""
    problems, targets, assignments = [], [], []
    for word in args:
        match = ASSIGNMENT.match(word)
        if match:
            name, value = match.group(1), word[match.end() :]
            assignments.append(word)
            if name not in repo.make_variables:
                problems.append(f"make: {name} is no variable of the Makefile")
            elif name in ("PRESET", "STACK") and value and not placeholder(value):
                known = repo.presets if name == "PRESET" else repo.stacks
                if value not in known:
                    problems.append(
                        f"make: no {name.lower()} {value!r} (there are {', '.join(sorted(known))})"
                    )
        elif word.startswith("-"):
            problems.append(f"make: option {word} is not checked here: name targets and variables")
        else:
            targets.append(word)
    out = subprocess.run(
        ["make", "-n", "--no-print-directory", "SHELL=true", *targets, *assignments],
        cwd=repo.root, env=top_level(), capture_output=True, text=True, timeout=MAKE_TIMEOUT,
    )  # fmt: skip
    if out.returncode != 0:
        said = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        problems.append(f"make -n {' '.join(targets)}: {said}")
    return problems


# docker compose's options that take a value: its own, and those of the commands named below.
COMPOSE_VALUES = frozenset({
    "-p", "--project-name", "-f", "--file", "--env-file", "--profile", "--project-directory",
    "--ansi", "--progress", "--parallel", "-u", "--user", "-e", "--env", "-w", "--workdir",
    "--index", "-t", "--timeout", "--tail", "--since", "--until", "--scale", "--pull",
    "--wait-timeout", "--format", "--filter",
})  # fmt: skip
# The compose commands whose arguments are services (exec and run: the first).
COMPOSE_SERVICES = frozenset({
    "up", "stop", "start", "restart", "logs", "ps", "pull", "rm", "kill", "images", "create",
    "build", "exec", "run", "top", "pause", "unpause",
})  # fmt: skip


def check_compose(args: list[str], repo: Repository) -> list[str]:
    """`docker compose ARGS`: a project named (`-p`: the documents' rule, deploy.md), and the
    profiles and services it names are in its compose files (with -f a file the repository
    has not, `arcvllm scale render`'s, the names are that file's: not checked)."""
    files, profiles, project, i = [], [], None, 0
    while i < len(args) and args[i].startswith("-"):
        option, eq, value = args[i].partition("=")
        if option in COMPOSE_VALUES and not eq and i + 1 < len(args):
            value = args[i + 1]
            i += 1
        if option in ("-p", "--project-name"):
            project = value
        elif option in ("-f", "--file"):
            files.append(value)
        elif option == "--profile":
            profiles.append(value)
        i += 1
    problems = [] if project else ["docker compose without -p PROJECT (deploy.md: `-p arcvllm`)"]
    if any(f not in repo.compose for f in files) or i >= len(args):
        return problems
    read = [repo.compose[f] for f in files] if files else list(repo.compose.values())
    services = {name for file in read for name in file}
    known_profiles = {p for file in read for service in file.values() for p in service}
    where = " ".join(files) or "the compose files"
    problems += [
        f"docker compose: no profile {p!r} in {where}" for p in profiles if p not in known_profiles
    ]
    action, named, rest = args[i], [], args[i + 1 :]
    j = 0
    while j < len(rest) and action in COMPOSE_SERVICES:
        if rest[j].startswith("-"):
            j += 2 if rest[j] in COMPOSE_VALUES else 1
            continue
        named.append(rest[j])
        if action in ("exec", "run"):
            break  # the rest is the command run there
        j += 1
    return problems + [
        f"docker compose: no service {s!r} in {where}" for s in named if s not in services
    ]


def top_level(**extra: str) -> dict[str, str]:
    """This process's environment as a reader's shell has it: without what a make that
    runs the tests (`make test-docs`) hands its children (its command line's variables
    among them)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return {**env, **extra}


def check_paths(text: str, repo: Repository) -> list[tuple[int, str]]:
    """(offset, problem) of every path under one of the repository's own top-level folders
    that TEXT names and the checkout has not (what a command makes, under build/, reports/
    or secrets/, is not the repository's; an absolute path is the host's)."""
    folders = "|".join(re.escape(f) for f in sorted(repo.folders))
    path = re.compile(rf"(?<![\w./$~-])(?:{folders})/[\w./-]*")
    out = []
    for offset, line in enumerate(text.splitlines()):
        for match in path.finditer(line.replace("\\", "")):  # \. of a regular expression
            name = match.group(0).rstrip(".")
            if not (repo.root / name).exists():
                out.append((offset, f"no {name} in the repository"))
    return out


# ---- running a block ----------------------------------------------------------------------


def scratch_copy(root: Path, dest: Path) -> Path:
    """The checkout's files (tracked, and new ones git does not ignore) copied to DEST, with
    the tooling venv linked in (`.venv/bin/arcvllm`): where a run block runs, so whatever it
    writes stays out of the checkout."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout.split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = root / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    venv = Path(sys.prefix)
    if venv != Path(sys.base_prefix):
        (dest / ".venv").symlink_to(venv)
    return dest


def run(
    block: Block, where: Path, timeout: float = RUN_TIMEOUT, env: Mapping[str, str] | None = None
) -> str | None:
    """Run BLOCK with bash as written, in WHERE (a scratch copy of the checkout), with the
    tooling venv first on PATH (ENV: more variables, as a reader's shell may have exported):
    None when it exits 0, else one line naming the document's line of the command that
    failed and what it said."""
    script = where / ".doc-block.sh"
    script.write_text(block.script())
    tmp = where / ".tmp"
    tmp.mkdir(exist_ok=True)
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    env = top_level(TMPDIR=str(tmp), PATH=path, **(env or {}))
    # ERR names the script's line of the command that failed (LINENO in the sourced file).
    wrapper = f"trap 'echo \"doc-test-line $LINENO\" >&2' ERR; . {shlex.quote(str(script))}"
    proc = subprocess.Popen(
        ["bash", "-e", "-o", "pipefail", "-c", wrapper],
        cwd=where, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return f"{block.at()}: the block did not end within {timeout:.0f} s"
    finally:
        script.unlink()
    if proc.returncode == 0:
        return None
    lines = err.strip().splitlines()
    failed = [int(line.split()[1]) for line in lines if line.startswith("doc-test-line ")]
    said = [line for line in lines if not line.startswith("doc-test-line ")]
    # make's own last word ("make: *** [Makefile:N: up] Error 3") names no cause: the line
    # before it does
    said = [line for line in said if not line.startswith("make: *** ")] or said
    where_failed = block.at(failed[-1] - 1) if failed else block.at()
    last = said[-1] if said else "no output on stderr"
    return f"{where_failed}: exit {proc.returncode}: {last}"
