"""Building an image of docker/Dockerfile: the one place a `docker build` command is made.

Runs on the build host. `make build`, the side images, CI's XPU rehearsal and
`arcvllm release` all build through `build()`: the stack's pinned args, the project's
identity (version, revision, patch plan), the commit's time as SOURCE_DATE_EPOCH and
`created` (never the clock: two builds of one commit are the same image), the CA bundle as
a secret, and the wheelhouse in the context. BuildKit on an old or loaded engine can lose
its client session between steps (`no active session`: moby/buildkit#2367); a build that
fails with such an error alone (TRANSIENT) is run once more and says so.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arcvllm import __version__
from arcvllm.builder import index
from arcvllm.docker import docker_binary
from arcvllm.errors import ArcvllmError, Unavailable, UsageError
from arcvllm.paths import checkout_root
from arcvllm.stack import Stack

# Engine failures that a second run of the same build (from its cache) gets past: what
# each looks like in the build's output, and the line that says the build runs again.
TRANSIENT = {
    "no active session": "BuildKit lost the build's client session (moby/buildkit#2367)",
    "failed to prepare extraction snapshot": "the image store lost a layer's parent snapshot "
    "while unpacking the image (moby/buildkit#6521)",
    # The whole error line, bare: a missing file of the build says what is not found.
    "ERROR: failed to solve: not found": "the image store lost content of the finished "
    "export while another build ran beside it",
}
SOURCE = "https://github.com/arcvllm/arcvllm"


@dataclass(frozen=True)
class Source:
    """The commit an image is built from: revision and time (SOURCE_DATE_EPOCH)."""

    revision: str
    epoch: int

    @property
    def created(self) -> str:
        from datetime import datetime, timezone

        return datetime.fromtimestamp(self.epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def source(root: Path | None = None, release: bool = False) -> Source:
    """HEAD's short revision and commit time (SOURCE_DATE_EPOCH overrides the time).

    A checkout git cannot read (owned by another user: "dubious ownership", a broken
    repository) is an error for every build: its images would be `unknown`, dated 1970.
    A tree that is not a git checkout at all (an unpacked archive, no `.git`; or no git
    installed) builds locally as revision `unknown` at SOURCE_DATE_EPOCH (else 0); a
    RELEASE refuses it too: it is named and dated by its commit.
    """
    root = root or checkout_root()
    env_epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    outside = not (root / ".git").exists() or shutil.which("git") is None
    if outside:
        if release:
            raise Unavailable(
                f"{root} is not a git checkout (or no git is installed): a release is named "
                "and dated by its commit"
            )
        return Source("unknown", int(env_epoch) if env_epoch.isdigit() else 0)

    def git(*args: str) -> str:
        run = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
        if run.returncode != 0 or not run.stdout.strip():
            said = [line for line in run.stderr.splitlines() if line.strip()]
            why = next((line for line in said if line.startswith("fatal:")), None)
            raise Unavailable(
                f"git cannot read the checkout at {root} ({why or (said or ['no output'])[0]}); "
                f"an image is named and dated by its commit (if the checkout is yours: "
                f"git config --global --add safe.directory {root})"
            )
        return run.stdout.strip()

    revision = git("rev-parse", "--short=12", "HEAD")
    epoch = env_epoch if env_epoch.isdigit() else git("log", "-1", "--format=%ct")
    return Source(revision, int(epoch))


@dataclass
class Build:
    """One `docker build` of a target of docker/Dockerfile."""

    stack: Stack
    target: str
    tags: Sequence[str] = ()
    args: Mapping[str, str] = field(default_factory=dict)  # the stack's, resolved
    extra_args: Mapping[str, str] = field(default_factory=dict)
    oci_layout: Path | None = None  # reproducible export (rewrite-timestamp) instead of load
    flags: Sequence[str] = ()
    layer_compression: str | None = None  # the layout's (COMPRESSIONS); None: compression()
    cache_only: bool = False  # built and checked by its own steps, exported nowhere

    def argv(
        self, src: Source, docker: str | None = None, ca_bundle: str | None = None
    ) -> list[str]:
        values = {
            **self.args,
            "ARCVLLM_VERSION": __version__,
            "REVISION": src.revision,
            "CREATED": src.created,
            "SOURCE_DATE_EPOCH": str(src.epoch),
            "SOURCE": SOURCE,
            **self.extra_args,
        }
        argv = [docker or docker_binary(), "buildx", "build", "-f", "docker/Dockerfile"]
        argv += ["--target", self.target, *self.flags]
        if ca_bundle:
            argv += ["--secret", f"id=ca,src={ca_bundle}"]
        for key, value in values.items():
            argv += ["--build-arg", f"{key}={value}"]
        if self.cache_only:
            argv += ["--output", "type=cacheonly"]
        elif self.oci_layout is not None:
            name = f",name={self.tags[0]}" if self.tags else ""
            # One manifest, no build-time provenance: the layout's digest is the image's. An
            # OCI layout directory, not a tar: BuildKit streamed the CPU image's 3.9 GB tar
            # to the client in ~210 s here, its directory in a third of that, and skopeo
            # reads a directory in place (an archive it first unpacks to a temporary one).
            # (The engine's own store cannot take this export: Docker 26's image exporter
            # unpacks, and BuildKit refuses rewrite-timestamp with unpack.)
            argv += ["--provenance=false", "--output"]
            argv += [
                f"type=oci,dest={self.oci_layout},tar=false,rewrite-timestamp=true,"
                f"{compression(self.layer_compression)},force-compression=true{name}"
            ]
        else:
            # Into the engine's image store with the layers as they are: compressing them
            # (gzip, the containerd store's default) took ~280 s of the CPU image's build on
            # 2 cores, for a store that keeps them unpacked anyway (the classic store ignores
            # the option). A release's layout is compressed (above).
            argv += ["--output", "type=image,compression=uncompressed"]
            for tag in self.tags:
                argv += ["-t", tag]
        return [*argv, "."]


COMPRESSIONS = {
    # The layers are compressed twice (export, then the timestamps' rewrite): gzip took
    # ~450 s a pass for the CPU image on 2 loaded cores, zstd ~370 s, none ~70 s.
    # Docker >= 23 pulls zstd. `uncompressed` suits a registry on the same machine (CI).
    "zstd": "compression=zstd,compression-level=3",
    "gzip": "compression=gzip",
    "uncompressed": "compression=uncompressed",
}


def compression(name: str | None = None) -> str:
    """The layouts' layer compression NAME, by default $ARCVLLM_LAYER_COMPRESSION, else zstd
    (the release's)."""
    name = name or os.environ.get("ARCVLLM_LAYER_COMPRESSION", "zstd")
    if name not in COMPRESSIONS:
        raise UsageError(f"ARCVLLM_LAYER_COMPRESSION={name}: one of {', '.join(COMPRESSIONS)}")
    return COMPRESSIONS[name]


def ca_bundle() -> str | None:
    """A CA bundle for TLS-inspecting proxies ($CA_BUNDLE, else the system's), if any."""
    if env := os.environ.get("CA_BUNDLE"):
        return env or None
    system = Path("/etc/ssl/certs/ca-certificates.crt")
    return str(system) if system.exists() else None


def run(argv: Sequence[str], cwd: Path, layout: Path | None = None) -> None:
    """Run a build, its output passed through; once more after a known transient failure.
    LAYOUT, the build's OCI layout directory, is emptied before each run (a layout of an
    earlier build would be merged into)."""
    for attempt in (1, 2):
        if layout is not None:
            shutil.rmtree(layout, ignore_errors=True)
        proc = subprocess.Popen(
            argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        seen = None
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stderr.write(line)
            seen = seen or next((why for sign, why in TRANSIENT.items() if sign in line), None)
        if proc.wait() == 0:
            return
        if seen and attempt == 1:
            print(f"arcvllm: {seen}; building once more", file=sys.stderr)
            continue
        raise ArcvllmError(f"docker build of {_what(argv)} failed")


def _what(argv: Sequence[str]) -> str:
    """The target a build's ARGV names, and the side image for target `side`."""
    target = argv[argv.index("--target") + 1]
    side = next((a.removeprefix("SIDE=") for a in argv if a.startswith("SIDE=")), None)
    return f"target {target}" + (f" ({side})" if target == "side" and side else "")


def build(spec: Build, root: Path | None = None, dry_run: bool = False) -> list[str]:
    """Build SPEC from the checkout ROOT (its build context); returns the argv."""
    root = root or checkout_root()
    argv = spec.argv(source(root), ca_bundle=ca_bundle())
    if not dry_run:
        run(argv, root, spec.oci_layout)
    return argv


def inspect_id(image: str, docker: str | None = None) -> str:
    """The image's ID: with the containerd image store, its manifest digest."""
    out = subprocess.run(
        [docker or docker_binary(), "image", "inspect", "-f", "{{.Id}}", image],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise Unavailable(f"no image {image}: {out.stderr.strip()}")
    return out.stdout.strip()


def spec_for(
    stack_name: str | None,
    side: str | None = None,
    ci: bool = False,
    flavor: str | None = None,
    stacks_file: Path | None = None,
) -> Build:
    """The build of a stack's server image (target runtime), or of a side image (its own
    target on the default CPU stack); CI's stand-ins for an XPU stack with CI."""
    from arcvllm import stack
    from arcvllm.patching import patches

    stacks, defaults = stack.load(stacks_file)
    if side is not None:
        sides = stack.side_images(stacks_file)
        if side not in sides:
            raise UsageError(f"unknown side image {side!r}; side images: {', '.join(sides)}")
        the_stack = stacks[defaults["cpu"]]
        entry = sides[side]
        return Build(
            the_stack,
            target="side",
            tags=[entry.ref],
            args=the_stack.build_args(),
            extra_args={"SIDE": side, "SIDE_IMAGE": entry.image, "SIDE_TAG": entry.tag},
        )
    try:
        the_stack = stack.get(stack_name or defaults["cpu"], stacks_file, flavor)
    except ArcvllmError as exc:  # a stack named on the command line
        raise UsageError(str(exc)) from None
    if ci:
        args = ci_build_args(the_stack)
    else:  # every download pinned: by stacks.yaml, else trusted on first use (arcvllm.builder.sums)
        from arcvllm.builder import sums

        args = sums.apply(the_stack.name, index.build_args(the_stack))
    plan = patches.plan_summary(the_stack.vllm_version)
    return Build(the_stack, target="runtime", args=args, extra_args={"ARCVLLM_PATCHES": plan})


def unknown_stack(name: str | None, stacks_file: Path | None) -> bool:
    """Whether NAME is a stack name the stacks file lacks: then the stacks are listed."""
    from arcvllm import stack

    stacks, defaults = stack.load(stacks_file)
    if name is None or name in stacks:
        return False
    print(stack.render_table(stacks, defaults))
    return True


# CI's rehearsal of an XPU stack's build (make build-xpu-ci): its `vllm` stage (vLLM
# installed over the lock) and its runtime's user, each to the tag beside the target, and
# between them the `models` stage (the patch series applied and probed, the tiny model
# built, with the probe torch of arcvllm/ci/standins.yaml), whose own steps are its check:
# kept in the build cache only (its 13 GB venv is the `vllm` image's).
REHEARSAL = (("vllm", "-ci"), ("models", None), ("runtime-user", "-ci-user"))


def rehearse(args) -> int:
    """The rehearsal of an XPU stack (default: the default XPU stack) with its stand-ins."""
    from arcvllm import stack

    name = args.stack or stack.load(args.stacks_file)[1]["xpu"]
    unknown_stack(name, args.stacks_file)
    built: list[dict[str, Any]] = []
    for target, suffix in REHEARSAL:
        spec = spec_for(name, ci=True, flavor="xpu", stacks_file=args.stacks_file)
        spec.target = target
        spec.tags = [f"arcvllm:{name}{suffix}"] if suffix else []
        spec.cache_only = suffix is None
        spec.flags = shlex.split(args.docker_flags)
        tag = spec.tags[0] if spec.tags else None
        built.append({"target": target, "tag": tag, "argv": build(spec, dry_run=args.dry_run)})
    if args.json:
        import json

        print(json.dumps({"stack": name, "built": not args.dry_run, "images": built}))
    elif args.dry_run:
        print("\n".join(shlex.join(b["argv"]) for b in built))
    return 0


def wheelhouse(source: Path | None, dest: Path) -> list[Path]:
    """DEST (the build context's build/wheelhouse) with every wheel of SOURCE linked in (or
    copied, across file systems): wheels no index has, e.g. torch +cpu. SOURCE: pip's
    find-links here, else /opt/wheels."""
    if source is None:
        from arcvllm.builder import index

        links = [p for p in index.pip_config().get("find-links", []) if "://" not in p]
        source = Path(links[0].removeprefix("file:")) if links else Path("/opt/wheels")
    dest.mkdir(parents=True, exist_ok=True)
    made = []
    for wheel in sorted(source.glob("*.whl")):
        target = dest / wheel.name
        if target.exists() and target.stat().st_size == wheel.stat().st_size:
            made.append(target)
            continue
        target.unlink(missing_ok=True)
        try:
            os.link(wheel, target)
        except OSError:
            shutil.copy2(wheel, target)
        made.append(target)
    return made


def ci_build_args(stack: Stack, standins_dir: Path | None = None) -> dict[str, str]:
    """CI's build args of an XPU stack: its own (FLAVOR=xpu), where only the inputs CI cannot
    reach point at their stand-ins (arcvllm/ci/standins.yaml, made by scripts/ci/standins.sh)."""
    try:
        from arcvllm.ci import standins
    except ImportError:
        where = "CI's stand-ins come with a checkout of arcvllm, not with its wheel"
        raise Unavailable(where) from None
    if stack.flavor != "xpu":
        raise UsageError(f"stack {stack.name} is {stack.flavor}: CI stand-ins are for xpu")
    # The stand-ins first: a missing one fails before the index is asked for the sdist.
    replace = standins.overrides(stack.name, standins.load(), standins_dir or standins.DEFAULT_DIR)
    return standins.ci_build_args(index.build_args(stack), replace, stack.name)
