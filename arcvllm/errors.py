"""Errors an operator can cause or fix: the CLI prints them as one line."""


class ArcvllmError(Exception):
    """A problem worth one clear line and a non-zero exit, never a traceback."""

    exit_code = 1
