"""The shell of a Dockerfile's RUN steps, read on the build host as far as the fidelity
audit needs it: variables substituted, the simple commands that run (`if [ ... ]` taken or
not), the build context's bind mounts followed, and a script a step runs read as part of it.
No shell runs: the commands are only read.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping, Sequence


def unquote(value: str) -> str:
    """VALUE without the one pair of quotes around it, if any."""
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


_VAR = re.compile(
    r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*|[0-9]+)(?:(:-|:\+|:\?|#)([^}]*))?\}"
    r"|([A-Za-z_][A-Za-z0-9_]*|[0-9]))"
)


def substitute(text: str, values: Mapping[str, str]) -> str:
    """`$X`, `${X}`, `${X:-d}`, `${X:+w}`, `${X:?m}`, `${X#prefix}` from VALUES.

    A name VALUES does not know stays as written (it comes from the base image or the shell).
    """

    def one(m: re.Match[str]) -> str:
        name, op, word = m.group(1) or m.group(4), m.group(2), m.group(3)
        if name not in values:
            return substitute(word, values) if op == ":-" else m.group(0)
        value = values[name]
        if op == ":-" and not value:
            return substitute(word, values)
        if op == ":+":
            return substitute(word, values) if value else ""
        if m.group(2) == "#" and value.startswith(m.group(3)):
            return value[len(m.group(3)) :]
        return value

    return _VAR.sub(one, text)


def run_mounts(value: str) -> tuple[dict[str, str], str]:
    """(target -> source of the context's bind mounts, the command) of a RUN's value."""
    m = re.match(r"^((?:--\S+\s+)*)(.*)$", value.strip(), re.DOTALL)
    flags, command = (m.group(1), m.group(2)) if m else ("", value)
    mounts = {}
    for flag in flags.split():
        if flag.startswith("--mount="):
            opts = dict(o.partition("=")[::2] for o in flag[len("--mount=") :].split(","))
            source = opts.get("source") or opts.get("src")
            if "target" in opts and source and "from" not in opts:
                mounts[opts["target"]] = source
    return mounts, command


def mounted(path: str, mounts: Mapping[str, str], program: bool = False) -> str:
    """PATH inside a RUN, as the build-context path a bind mount (file or folder) gives it
    (a PROGRAM without a slash is looked up on PATH: a mount target of that name)."""
    for target, source in mounts.items():
        if path == target or (program and "/" not in path and target.endswith("/" + path)):
            return source
        if path.startswith(target.rstrip("/") + "/"):
            return source.rstrip("/") + path[len(target.rstrip("/")) :]
    return path


def _test(words: Sequence[str]) -> bool:
    """A `[ ... ]` condition over resolved words; anything unknown counts as true."""
    body = [w for w in words if w not in ("[", "]", "[[", "]]")]
    if len(body) == 2 and body[0] == "-n":
        return body[1] != "" and not body[1].startswith("$")
    if len(body) == 2 and body[0] == "-z":
        return body[1] == ""
    if len(body) == 3 and body[1] in ("=", "==", "!=") and "$" not in body[0] + body[2]:
        return (body[0] == body[2]) == (body[1] != "!=")
    return True


def commands(script: str) -> Iterator[list[str]]:
    """The simple commands of a resolved shell script that run, `if [ ... ]` evaluated."""
    try:
        lexer = shlex.shlex(script, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        tokens = script.split()
    segments: list[list[str]] = [[]]
    for token in tokens:
        if token and set(token) <= set(";&|"):
            segments.append([])
        else:
            segments[-1].append(token)
    active, frames = True, []
    for words in segments:
        while words and words[0] in ("if", "then", "else", "elif", "fi", "do", "done"):
            keyword = words.pop(0)
            if keyword == "if":
                cond = _test(words)
                frames.append((active, cond))
                active, words = active and cond, []
            elif keyword == "elif" and frames:
                parent, taken = frames[-1]
                cond = _test(words)
                frames[-1] = (parent, taken or cond)
                active, words = parent and not taken and cond, []
            elif keyword == "else" and frames:
                parent, taken = frames[-1]
                active = parent and not taken
            elif keyword == "fi" and frames:
                active = frames.pop()[0]
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            words.pop(0)
        if words and active:
            yield words


def script_commands(
    text: str, argv: Sequence[str], values: Mapping[str, str]
) -> Iterator[list[str]]:
    """The commands of a shell script run with ARGV: positional parameters and plain
    `name=value` assignments resolved line by line."""
    known = {**values, **{str(i): a for i, a in enumerate(argv, start=1)}}
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        words = line.split()
        if all(re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w) for w in words):
            for word in words:
                key, _, raw = word.partition("=")
                known[key] = unquote(substitute(raw, known))
            continue
        yield from commands(substitute(line, known))
