"""What a pinned kernels wheel says about the stack it was built for.

vllm-xpu-kernels is compiled against one torch +xpu and one oneAPI SYCL runtime. Where the
stack's wheel is reachable (PyPI, pinned by sha256), CI reads it: its Requires-Dist (a torch
pin, if it declares one, must be the stack's torch) and the libsycl soname its extensions
are linked against, which the stack's intel-sycl-rt must provide. Where the wheel is not
reachable (GitHub releases), stacks.yaml records the evidence read from its source tag.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

from arcvllm.builder import index, lock
from arcvllm.errors import ArcvllmError
from arcvllm.stack import Stack


@dataclass(frozen=True)
class KernelsVerdict:
    stack: str
    wheel: str
    torch_requirement: str | None  # what the wheel's metadata declares, if anything
    needs_libsycl: set[str]
    sycl_runtime: str  # intel-sycl-rt==X the stack installs
    provides_libsycl: set[str]

    @property
    def problems(self) -> list[str]:
        out = []
        if not self.needs_libsycl <= self.provides_libsycl:
            out.append(
                f"{self.wheel} needs {', '.join(sorted(self.needs_libsycl))}; "
                f"{self.sycl_runtime} provides {', '.join(sorted(self.provides_libsycl))}"
            )
        return out


def _pypi_pin(spec: str) -> tuple[str, str] | None:
    """(name, version) of an exact `name==version` pin; None for a URL requirement."""
    req = Requirement(spec)
    if req.url or len(req.specifier) != 1:
        return None
    (only,) = req.specifier
    return (req.name, only.version) if only.operator == "==" else None


def _wheel_name(project: str, version: str) -> str:
    return f"{project.replace('-', '_')}-{version}"


def _fetch_wheel(project: str, version: str, sha256: str | None, dest: Path) -> Path:
    """The manylinux x86_64 wheel of PROJECT==VERSION from the configured index."""
    prefix = _wheel_name(project, version) + "-"
    name, url, listed = index.find_file(
        project, lambda n: n.startswith(prefix) and n.endswith("x86_64.whl")
    )
    digest = sha256 or listed
    if not digest:
        raise ArcvllmError(f"{name}: no sha256 pinned and none listed by the index")
    return index.fetch(url, digest, dest)


def _needed(wheel: Path, pattern: str) -> set[str]:
    """DT_NEEDED entries matching PATTERN over the wheel's shared objects (readelf)."""
    found: set[str] = set()
    with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory(dir=wheel.parent) as tmp:
        for member in zf.namelist():
            if not member.endswith(".abi3.so"):  # the Python extensions torch loads
                continue
            path = Path(zf.extract(member, tmp))
            out = subprocess.run(
                ["readelf", "-d", str(path)], capture_output=True, text=True, check=True
            ).stdout
            found |= {m for m in re.findall(r"\[(lib[^\]]+)\]", out) if re.match(pattern, m)}
            path.unlink()
    return found


def _provides(wheel: Path, pattern: str) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return {n.rsplit("/", 1)[-1] for n in zf.namelist() if re.search(pattern, n)}


def _sycl_runtime(stack: Stack, root: Path) -> str:
    """The intel-sycl-rt pin the stack ends with: the ONEAPI_PIP override, else its lock."""
    args = stack.build_args()
    lock_file = root / args.get("XPU_LOCK", "")
    for text in (
        "\n".join(args.get("ONEAPI_PIP", "").split()),
        lock_file.read_text() if lock_file.is_file() else "",
    ):
        if version := lock.requirement_pins(text).get("intel-sycl-rt"):
            return f"intel-sycl-rt=={version}"
    raise ArcvllmError(f"stack {stack.name}: no intel-sycl-rt pin in ONEAPI_PIP or its lock")


def check(stack: Stack, root: Path, cache: Path) -> KernelsVerdict | None:
    """The verdict for STACK's kernels wheel, or None where it is not on an index."""
    args = stack.build_args()
    pin = _pypi_pin(args.get("VLLM_XPU_KERNELS", ""))
    if pin is None:
        return None
    wheel = _fetch_wheel(*pin, args.get("VLLM_XPU_KERNELS_SHA256") or None, cache)
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [
            line.split(":", 1)[1].strip()
            for line in zf.read(meta).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    torch_req = next((r for r in requires if Requirement(r).name == "torch"), None)
    if torch_req and not Requirement(torch_req).specifier.contains(
        args["TORCH_VERSION"], prereleases=True
    ):
        raise ArcvllmError(
            f"{wheel.name} requires {torch_req}; the stack runs torch {args['TORCH_VERSION']}"
        )
    sycl = _sycl_runtime(stack, root)
    sycl_wheel = _fetch_wheel("intel-sycl-rt", sycl.split("==")[1], None, cache)
    return KernelsVerdict(
        stack=stack.name,
        wheel=wheel.name,
        torch_requirement=torch_req,
        needs_libsycl=_needed(wheel, r"libsycl\.so"),
        sycl_runtime=sycl,
        provides_libsycl=_provides(sycl_wheel, r"/libsycl\.so\.\d+$"),
    )
