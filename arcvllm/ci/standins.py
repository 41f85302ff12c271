"""CI stand-ins for what the XPU build cannot reach here (arcvllm/ci/standins.yaml).

CI builds the XPU stacks with the operator's own Dockerfile, stages and locks; only the
inputs this host cannot reach (a registry's base image, GitHub release downloads, PyTorch's
and vLLM's XPU indexes) are replaced, by files under build/wheelhouse/standins that the
build sees at /wheelhouse/standins. `arcvllm standins make` makes them (skipping what is
current); `arcvllm stack build-args STACK --ci` points the stack's build args at them.
"""

from __future__ import annotations

import base64
import glob
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from arcvllm.docker import docker_binary
from arcvllm.errors import ArcvllmError, Unavailable, UsageError
from arcvllm.paths import configs_dir

# Where `make` writes, relative to the checkout, and where the build sees it.
DEFAULT_DIR = Path("build/wheelhouse/standins")
IN_BUILD = "file:///wheelhouse/standins"
PARTS = ("debs", "wheels", "oneccl", "base")


# Every ZIP entry gets this time: the same wheel bytes on every run.
ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def scratch_dir(root: Path) -> Path:
    """Scratch space next to the build context's wheelhouse, never inside it (nor /tmp)."""
    return root.parent.parent / "tmp"


def config_file() -> Path:
    """The stand-ins' list: beside this module, in the CI tree the product wheel leaves out."""
    return Path(__file__).with_name("standins.yaml")


@dataclass(frozen=True)
class Wheel:
    """A stand-in wheel: the real distribution's name, version, tag and Requires-Dist."""

    name: str
    version: str
    tag: str
    requires: tuple[str, ...]

    @property
    def filename(self) -> str:
        return f"{re.sub(r'[-_.]+', '_', self.name)}-{self.version}-{self.tag}.whl"

    @property
    def project(self) -> str:
        """The PEP 503 normalized name (the index page's directory)."""
        return re.sub(r"[-_.]+", "-", self.name).lower()


@dataclass(frozen=True)
class Config:
    standins: Mapping[str, Mapping]
    stacks: Mapping[str, Mapping[str, str]]

    def entry(self, name: str) -> Mapping:
        return self.standins[name]

    def index_wheels(self) -> list[Wheel]:
        return [_wheel(raw) for raw in self.entry("xpu-index")["wheels"]]

    def kernel_wheels(self) -> dict[str, Wheel]:
        return {k: _wheel(v["wheel"]) for k, v in self.standins.items() if "wheel" in v}


def _wheel(raw: Mapping) -> Wheel:
    requires = []
    lock = raw.get("lock")
    for req in raw.get("requires") or []:
        if req.endswith("==@lock"):
            name = req.removesuffix("==@lock")
            if not lock:
                raise ArcvllmError(f"standins: {raw['name']} {raw['version']}: {req} needs `lock`")
            requires.append(f'{name}=={lock_version(lock, name)}; platform_system == "Linux"')
        else:
            requires.append(req)
    return Wheel(str(raw["name"]), str(raw["version"]), str(raw["tag"]), tuple(requires))


def lock_version(lock: str, name: str) -> str:
    """NAME's pinned version in a lock file of configs/locks."""
    text = (configs_dir().parent / lock).read_text()
    if m := re.search(rf"^{re.escape(name)}==(\S+)", text, re.MULTILINE):
        return m.group(1)
    raise ArcvllmError(f"standins: {lock} pins no {name}")


