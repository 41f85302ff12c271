"""`arcvllm standins`: CI's stand-ins (a checkout only: the wheel leaves arcvllm/ci out)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from arcvllm import options
from arcvllm.ci import standins
from arcvllm.errors import status


def _cmd(args: argparse.Namespace) -> int:
    config = standins.load(args.standins_file)
    root = args.dir
    if args.action in (None, "list"):
        doc = {
            "standins": {
                k: {
                    "stands_in_for": " ".join(str(v["stands_in_for"]).split()),
                    "reason": " ".join(str(v["reason"]).split()),
                }
                for k, v in config.standins.items()
            },
            "stacks": config.stacks,
        }
        if args.json:
            print(json.dumps(doc, indent=2))
        else:
            for name, v in doc["standins"].items():
                print(f"{name}: stands in for {v['stands_in_for']}\n    reason: {v['reason']}")
            for stack, keys in config.stacks.items():
                print(f"{stack}: {', '.join(f'{k}={n}' for k, n in keys.items())}")
        return 0
    if args.action == "make":
        parts = tuple(args.only or standins.PARTS)
        done = standins.make(config, root, parts)
        problems = []
        # A base image or debs made now are checked together before anything uses them.
        if any(done.get(p, {}).get("state") == "made" for p in ("base", "debs")):
            start = time.monotonic()
            problems = standins.check_base(config, root)
            done["check"] = {
                "state": "failed" if problems else "ok",
                "seconds": round(time.monotonic() - start, 1),
                "problems": problems,
            }
        if args.json:
            print(json.dumps(done, indent=2))
        else:
            for part, d in done.items():
                print(f"{part}: {d['state']} ({d['seconds']} s)")
            for problem in problems:
                print(f"arcvllm: standins: {problem}", file=sys.stderr)
        return status(bool(problems))
    if args.action == "check":
        problems = standins.check_base(config, root)
        if args.json:
            print(json.dumps({"ok": not problems, "problems": problems}, indent=2))
        else:
            print("\n".join(problems) or "base stand-in: ubuntu:24.04 shape, GPU debs install")
        return status(bool(problems))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "standins",
        help="CI stand-ins for what the XPU build cannot reach (arcvllm/ci/standins.yaml)",
        description="List, make and check the stand-ins CI's XPU builds use.",
    )
    parser.add_argument(
        "--standins-file", type=options.existing_file, default=None, help="another standins.yaml"
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=standins.DEFAULT_DIR,
        help=f"where the stand-ins go (default: {standins.DEFAULT_DIR})",
    )
    parser.set_defaults(func=_cmd, action=None, json=False)
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    listing = sub.add_parser(
        "list", help="each stand-in, what it stands in for and why (the default)"
    )
    make_ = sub.add_parser("make", help="make the stand-ins, skipping what is current")
    make_.add_argument(
        "--only", action="append", choices=standins.PARTS, help="only this part (repeatable)"
    )
    check = sub.add_parser(
        "check", help="the base image has ubuntu:24.04's shape and the debs install"
    )
    for each in (listing, make_, check):
        options.add_json(each)
