"""`arcvllm stack`: the stacks of configs/stacks.yaml, their audit and locks (arcvllm.builder)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from arcvllm import options, stack
from arcvllm.builder import audit, image, index
from arcvllm.errors import ArcvllmError, UsageError, status


def _cmd(args: argparse.Namespace) -> int:
    as_json = getattr(args, "json", False)
    if args.action in (None, "list"):
        stacks, defaults = stack.load(args.stacks_file)
        if as_json:
            listed = [
                {
                    "name": s.name,
                    "flavor": s.flavor,
                    "vllm": s.vllm_version,
                    "description": s.description,
                    "default": defaults.get(s.flavor) == s.name,
                }
                for s in stacks.values()
            ]
            print(json.dumps(listed, indent=2))
        else:
            print(stack.render_table(stacks, defaults))
        return 0
    if args.action == "default":
        _, defaults = stack.load(args.stacks_file)
        if args.name not in defaults:
            raise UsageError(f"no default stack for flavour {args.name!r}")
        doc = {"flavor": args.name, "stack": defaults[args.name]}
        print(json.dumps(doc) if as_json else defaults[args.name])
        return 0
    try:
        chosen = stack.get(args.name, args.stacks_file, getattr(args, "flavor", None))
    except ArcvllmError as exc:  # a stack named on the command line
        raise UsageError(str(exc)) from None
    if args.action == "show":
        print(
            json.dumps(stack.stack_json(chosen), indent=2)
            if as_json
            else stack.render_stack(chosen)
        )
        return 0
    if args.action == "build-args":
        values = (
            image.ci_build_args(chosen, args.standins_dir) if args.ci else index.build_args(chosen)
        )
        print(json.dumps(values, indent=2) if as_json else stack.render_build_args(values))
    elif args.action == "get":
        try:
            value = stack.lookup(chosen, args.key)
        except ArcvllmError as exc:  # a key named on the command line
            raise UsageError(str(exc)) from None
        doc = {"stack": chosen.name, "key": args.key, "value": value}
        print(json.dumps(doc) if as_json else value)
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
    options = {"file": args.stacks_file, "cache": args.cache_dir, "sdist": args.sdist}
    if args.action == "lock":
        written = audit.write_lock(args.name, **options)
        print(json.dumps({"stack": args.name, "lock": str(written)}) if args.json else written)
        return 0
    result = audit.audit(args.name, dockerfile=args.dockerfile, **options)
    if args.json:
        print(json.dumps(result.as_json(), indent=2))
    else:
        print(audit.table(result.rows))
    for line in result.problems():
        print(f"arcvllm: {line}", file=sys.stderr)
    return status(bool(result.problems()))


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
