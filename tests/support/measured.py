"""Numbers a test measures (a flood held off, a deployment's start-up), where CI shows them.

pytest keeps a passing test's output to itself (and xdist's workers keep it from the
terminal), so a measurement is also appended to reports/measured.txt, which
scripts/ci/pipeline.sh prints at the end of the run.
A record for the reader: no test reads it back."""

from __future__ import annotations

import os
from pathlib import Path

from support import ROOT

LOG = Path(os.environ.get("ARCVLLM_MEASURED", ROOT / "reports" / "measured.txt"))


def measured(line: str) -> None:
    """Print LINE and append it, with a newline, to LOG (one write: workers do not interleave)."""
    print(f"\n{line}")
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with LOG.open("a") as log:
        log.write(line.replace("\n", " ") + "\n")
