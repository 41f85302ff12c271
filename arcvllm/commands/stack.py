"""`arcvllm stack`: the stacks of configs/stacks.yaml, their audit and locks (arcvllm.builder)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from arcvllm import options, stack
from arcvllm.builder import audit, stackview
from arcvllm.errors import status


def _cmd(args: argparse.Namespace) -> int:
    shown = stackview.answer(
        args.action,
        getattr(args, "name", None),
        args.stacks_file,
        getattr(args, "flavor", None),
        getattr(args, "key", None),
        getattr(args, "ci", False),
        getattr(args, "standins_dir", None),
    )
    print(shown.render(getattr(args, "json", False)))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "stack",
        help="the pinned stacks (configs/stacks.yaml) the images are built from",
        description="List and show the pinned stacks; print one as Docker build args.",
    )
    parser.add_argument(
        "--stacks-file",
        type=options.existing_file,
        default=None,
        help="another stacks file (default: the bundled configs/stacks.yaml)",
    )
    parser.set_defaults(func=_cmd, action=None)
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    listing = sub.add_parser("list", help="the stacks, one a line (the default)")
    show = sub.add_parser("show", help="every pin of a stack and where it came from")
    show.add_argument("name")
    build = sub.add_parser("build-args", help="the stack as `--build-arg K=V` for docker build")
    build.add_argument("name")
    build.add_argument(
        "--flavor", choices=stack.FLAVORS, help="fail unless the stack is this flavour"
    )
    build.add_argument(
        "--ci",
        action="store_true",
        help="CI: the stack's own args, with what CI cannot reach pointing at its stand-ins "
        "(arcvllm/ci/standins.yaml; scripts/ci/standins.sh makes them)",
    )
    build.add_argument(
        "--standins-dir",
        type=Path,
        default=None,
        help="where scripts/ci/standins.sh put the stand-ins (default: build/wheelhouse/standins)",
    )
    get_ = sub.add_parser("get", help="one build arg's value (e.g. VLLM_VERSION)")
    get_.add_argument("name")
    get_.add_argument("key")
    default = sub.add_parser("default", help="the default stack of a flavour")
    default.add_argument("name", metavar="FLAVOR", choices=stack.FLAVORS)
    for each in (listing, show, build, get_, default):
        options.add_json(each)
    register_audit(sub)


def _cmd_audit(args: argparse.Namespace) -> int:
    files = (args.stacks_file, args.cache_dir, args.sdist, getattr(args, "dockerfile", None))
    shown = audit.shown(args.action, args.name, *files)
    print(shown.render(args.json))
    for line in shown.problems:
        print(f"arcvllm: {line}", file=sys.stderr)
    return status(bool(shown.problems))


def register_audit(sub: argparse._SubParsersAction) -> None:
    """`stack audit` and `stack lock`, under the `stack` command."""
    for action, text in (
        ("audit", "compare an XPU stack with its release's own Dockerfile.xpu and lock"),
        ("lock", "write an XPU stack's lock from its release's resolved XPU lock"),
    ):
        parser = sub.add_parser(action, help=text, description=text)
        parser.add_argument("name", metavar="STACK")
        parser.add_argument(
            "--cache-dir", type=Path, default=None, help="sdist folder (default: build/sdists)"
        )
        parser.add_argument(
            "--sdist", type=options.existing_file, default=None, help="this sdist file instead"
        )
        if action == "audit":
            options.add_json(parser, help="the facts as JSON")
            parser.add_argument(
                "--dockerfile",
                type=options.existing_file,
                default=None,
                help="another Dockerfile of ours",
            )
        else:
            options.add_json(parser, help="the stack and the lock file written, as JSON")
        parser.set_defaults(func=_cmd_audit)