def parse(data: object, source: str = "standins.yaml") -> Config:
    """The stand-ins and, per stack, which build arg each replaces; every one has a reason."""
    if not isinstance(data, Mapping) or not isinstance(data.get("standins"), Mapping):
        raise ArcvllmError(f"{source}: expected a `standins:` mapping")
    standins = data["standins"]
    for name, raw in standins.items():
        for field in ("reason", "stands_in_for"):
            if not isinstance(raw, Mapping) or not str(raw.get(field) or "").strip():
                raise ArcvllmError(f"{source}: stand-in {name} needs `{field}`")
    stacks = data.get("stacks") or {}
    for stack, keys in stacks.items():
        for key, name in (keys or {}).items():
            if name not in standins:
                raise ArcvllmError(f"{source}: {stack}: {key} names no stand-in: {name}")
    return Config(standins, {str(k): dict(v or {}) for k, v in stacks.items()})


def load(path: Path | None = None) -> Config:
    import yaml

    path = path or config_file()
    if not path.exists():
        raise Unavailable(f"no stand-ins file at {path}")
    return parse(yaml.safe_load(path.read_text()), str(path))


# ---- the build args ----------------------------------------------------------------------


def _sum_of(path: Path) -> str:
    if not path.is_file():
        raise Unavailable(
            f"no stand-in {path}: run scripts/ci/standins.sh first (arcvllm standins make)"
        )
    return hashlib.sha256(path.read_bytes()).hexdigest()


def overrides(stack: str, config: Config, root: Path = DEFAULT_DIR) -> dict[str, str]:
    """The build args STACK's stand-ins replace, with sums read from the files made."""
    if stack not in config.stacks:
        raise UsageError(f"standins: no stand-ins for stack {stack}")
    values: dict[str, str] = {}
    for key, name in config.stacks[stack].items():
        entry = config.entry(name)
        if name == "base-image":
            values[key] = entry["image"]
        elif name == "gpu-debs":
            files = [root / entry["dir"] / _deb_file(p, v[0]) for p, v in entry["packages"].items()]
            if key == "GPU_DEBS":
                values[key] = " ".join(f"{IN_BUILD}/{entry['dir']}/{f.name}" for f in files)
            else:
                values[key] = " ".join(f"{_sum_of(f)}  {f.name}" for f in files)
        elif name == "xpu-index":
            values[key] = f"{IN_BUILD}/{entry['dir']}/"
        elif name == "probe-torch":
            values[key] = str(entry["stage"])
        elif "wheel" in entry:
            wheel = _wheel(entry["wheel"])
            path = root / "wheels" / wheel.filename
            if key.endswith("_SHA256"):
                values[key] = _sum_of(path)
            else:
                values[key] = f"{wheel.name} @ {IN_BUILD}/wheels/{wheel.filename}"
        elif name == "oneccl-installer":
            path = root / entry["file"]
            if key.endswith("_SHA256"):
                values[key] = f"{_sum_of(path)}  {path.name}"
            else:
                values[key] = f"{IN_BUILD}/{path.name}"
        else:
            raise ArcvllmError(f"standins: {stack}: {key}: no rule for stand-in {name}")
    return values


def ci_build_args(
    real: Mapping[str, str], replace: Mapping[str, str], stack: str
) -> dict[str, str]:
    """The stack's own build args (FLAVOR=xpu) with only its stand-ins' keys replaced."""
    unknown = sorted(set(replace) - set(real))
    if unknown:
        raise ArcvllmError(
            f"standins: {stack} sets no {', '.join(unknown)}: nothing to stand in for"
        )
    return {**real, **replace}


# ---- making the stand-ins ----------------------------------------------------------------


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, check=True, text=True, capture_output=True, **kwargs)
    except FileNotFoundError:
        raise Unavailable(f"standins: {cmd[0]} not found") from None
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or exc.stdout or "").strip().splitlines()[-3:]
        raise ArcvllmError(f"standins: {' '.join(cmd[:3])} failed: {' | '.join(tail)}") from None


