"""`arcvllm smoke`: arguments in, Report out (table or JSON), exit 1 on a failed check."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from arcvllm.client.log import LogSource
from arcvllm.client.report import table
from arcvllm.smoke.checks import SmokeOptions, run


def options_from(args: argparse.Namespace, **given) -> SmokeOptions:
    """The checks' options from `smoke`'s arguments (add_checks); GIVEN wins (a deployment
    sets the server, the key, the log and the lifecycle itself)."""
    fields = {
        "base_url": getattr(args, "base_url", None),
        "model": args.model,
        "preset": args.preset,
        "api_key": getattr(args, "api_key", None),
        "log": LogSource(file=getattr(args, "log_file", None), cmd=getattr(args, "log_cmd", None)),
        "health_timeout": args.health_timeout,
        "request_timeout": args.request_timeout,
        "metrics_urls": tuple(args.metrics_url or ()),
        "ca_cert": str(args.ca_cert) if getattr(args, "ca_cert", None) else None,
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
