"""`arcvllm verify`: arguments in, the report out (table or JSON), its exit status: 1 when a
row failed, 4 when none failed but one did not exercise its path (INCOMPLETE)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from arcvllm.client.report import Report, table
from arcvllm.errors import CheckFailed, Degraded
from arcvllm.verify.suite import VerifyOptions, run


def options_from(args: argparse.Namespace, **given) -> VerifyOptions:
    fields = VerifyOptions.server_fields(args) | {
        "chunk_tokens": args.max_num_batched_tokens,
        "rows": args.rows,
        "request_timeout": args.request_timeout,
        "metrics_urls": tuple(getattr(args, "metrics_url", None) or ()),
        **{
            key: getattr(args, key)
            for key in ("drift_nats", "record", "against", "margin")
            if getattr(args, key, None) is not None
        },
    }
    return VerifyOptions(**{**fields, **given})


def finish(args: argparse.Namespace, opts: VerifyOptions) -> Report:
    """Run the rows, print the table (or JSON), write --out: the report."""
    report = run(opts)
    if args.json:
        sys.stdout.write(report.to_json())
    else:
        print(table(report, "verify"))
    if args.out:
        path = Path(args.out)
        report.write(path)
        print(f"report: {path}", file=sys.stderr)
    if opts.record:
        said = (
            f"record: {opts.record}"
            if "recorded" in report.server
            else "not recorded: a row failed"
        )
        print(said, file=sys.stderr)
    return report


def exit_status(report: Report) -> int:
    """0 when every row passed; CheckFailed's 1 when one failed (it wins); Degraded's 4
    when none failed but one did not run its path: it ran with less than was asked."""
    if report.verdict == "fail":
        return CheckFailed.exit_code
    return Degraded.exit_code if report.verdict == "incomplete" else 0
