"""The builds one `arcvllm image build` asks for, on the build host: a stack's server image,
or one or more side images, each with its tags, target, OCI layout and docker flags."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from arcvllm.builder import image
from arcvllm.errors import UsageError


def build_each(
    stack_name: str | None,
    sides: Sequence[str],
    default_tag: Callable[[str], str],
    ci: bool = False,
    flavor: str | None = None,
    stacks_file: Path | None = None,
    target: str | None = None,
    tags: Sequence[str] = (),
    oci_layout: Path | None = None,
    docker_flags: str = "",
    dry_run: bool = False,
) -> Iterator[tuple[image.Build, list[str]]]:
    """Build STACK_NAME's server image, or each of SIDES one after the other (each its own
    tag; several take no stack, TAGS or TARGET): each build and its argv, as it is made.
    TAGS, else the image's own, else DEFAULT_TAG(stack). DRY_RUN: the argv only."""
    if len(sides) > 1 and (tags or stack_name or target):
        raise UsageError("several --side images take no stack, --tag or --target")
    image.unknown_stack(stack_name, stacks_file)
    each: Sequence[str | None] = list(sides) or [None]  # None: the stack's server image
    for side in each:
        spec = image.spec_for(stack_name, side, ci, flavor, stacks_file)
        if target:
            spec.target = target
        if tags:
            spec.tags = list(tags)
        elif not spec.tags:
            spec.tags = [default_tag(spec.stack.name)]
        spec.oci_layout = oci_layout
        spec.flags = shlex.split(docker_flags)
        yield spec, image.build(spec, dry_run=dry_run)