def apt_mirror() -> str:
    """The Debian mirror apt's sources name (deb822 first, then a one-line sources.list)."""
    for f in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        if m := re.search(r"^URIs:\s*(\S+)", Path(f).read_text(), re.MULTILINE):
            return m.group(1)
    if Path("/etc/apt/sources.list").exists():
        for line in Path("/etc/apt/sources.list").read_text().splitlines():
            if line.split()[:1] == ["deb"]:
                return next(w for w in line.split()[1:] if not w.startswith("["))
    raise Unavailable("standins: no Debian mirror in apt's sources")


def _deb_file(name: str, version: str) -> str:
    return f"{name}_{re.sub(r'^[0-9]+:', '', version)}_amd64.deb"


def make_debs(config: Config, root: Path) -> str:
    """The GPU debs from sid, by apt with a private state dir, checked against the pins."""
    entry = config.entry("gpu-debs")
    out = root / entry["dir"]
    packages = entry["packages"]
    want = {_deb_file(n, v[0]): v[1] for n, v in packages.items()}
    if out.is_dir() and all(
        (out / f).is_file() and hashlib.sha256((out / f).read_bytes()).hexdigest() == s
        for f, s in want.items()
    ):
        return "current"
    out.mkdir(parents=True, exist_ok=True)
    scratch_dir(root).mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="standins-apt.", dir=scratch_dir(root))).resolve()
    try:
        for d in ("lists/partial", "cache/archives/partial"):
            (state / d).mkdir(parents=True)
        sources = state / "sources.list"
        keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
        sources.write_text(f"deb [signed-by={keyring}] {apt_mirror()} {entry['suite']} main\n")
        opts = [
            f"-oDir::Etc::SourceList={sources}",
            "-oDir::Etc::SourceParts=/nonexistent",
            f"-oDir::State::Lists={state}/lists",
            f"-oDir::Cache={state}/cache",
            "-oDir::State::Status=/dev/null",
            "-oAPT::Architectures::=amd64",
        ]
        _run(["apt-get", *opts, "-qq", "update"])
        pins = [f"{n}={v[0]}" for n, v in packages.items()]
        _run(["apt-get", *opts, "-qq", "download", *pins], cwd=out)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    for f, s in want.items():
        if hashlib.sha256((out / f).read_bytes()).hexdigest() != s:
            raise ArcvllmError(f"standins: {f}: sha256 differs from standins.yaml's pin")
    return "made"


def _zip(entries: Mapping[str, bytes], executable: frozenset[str] = frozenset()) -> bytes:
    """A ZIP of ENTRIES in order, fixed times and modes: the same bytes every run."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries.items():
            info = zipfile.ZipInfo(name, ZIP_TIME)
            info.external_attr = (0o755 if name in executable else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return buf.getvalue()


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest},{len(data)}"


def wheel_bytes(wheel: Wheel, files: Mapping[str, str]) -> bytes:
    """A valid wheel of WHEEL holding FILES (path -> text), deterministic."""
    dist = f"{wheel.filename.split('-')[0]}-{wheel.version}.dist-info"
    what = f"{wheel.name} {wheel.version}"
    metadata = [
        "Metadata-Version: 2.1",
        f"Name: {wheel.name}",
        f"Version: {wheel.version}",
        f"Summary: CI stand-in for {what}: no XPU code",
        *(f"Requires-Dist: {r}" for r in wheel.requires),
    ]
    body = {k: v.encode() for k, v in sorted(files.items())}
    body[f"{dist}/METADATA"] = ("\n".join(metadata) + "\n").encode()
    root_is_purelib = "false" if wheel.tag.split("-")[-1] != "any" else "true"
    body[f"{dist}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: arcvllm-standins\nRoot-Is-Purelib: {root_is_purelib}\n"
        f"Tag: {wheel.tag}\n"
    ).encode()
    record = [f"{k},{_record_hash(v)}" for k, v in body.items()] + [f"{dist}/RECORD,,"]
    body[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    return _zip(body)


def _doc(wheel: Wheel) -> str:
    return f'"""CI stand-in for {wheel.name} {wheel.version}: no XPU code."""\n'


def wheel_files(wheel: Wheel) -> dict[str, str]:
    """What each stand-in holds: enough for vLLM's setup.py and CMake, nothing that runs."""
    from arcvllm.ci import standin_torch

    doc = _doc(wheel)
    if wheel.project == "torch":
        return standin_torch.files(wheel.version, doc)
    if wheel.project in ("torchvision", "torchaudio"):
        return {f"{wheel.project}/__init__.py": doc + f'__version__ = "{wheel.version}"\n'}
    if wheel.project == "triton-xpu":
        return {"triton/__init__.py": doc + f'__version__ = "{wheel.version}"\n'}
    if wheel.project == "vllm-xpu-kernels":
        return {"vllm_xpu_kernels/__init__.py": doc}
    if wheel.project == "certifi":  # the system's CA store, as Debian's python3-certifi has it
        store = "/etc/ssl/certs/ca-certificates.crt"
        return {
            "certifi/__init__.py": doc + "from certifi.core import contents, where\n",
            "certifi/core.py": f"def where():\n    return {store!r}\n\n\n"
            "def contents():\n    with open(where(), encoding='ascii') as f:\n"
            "        return f.read()\n",
        }
    return {}  # the triton +xpu shim: metadata only (it requires triton-xpu)


