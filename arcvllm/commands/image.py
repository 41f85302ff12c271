"""`arcvllm image`: build an image, its wheelhouse, its sums (arcvllm.builder.image)."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from arcvllm import options
from arcvllm.builder import builds, image
from arcvllm.paths import checkout_root


def _cmd(args) -> int:
    if args.rehearsal:
        return image.rehearse(args)
    name = args.stack or (None if args.side else default_stack(args.flavor, args.stacks_file))
    given = (args.ci, args.flavor, args.stacks_file, args.target, args.tag or ())
    built = builds.build_each(name, args.side or (), lambda s: tag_for(s, args.env_file), *given,
                              args.oci_layout, args.docker_flags, args.dry_run)  # fmt: skip
    for spec, argv in built:
        if args.json:
            print(json.dumps({"tags": list(spec.tags), "built": not args.dry_run, "argv": argv}))
        elif args.dry_run:
            print(shlex.join(argv))
    return 0


def _cmd_wheelhouse(args) -> int:
    made = image.wheelhouse(args.source, args.dest or checkout_root() / "build" / "wheelhouse")
    if args.json:
        print(json.dumps({"wheels": [str(p) for p in made]}))
    return 0


def _cmd_sums(args) -> int:
    """Every download of the stack pinned (fetching and recording the unpinned ones)."""
    from arcvllm.builder import sums

    name, pinned = sums.pin_stack(args.stack, args.write)
    if args.json:
        print(json.dumps({"stack": name, "sums": pinned}, indent=2))
    else:
        for key, value in pinned.items():
            print(f"{key}={value}")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "image",
        help="build an image of docker/Dockerfile (a stack's server, or a side image)",
        description="Build the server image of a stack (target runtime) or a side image "
        "(gateway, router, prometheus, alertmanager) with the stack's pinned args, the "
        "commit's revision and time, and the CA bundle as a secret.",
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    b = sub.add_parser("build", help="build one image")
    b.add_argument(
        "stack",
        nargs="?",
        help="the stack (default: the --flavor's default stack, the flavour by default xpu "
        "where this host has a render node, else cpu)",
    )
    b.add_argument(
        "--side",
        action="append",
        help="a side image of configs/stacks.yaml (side_images); repeat for several",
    )
    b.add_argument("--target", help="a Dockerfile target other than the image's own")
    b.add_argument(
        "--tag",
        action="append",
        help="the image's tag (repeatable; default: IMAGE of --env-file or the shell, else "
        "arcvllm:STACK; a side image's own)",
    )
    b.add_argument(
        "--env-file",
        type=options.existing_file,
        help="the settings file whose IMAGE tags the server image (the one `make up` runs)",
    )
    b.add_argument(
        "--rehearsal",
        action="store_true",
        help="CI: an XPU stack (default: the default one) with its stand-ins, stage for stage: "
        "arcvllm:STACK-ci (the vllm stage) and arcvllm:STACK-ci-user (the runtime's user)",
    )
    b.add_argument("--flavor", choices=("cpu", "xpu"), help="fail unless the stack is this")
    b.add_argument("--ci", action="store_true", help="CI: an XPU stack with its stand-ins")
    b.add_argument("--oci-layout", type=Path, help="export an OCI layout directory (reproducible)")
    b.add_argument("--stacks-file", type=options.existing_file, default=None)
    b.add_argument("--dry-run", action="store_true", help="print the command, build nothing")
    b.add_argument(
        "--docker-flags", default="", help="more flags for docker build, one string (shell words)"
    )
    b.set_defaults(func=_cmd)
    su = sub.add_parser(
        "sums",
        help="pin every download of a stack: the unpinned ones fetched once and recorded "
        "in configs/trusted-sums.txt (trust on first use)",
    )
    su.add_argument("stack")
    su.add_argument(
        "--write", action="store_true", help="pin them in configs/stacks.yaml (the release's PR)"
    )
    su.set_defaults(func=_cmd_sums)
    w = sub.add_parser(
        "wheelhouse",
        help="link the local wheel folder into the build context (build/wheelhouse)",
    )
    w.add_argument(
        "--from",
        dest="source",
        type=options.existing_dir,
        help="the wheel folder (default: pip's find-links here, else /opt/wheels)",
    )
    w.add_argument("--dest", type=Path, help="default: the checkout's build/wheelhouse")
    w.set_defaults(func=_cmd_wheelhouse)
    for each in (b, su, w):
        options.add_json(each)


def default_stack(flavor: str | None, stacks_file: Path | None = None) -> str:
    """The stack a build of no named stack builds: FLAVOR's default stack, FLAVOR by default
    this host's (xpu where a render node is)."""
    from arcvllm import stack
    from arcvllm.operate.host import default_flavor

    return stack.load(stacks_file)[1][flavor or default_flavor()]


def tag_for(stack_name: str, env_file: Path | None) -> str:
    """The tag of a stack's server image: IMAGE (the shell's, else ENV_FILE's: the image
    `make up` then runs), else arcvllm:STACK."""
    if env_file is None:
        return f"arcvllm:{stack_name}"
    from arcvllm.operate.host import effective
    from arcvllm.operate.settings import load

    return effective("IMAGE", load(env_file), os.environ, f"arcvllm:{stack_name}")
