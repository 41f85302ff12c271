"""`arcvllm patches`: apply, show or verify the vLLM patch series (arcvllm.patching)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from arcvllm import options
from arcvllm.patching import patches


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("patches", help="apply, show or verify the vLLM patch series")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--target",
            help="vLLM source tree or site-packages (default: the vLLM this Python imports)",
        )
        p.add_argument(
            "--python",
            default=sys.executable,
            help="interpreter that runs the probes (default: this one)",
        )
        add_series(p)
        p.add_argument(
            "--allow-unsupported",
            action="store_true",
            help="go on with a vLLM release outside the supported range",
        )

    p = actions.add_parser("apply", help="apply what the target needs, verified by probes")
    common(p)
    p.add_argument(
        "--out",
        type=Path,
        help=f"where to write the JSON manifest (default: TARGET/{patches.MANIFEST_NAME})",
    )
    options.add_json(p, help="print the manifest instead of the table")
    p.add_argument(
        "--expect",
        help="fail unless the result equals this summary line "
        "(as `arcvllm patches plan` prints it)",
    )
    p.set_defaults(func=_cmd_apply)

    p = actions.add_parser("status", help="show each patch's state on the target")
    common(p)
    options.add_json(p, help="print the manifest instead of the table")
    p.set_defaults(func=_cmd_status)

    p = actions.add_parser("verify", help="exit 1 unless every fix is in place")
    common(p)
    options.add_json(p, help="print the manifest and the verdict instead of the table")
    p.set_defaults(func=_cmd_verify)

    p = actions.add_parser("plan", help="the summary the series expects for a vLLM version")
    p.add_argument("--vllm-version", required=True)
    add_series(p)
    options.add_json(p, help="print the version, the summary and each patch's state as JSON")
    p.set_defaults(func=_cmd_plan)


def _series(args) -> Path | None:
    return patches.series_file(args.build, args.series_file)


def _cmd_apply(args) -> int:
    report = patches.apply_tree(
        args.target, _series(args), args.python, args.allow_unsupported, args.expect, args.out
    )
    if args.json:
        print(json.dumps(report.manifest(), indent=2))
        return 0
    print(patches.table(report))
    print(report.applied())
    return 0


def _cmd_status(args) -> int:
    report = patches.inspect_tree(args.target, _series(args), args.python, args.allow_unsupported)
    print(json.dumps(report.manifest(), indent=2) if args.json else patches.table(report))
    return 0


def _cmd_verify(args) -> int:
    report = patches.inspect_tree(args.target, _series(args), args.python, args.allow_unsupported)
    if args.json:
        print(json.dumps({**report.manifest(), **report.verdict()}, indent=2))
    else:
        print(patches.table(report))
    report.require_verified()
    if not args.json:
        print(f"verified: vLLM {report.target.version}: {report.summary()}")
    return 0


def _cmd_plan(args) -> int:
    doc = patches.plan(_series(args), args.vllm_version)
    print(json.dumps(doc, indent=2) if args.json else doc["summary"])
    return 0


def add_series(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--series-file", type=options.existing_file, help="series file (default: the bundled one)"
    )
    which.add_argument(
        "--build",
        action="store_true",
        help="the bundled build series (patches/vllm/build/): a release's source tree, "
        "before its wheel is built",
    )