def _index_page(title: str, links: list[tuple[str, str]]) -> str:
    rows = "\n".join(f'    <a href="{href}">{text}</a><br/>' for href, text in links)
    return (
        f"<!DOCTYPE html>\n<html>\n  <head><title>{title}</title></head>\n  <body>\n"
        f"{rows}\n  </body>\n</html>\n"
    )


def make_wheels(config: Config, root: Path) -> str:
    """Every stand-in wheel in wheels/, and the XPU index's PEP 503 pages over them."""
    wheels_dir = root / "wheels"
    index = root / config.entry("xpu-index")["dir"]
    wheels_dir.mkdir(parents=True, exist_ok=True)
    changed = 0
    made: dict[str, list[tuple[str, str]]] = {}
    for wheel in [*config.index_wheels(), *config.kernel_wheels().values()]:
        data = wheel_bytes(wheel, wheel_files(wheel))
        path = wheels_dir / wheel.filename
        if not path.is_file() or path.read_bytes() != data:
            path.write_bytes(data)
            changed += 1
        made.setdefault(wheel.project, []).append(
            (
                f"../../wheels/{wheel.filename}#sha256={hashlib.sha256(data).hexdigest()}",
                wheel.filename,
            )
        )
    pages = {"index.html": _index_page("Simple index", [(f"{p}/", p) for p in sorted(made)])}
    for project in config.index_wheels():
        pages[f"{project.project}/index.html"] = _index_page(
            f"Links for {project.project}", made[project.project]
        )
    for rel, text in pages.items():
        path = index / rel
        if not path.is_file() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed += 1
    return "made" if changed else "current"


ONECCL_SCRIPT = """\
#!/bin/sh
# CI stand-in for {file}: no oneCCL in it. Takes the real installer's
# `-a --silent --eula accept` and leaves the layout the image's build checks.
set -eu
usage="{file} (CI stand-in): usage: -a --silent --eula accept"
[ "$*" = "-a --silent --eula accept" ] || {{ echo "$usage" >&2; exit 2; }}
echo "{file}: CI stand-in, no oneCCL installed"
p={prefix}
mkdir -p "$p/lib" "$p/env" "$p/opt/mpi/libfabric/lib/prov"
: > "$p/opt/mpi/libfabric/lib/libfabric.so"
: > "$p/lib/STANDIN-no-oneccl"
cat > "$p/env/vars.sh" <<'EOF'
# CI stand-in for oneCCL's env/vars.sh
export CCL_ROOT={prefix}
export I_MPI_ROOT={prefix}
export FI_PROVIDER_PATH={prefix}/opt/mpi/libfabric/lib/prov
export LD_LIBRARY_PATH={prefix}/lib:{prefix}/opt/mpi/libfabric/lib\
${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}
EOF
"""


