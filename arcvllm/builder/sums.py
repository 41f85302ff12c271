"""The sha256 of every download a build takes: pinned, or trusted on first use.

Runs on the build host. Most downloads of an XPU stack are pinned in configs/stacks.yaml
(a publisher's sum, or one a release recorded). Where a publisher gives none (two GPU debs
and the kernels wheel of the older stacks), the first `make build` fetches the file once on
this host, records its sha256 in configs/trusted-sums.txt (kept out of git) and says so in
one line; that build and every later one is checked against the recorded sum, so a file
that changes upstream is refused. The hosted release workflow records the same sums and
pins them in stacks.yaml (`arcvllm image sums STACK --write`, in a pull request it opens),
so operators of a release never need the local file.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from arcvllm.errors import CheckFailed, Unavailable
from arcvllm.paths import configs_dir

TRUSTED_FILE = "trusted-sums.txt"

# Each download arg and the arg that pins it: URLs (space separated) -> "sha256 file" pairs.
PAIRS = {
    "GPU_DEBS": "GPU_DEBS_SHA256",
    "ONECCL_INSTALLER_URL": "ONECCL_INSTALLER_SHA256",
    "VLLM_XPU_KERNELS": "VLLM_XPU_KERNELS_SHA256",
}


@dataclass(frozen=True)
class Download:
    arg: str
    url: str

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[-1]


def urls(arg: str, value: str) -> list[str]:
    """The URLs of a download arg (a pip requirement `name @ URL` gives its URL)."""
    if arg == "VLLM_XPU_KERNELS":
        return [value.split("@", 1)[1].strip()] if "@" in value else []
    return [u for u in value.split() if "://" in u]


def pinned(arg: str, value: str) -> dict[str, str]:
    """file name -> sha256 of a *_SHA256 arg (pairs, or one bare sum for the kernels)."""
    words = value.split()
    if len(words) == 1:
        return {"": words[0]}
    return {name: digest for digest, name in zip(words[::2], words[1::2], strict=False)}


def unpinned(args: Mapping[str, str]) -> list[Download]:
    """The downloads of a stack's args that have no sha256 pinned."""
    out = []
    for arg, sums_arg in PAIRS.items():
        have = pinned(sums_arg, args.get(sums_arg, ""))
        for url in urls(arg, args.get(arg, "")):
            name = url.rsplit("/", 1)[-1]
            if name not in have and "" not in have:
                out.append(Download(arg, url))
    return out


def trusted_file() -> Path:
    return configs_dir() / TRUSTED_FILE


def read_trusted(path: Path) -> dict[str, str]:
    """url -> sha256 from the local file ("sha256  url" lines)."""
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        words = line.split()
        if len(words) == 2 and not line.startswith("#"):
            out[words[1]] = words[0]
    return out


def fetch_sha256(url: str) -> str:
    """The sha256 of a URL's content, streamed (through the proxy the host uses, verified
    with pip's CA file or the platform's: index.ca_bundle)."""
    import httpx

    from arcvllm.builder.index import tls_verify

    digest = hashlib.sha256()
    try:
        with httpx.stream(
            "GET", url, follow_redirects=True, timeout=120, verify=tls_verify()
        ) as response:
            response.raise_for_status()
            for chunk in response.iter_bytes():
                digest.update(chunk)
    except httpx.HTTPError as exc:
        raise Unavailable(f"cannot fetch {url} to record its sha256: {exc}") from None
    return digest.hexdigest()


def apply(
    stack_name: str,
    args: Mapping[str, str],
    path: Path | None = None,
    fetch: Callable[[str], str] = fetch_sha256,
) -> dict[str, str]:
    """ARGS with every unpinned download pinned by its trusted sum, fetched and recorded
    the first time (one line on stderr says which and where)."""
    path = path or trusted_file()
    missing = unpinned(args)
    if not missing:
        return dict(args)
    trusted = read_trusted(path)
    new = [d for d in missing if d.url not in trusted]
    for d in new:
        trusted[d.url] = fetch(d.url)
    if new:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as out:
            if path.stat().st_size == 0:
                out.write("# sha256  url: downloads trusted on first use (arcvllm.builder.sums)\n")
            for d in new:
                out.write(f"{trusted[d.url]}  {d.url}\n")
        names = ", ".join(d.name for d in new)
        print(
            f"arcvllm: {stack_name}: no published sha256 for {names}: trusting on first use, "
            f"recorded in {path}; every later build checks them",
            file=sys.stderr,
        )
    values = dict(args)
    for d in missing:
        sums_arg = PAIRS[d.arg]
        if d.arg == "VLLM_XPU_KERNELS":
            values[sums_arg] = trusted[d.url]
        else:
            values[sums_arg] = f"{values.get(sums_arg, '')} {trusted[d.url]} {d.name}".strip()
    return values


def pin(path: Path, stack_name: str, values: Mapping[str, str]) -> str:
    """The stacks file at PATH with STACK_NAME's *_SHA256 args set to VALUES' where they
    differ (their `from` keeps what it said and adds that the release recorded the rest);
    the rest of the file, comments included, as it was."""
    from arcvllm import stack

    old = stack.get(stack_name, path).args
    lines = path.read_text().splitlines(keepends=True)
    start = lines.index(f"  {stack_name}:\n")
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"  \S", lines[i])), len(lines))
    for sums_arg in PAIRS.values():
        key = next(
            (i for i in range(start, end) if lines[i].startswith(f"      {sums_arg}:")), None
        )
        if key is None:
            continue
        stop = key + 1
        while stop < end and lines[stop].startswith("        "):
            stop += 1
        value = values.get(sums_arg, "")
        if not value or value.split() == old[sums_arg].value.split():
            continue
        words = value.split()
        # what the old pins came from stays; an empty pin's "no published sum" goes
        said = " ".join(old[sums_arg].source.split()).rstrip(".") if old[sums_arg].value else ""
        recorded = (
            "the release workflow fetched each file without a published sum once and "
            f"recorded its sha256 (`arcvllm image sums {stack_name} --write`)"
        )
        block = [f"      {sums_arg}:\n"]
        if len(words) == 1:
            block.append(f"        value: {words[0]}\n")
        else:
            block.append("        value: >-\n")
            block += [
                f"          {d}  {n}\n" for d, n in zip(words[::2], words[1::2], strict=False)
            ]
        block += ["        from: >-\n", f"          {said + '. ' if said else ''}{recorded}\n"]
        lines[key:stop] = block
        end += len(block) - (stop - key)
    return "".join(lines)


def pin_stack(stack_name: str, write: bool = False) -> tuple[str, dict[str, str]]:
    """`arcvllm image sums STACK`: the sums arg of every download of the stack (the
    unpinned ones fetched and recorded, see `apply`); with WRITE, pinned in the stacks file
    (CheckFailed when they did not all land). The stack's name and those args."""
    from arcvllm import stack

    the_stack = stack.get(stack_name)
    values = apply(the_stack.name, the_stack.build_args())
    found = {k: values.get(k, "") for a, k in PAIRS.items() if values.get(a)}
    if write:
        path = stack.stacks_file()
        path.write_text(pin(path, the_stack.name, found))
        if unpinned(stack.get(the_stack.name).build_args()):
            raise CheckFailed(f"{path}: {the_stack.name}'s sums did not all land in it")
        print(f"arcvllm: {the_stack.name}: every download pinned in {path}", file=sys.stderr)
    return the_stack.name, found
