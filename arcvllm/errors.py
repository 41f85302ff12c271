"""Errors an operator can cause or fix: the CLI prints them as one line."""

from __future__ import annotations


class ArcvllmError(Exception):
    """A problem worth one clear line and a non-zero exit, never a traceback.

    The exit status says who must act: 1 a check failed, 2 the command was used wrongly,
    3 the environment lacks something (no server, no vLLM, no Docker, a missing extra).
    Subclasses set `exit_code` once; a plain raise can pass it: ArcvllmError("...", 2).
    """

    exit_code = 1

    def __init__(self, message: str = "", exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
