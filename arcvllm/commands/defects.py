"""`arcvllm defects`: the known defects and whether a host has them (arcvllm.defects)."""

from __future__ import annotations

import argparse

from arcvllm import defects, options


def _cmd_defects(args: argparse.Namespace) -> int:
    """List the ledger; with --stack, each defect's standing on that stack's pins."""
    print(defects.listing(args.defects_file, args.stack).render(args.json))
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