def make_oneccl(config: Config, root: Path) -> str:
    entry = config.entry("oneccl-installer")
    text = ONECCL_SCRIPT.format(file=entry["file"], prefix=entry["prefix"])
    path = root / entry["file"]
    if path.is_file() and path.read_text() == text:
        return "current"
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return "made"


# A CPython prefix named by the operator comes before the places standins.yaml lists.
PYTHON_ENV = "ARCVLLM_STANDIN_PYTHON"


def host_python(patterns: list[str]) -> Path:
    """The CPython prefix the python debs are made from: $ARCVLLM_STANDIN_PYTHON, else the
    newest match of the first of PATTERNS (~ is the caller's home) that matches any."""
    if named := os.environ.get(PYTHON_ENV):
        if not (Path(named) / "bin").is_dir():
            raise Unavailable(f"standins: {PYTHON_ENV}={named} is not a CPython prefix (no bin/)")
        return Path(named)
    for pattern in patterns:
        found = [
            p for p in glob.glob(os.path.expanduser(pattern)) if os.access(p, os.R_OK | os.X_OK)
        ]
        if found:
            return Path(max(found, key=lambda p: [int(x) for x in re.findall(r"\d+", p)]))
    raise Unavailable(
        f"standins: no CPython 3.12 to build python3.12 from at {', '.join(patterns)}: "
        f"set {PYTHON_ENV} to one's prefix"
    )


def base_fingerprint(config: Config, python: Path) -> str:
    """What the base image is made of: a different one means the image is stale."""
    from arcvllm.ci import standin_base

    entry = config.entry("base-image")
    made_of = {k: entry[k] for k in standin_base.INPUTS}  # not the prose: reason, ...
    doc = {"entry": made_of, "python": str(python), "v": standin_base.VERSION}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def image_label(image: str, label: str) -> str | None:
    template = f'{{{{index .Config.Labels "{label}"}}}}'
    proc = subprocess.run(
        [docker_binary(), "image", "inspect", "-f", template, image],
        capture_output=True,
        text=True,
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def require_docker() -> None:
    docker = docker_binary()
    if subprocess.run([docker, "version"], capture_output=True).returncode != 0:
        where = "DOCKER_HOST: scripts/ci/engine.sh env"
        raise Unavailable(f"standins: no Docker engine answers ({docker}; {where})")


def make_base(config: Config, root: Path) -> str:
    from arcvllm.ci import standin_base

    entry = config.entry("base-image")
    python = host_python(entry["python"]["host_globs"])
    require_docker()
    fingerprint = base_fingerprint(config, python)
    if image_label(entry["image"], standin_base.LABEL) == fingerprint:
        return "current"
    docker = docker_binary()
    standin_base.build(
        entry, python, apt_mirror(), fingerprint, scratch_dir(root), docker, entry["maker"]
    )
    return "made"


MAKERS = {"debs": make_debs, "wheels": make_wheels, "oneccl": make_oneccl, "base": make_base}


def make(config: Config, root: Path, parts: tuple[str, ...] = PARTS) -> dict[str, dict]:
    """Each part made or found current, with the seconds it took."""
    done = {}
    for part in parts:
        start = time.monotonic()
        state = MAKERS[part](config, root)
        done[part] = {"state": state, "seconds": round(time.monotonic() - start, 1)}
    return done


def check_base(config: Config, root: Path) -> list[str]:
    """Problems of the base image: the ubuntu:24.04 shape, and the GPU debs installing on it."""
    from arcvllm.ci import standin_base

    require_docker()
    debs = (root / config.entry("gpu-debs")["dir"]).resolve()
    return standin_base.check(config.entry("base-image"), debs, docker_binary())


# ---- the command -------------------------------------------------------------------------
