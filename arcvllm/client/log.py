"""What the server's log says: its block size, and the exception it died with (read by
the smoke test and the bench, from a file or a command such as `docker logs`)."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

LOG_TAIL_LINES = 50
_SETTING_BLOCK = re.compile(r"Setting attention block size to (\d+) tokens")
_GROUP_SIZES = re.compile(r"kv cache group sizes \(([\d, ]+)\)")
# An exception line, possibly behind vLLM's "(EngineCore pid=N) ERROR date time [file:line]".
_EXCEPTION = re.compile(
    r"^(?:\(\S+ pid=\d+\)\s+)?(?:[A-Z]+ \S+ \S+ \[\S+\]\s+)?"
    r"([A-Za-z_][\w.]*(?:Error|Exception|Exit)): (.+)$"
)
# Exceptions that only echo a crash reported earlier in the log: the engine re-raises a
# worker's error as "RuntimeError: Worker failed with error '...', please check the stack
# trace above for the root cause", the API server as EngineDeadError.
_ECHOES = ("EngineDeadError", "EngineGenerateError", "CancelledError")
_ECHO_WORDS = ("root cause", "stack trace above", "see stack trace")


@dataclass
class LogSource:
    """Where the server's log comes from: a file, a command (e.g. `docker logs`), or none."""

    file: str | None = None
    cmd: str | None = None

    def lines(self) -> list[str]:
        try:
            if self.file:
                return Path(self.file).read_text(errors="replace").splitlines()
            if self.cmd:
                out = subprocess.run(
                    self.cmd, shell=True, capture_output=True, text=True, timeout=60
                )
                return (out.stdout + out.stderr).splitlines()
        except (OSError, subprocess.TimeoutExpired) as exc:
            return [f"(could not read the server log: {exc})"]
        return []


def block_size_from_log(lines: list[str]) -> int | None:
    """The block size vLLM reports in its log (last start-up wins)."""
    found = None
    for line in lines:
        if match := _SETTING_BLOCK.search(line):
            found = int(match.group(1))
        elif match := _GROUP_SIZES.search(line):
            sizes = {int(s) for s in match.group(1).replace(" ", "").split(",") if s}
            if len(sizes) == 1:
                found = sizes.pop()
    return found


_CHUNK = re.compile(r"max_num_batched_tokens=(\d+)")


def chunk_tokens_from_log(lines: list[str]) -> int | None:
    """The prefill chunk vLLM reports at start ('Chunked prefill is enabled with
    max_num_batched_tokens=N'; last start-up wins)."""
    found = None
    for line in lines:
        if "Chunked prefill" in line and (match := _CHUNK.search(line)):
            found = int(match.group(1))
    return found


def find_crash(lines: list[str]) -> str | None:
    """The exception a server process died with, e.g. `OverflowError: Python int ...`.

    The last exception line that ends a traceback, skipping the echoes of a crash that
    was already reported (they would hide the root cause).
    """
    found: list[str] = []
    in_traceback = False
    for line in lines:
        if "Traceback (most recent call last)" in line:
            in_traceback = True
            continue
        if in_traceback and (match := _EXCEPTION.match(line.strip())):
            found.append(f"{match.group(1)}: {match.group(2).strip()}")
            in_traceback = False
    roots = [
        f
        for f in found
        if not any(echo in f.split(":")[0] for echo in _ECHOES)
        and not any(word in f.lower() for word in _ECHO_WORDS)
    ]
    picked = roots or found
    return picked[-1] if picked else None
