"""`arcvllm smoke`: arguments in, Report out (table or JSON), exit 1 on a failed check."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from arcvllm.client.report import table
from arcvllm.smoke.checks import SmokeOptions, run


def options_from(args: argparse.Namespace, **given) -> SmokeOptions:
    """The checks' options from `smoke`'s arguments (add_checks); GIVEN wins (a deployment
    sets the server, the key, the log and the lifecycle itself)."""
    fields = SmokeOptions.server_fields(args) | {
        "health_timeout": args.health_timeout,
        "request_timeout": args.request_timeout,
        "metrics_urls": tuple(args.metrics_url or ()),
    }
    return SmokeOptions(**{**fields, **given})


def finish(args: argparse.Namespace, opts: SmokeOptions):
    """Run the checks, print the table (or JSON), write --out: the report."""
    report = run(opts)
    if args.json:
        sys.stdout.write(report.to_json())
    else:
        print(table(report))
    if args.out:
        path = Path(args.out)
        report.write(path)
        print(f"report: {path}", file=sys.stderr)
    return report
