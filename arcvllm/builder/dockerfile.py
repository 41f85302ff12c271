"""Reading a Dockerfile (ours, or a release's docker/Dockerfile.xpu): one parser,
dockerfile-parse, for every reader (the audit's stages, the stacks' ARG check)."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from arcvllm.builder.shell import substitute, unquote
from arcvllm.errors import Unavailable
from arcvllm.stack import Stack


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, value) of each instruction, comments left out, continuations joined."""
    try:
        from dockerfile_parse import DockerfileParser
    except ImportError:
        needs = "dockerfile-parse is not installed: pip install 'arcvllm[stack]'"
        raise Unavailable(needs) from None
    parser = DockerfileParser(fileobj=io.BytesIO(text.encode()), env_replace=False)
    return [
        (item["instruction"], item["value"])
        for item in parser.structure
        if item["instruction"] != "COMMENT"
    ]


def from_line(value: str, index: int) -> tuple[str, str]:
    """(parent, stage name) of a FROM's VALUE, the stage's INDEX naming a stage without a
    name, as `COPY --from=N` does."""
    words = [w for w in value.split() if not w.startswith("--platform")]
    named = len(words) >= 3 and words[1].lower() == "as"
    return words[0], words[2] if named else str(index)


def stages(text: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """(name, its instructions after FROM) of each stage."""
    found: list[tuple[str, list[tuple[str, str]]]] = []
    for instruction, value in instructions(text):
        if instruction == "FROM":
            found.append((from_line(value, len(found))[1], []))
        elif found:
            found[-1][1].append((instruction, value))
    return found


def args(text: str) -> list[tuple[str, str, str | None]]:
    """(stage, name, default) for every ARG; stage "" is the global scope."""
    stage, count, found = "", 0, []
    for instruction, value in instructions(text):
        if instruction == "FROM":
            stage, count = from_line(value, count)[1], count + 1
        elif instruction == "ARG":
            name, eq, default = value.strip().partition("=")
            found.append((stage, name.strip(), unquote(default) if eq else None))
    return found


def env_pairs(value: str) -> dict[str, str]:
    """The KEY=VALUE pairs of an ENV instruction's value (either ENV form)."""
    from dockerfile_parse.util import get_key_val_dictionary

    return get_key_val_dictionary(value)


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
    for instruction, value in instructions(text):
        if instruction == "FROM":
            parent, name = from_line(value, len(stages))
            stages.append(Stage(name, substitute(parent, global_args)))
        elif not stages:
            if instruction == "ARG":
                key, _, default = value.partition("=")
                global_args[key.strip()] = build_args.get(key.strip(), unquote(default))
        else:
            stages[-1].instructions.append((instruction, value))
    for stage in stages:
        stage.instructions.insert(0, ("GLOBALS", json.dumps(global_args)))
    return stages


def by_name(stages: Sequence[Stage]) -> dict[str, Stage]:
    return {s.name.lower(): s for s in stages}


def chain(stages: Sequence[Stage], final: Stage) -> list[Stage]:
    """FINAL and the stages it is FROM, root first."""
    names = by_name(stages)
    out: list[Stage] = []
    stage: Stage | None = final
    while stage is not None and stage not in out:
        out.insert(0, stage)
        stage = names.get(stage.parent.lower())
    return out


def venv_stages(stages: Sequence[Stage], final: Stage) -> list[Stage]:
    """Stages whose pip steps reach FINAL: its chain and, recursively, its COPY --from ones."""
    names, keep, todo = by_name(stages), set(), [final]
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


def mismatches(text: str, stacks: Mapping[str, Stack], defaults: Mapping[str, str]) -> list[str]:
    """Where the Dockerfile and the stacks file disagree, one line each.

    Every pin is declared once, in the stacks file: an ARG that any stack sets has no
    default in the Dockerfile (a default would be a second copy, and a plain `docker build`
    would quietly build it), and every pin is an ARG.
    """
    pinned = {key for s in stacks.values() for key in s.build_args()}
    declared = args(text)
    problems = [
        f"ARG {name} in stage {stage or '(global)'} has a default ({default!r}); "
        "its value belongs in configs/stacks.yaml only"
        for stage, name, default in declared
        if default is not None and name in pinned
    ]
    names = {name for _, name, _ in declared}
    for stack in stacks.values():
        for key in stack.build_args():
            if key not in names:
                problems.append(f"stack {stack.name}: {key} is no ARG of the Dockerfile")
    return problems
