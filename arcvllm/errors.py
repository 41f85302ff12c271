"""Errors an operator can cause or fix: the CLI prints them as one line.

Raise one of the four kinds; its exit status says who must act. The CLI catches the base,
prints `arcvllm: MESSAGE` and exits with the error's `exit_code`.
"""

from __future__ import annotations


class ArcvllmError(Exception):
    """A problem worth one clear line and a non-zero exit, never a traceback.

    The base of the four kinds below (what the CLI catches), and exit 1 when raised as
    itself. Each kind fixes its exit status; no raise spells one as a number.
    """

    exit_code = 1

    def __init__(self, message: str = "") -> None:  # one line, nothing beside it
        super().__init__(message)


class CheckFailed(ArcvllmError):
    """A check failed: what was checked is not as it must be (a patch, a pin, a file)."""

    exit_code = 1


class UsageError(ArcvllmError):
    """The command was used wrongly: a bad argument, or an unknown preset, stack or file."""

    exit_code = 2


class Unavailable(ArcvllmError):
    """The environment lacks something: no server, no vLLM, no Docker, a missing extra."""

    exit_code = 3


class Degraded(ArcvllmError):
    """It runs, with less than was asked (scale up with replicas down); the status a
    command returns after naming what is missing."""

    exit_code = 4


def status(failed: bool) -> int:
    """The exit status of a check that printed its findings itself: CheckFailed's, or 0."""
    return CheckFailed.exit_code if failed else 0
