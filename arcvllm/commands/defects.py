"""`arcvllm defects`: the known defects and whether a host has them (arcvllm.defects)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from arcvllm import defects, options
from arcvllm.errors import UsageError
from arcvllm.text import columns


def _cmd_defects(args: argparse.Namespace) -> int:
    """List the ledger; with --stack, each defect's standing on that stack's pins."""
    from arcvllm import stack as stacks_mod

    ledger = defects.load(args.defects_file)
    pins: dict[str, str | None] = {}
    if args.stack:
        stacks, _ = stacks_mod.load()
        if args.stack not in stacks:
            raise UsageError(f"unknown stack {args.stack!r}; stacks: {', '.join(stacks)}")
        pins = defects.pinned_versions(stacks[args.stack])
    listed: list[dict[str, Any]] = []
    for d in ledger.defects:
        entry = {
            "id": d.id,
            "component": d.component,
            "affected": d.affected,
            "fixed": d.fixed,
            "effect": d.effect,
            "trigger": dict(d.trigger),
            "patched_by": d.patched_by,
            "url": d.url,
            "title": d.title,
        }
        if args.stack:
            entry["standing"] = d.standing(pins.get(d.component))
        listed.append(entry)
    if args.json:
        print(json.dumps({"stack": args.stack, "pins": pins, "defects": listed}, indent=2))
        return 0
    head = ("DEFECT", "COMPONENT", "AFFECTED", "FIXED", "EFFECT", "TRIGGER")
    table: list[tuple[str, ...]] = [head + (("STANDING",) if args.stack else ())]
    for e in listed:
        trigger = ", ".join(f"{k}={v}" for k, v in e["trigger"].items()) or "any preset"
        row = (e["id"], e["component"], e["affected"], e["fixed"] or "-", e["effect"], trigger)
        table.append(row + ((e["standing"],) if args.stack else ()))
    print(columns(table))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "defects",
        help="the ledger of known upstream defects (configs/defects.yaml)",
        description=_cmd_defects.__doc__,
    )
    parser.add_argument("--stack", help="show each defect's standing on this stack's pins")
    options.add_defects_file(parser)
    options.add_json(parser)
    parser.set_defaults(func=_cmd_defects)
