"""Reading a Dockerfile (ours, or a release's docker/Dockerfile.xpu): one parser,
dockerfile-parse, for every reader (the audit's stages, the stacks' ARG check)."""

from __future__ import annotations

import io

from arcvllm.errors import Unavailable


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


def stages(text: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """(name, its instructions after FROM) of each stage; a stage without a name is named
    by its index, as `COPY --from=N` does."""
    found: list[tuple[str, list[tuple[str, str]]]] = []
    for instruction, value in instructions(text):
        if instruction == "FROM":
            words = [w for w in value.split() if not w.startswith("--platform")]
            named = len(words) >= 3 and words[1].lower() == "as"
            found.append((words[2] if named else str(len(found)), []))
        elif found:
            found[-1][1].append((instruction, value))
    return found


def unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def args(text: str) -> list[tuple[str, str, str | None]]:
    """(stage, name, default) for every ARG; stage "" is the global scope, and a stage
    without a name is "?"."""
    stage, found = "", []
    for instruction, value in instructions(text):
        if instruction == "FROM":
            words = [w for w in value.split() if not w.startswith("--platform")]
            stage = words[2] if len(words) >= 3 and words[1].lower() == "as" else "?"
        elif instruction == "ARG":
            name, eq, default = value.strip().partition("=")
            found.append((stage, name.strip(), unquote(default) if eq else None))
    return found


def env_pairs(value: str) -> dict[str, str]:
    """The KEY=VALUE pairs of an ENV instruction's value (either ENV form)."""
    from dockerfile_parse.util import get_key_val_dictionary

    return get_key_val_dictionary(value)
