"""Plain-text output shared by the commands: the one table renderer, an error as a line."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def columns(rows: Sequence[Sequence[str]], width: int | None = None, rule: bool = False) -> str:
    """ROWS as left-aligned columns two spaces apart, no trailing blanks.

    WIDTH: lines fit in it, the middle columns (never the first or the last) cut with "…",
    the widest first. RULE: a line of dashes under the first row (the header).
    """
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    if width is not None and len(widths) > 2:
        room = width - widths[0] - widths[-1] - 2 * (len(widths) - 1)
        middle = widths[1:-1]
        while sum(middle) > max(room, len(middle)) and max(middle) > 1:
            widest = middle.index(max(middle))
            middle[widest] -= 1
        widths[1:-1] = middle
    lines = [
        "  ".join(_cut(cell, w).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    if rule:
        lines.insert(1, "-" * max(len(line) for line in lines))
    return "\n".join(lines)


def error_line(exc: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300]


@dataclass(frozen=True)
class Shown:
    """What a command prints on stdout: one JSON document, or its text; and the problems it
    names on stderr (`arcvllm: PROBLEM`, one a line)."""

    doc: Any
    text: str
    indent: int | None = 2  # None: the document on one line
    problems: tuple[str, ...] = ()

    def render(self, as_json: bool) -> str:
        """The document as JSON (AS_JSON), else the text."""
        return json.dumps(self.doc, indent=self.indent) if as_json else self.text
