"""The XPU runtime's environment, read from the Dockerfile, the compose files, the Kubernetes
manifest and the pinned wheels: where the GPU compilers cache, where oneCCL finds
libfabric, and what the build may take from PyTorch's XPU index.

No Intel GPU here: each test proves what the files and the pinned wheels say (the image's
environment as `arcvllm stack audit` reads it, with each stack's own build args)."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import sys
import zipfile
from functools import cache
from pathlib import Path, PurePosixPath

import pytest
import yaml
from support import ROOT
from support.docker import docker, xpu_ci_image
from support.stacks import INSTALLER_STACKS, XPU_STACKS

from arcvllm import stack
from arcvllm.builder import facts, index, shell
from arcvllm.ci import standins

DOCKERFILE = ROOT / "docker" / "Dockerfile"
COMPOSE = ROOT / "docker" / "compose.yaml"
SCALE = ROOT / "docker" / "compose.scale.yaml"
STATEFULSET = ROOT / "deploy" / "kubernetes" / "base" / "vllm-statefulset.yaml"


@cache
def image_env(name: str) -> dict[str, str]:
    """The XPU runtime image's environment for stack NAME (ENV of its stage chain)."""
    args = stack.get(name, flavor="xpu").build_args()
    ours = facts.our_facts(DOCKERFILE.read_text(), args, ROOT)
    return {k[4:]: v for k, v in ours.values.items() if k.startswith("env:")}


def under(path: str, mount: str) -> bool:
    return PurePosixPath(path).is_relative_to(PurePosixPath(mount))


# ---- the GPU compilers' caches (issue 20, item 12) ----------------------------------------

GPU_CACHES = {"NEO_CACHE_DIR": "NEO_CACHE_PERSISTENT", "SYCL_CACHE_DIR": "SYCL_CACHE_PERSISTENT"}


def compose_volumes(service: dict) -> dict[str, str]:
    """Target -> named volume of SERVICE's volumes (bind mounts left out)."""
    out = {}
    for volume in service.get("volumes") or []:
        source, _, rest = volume.partition(":")
        if source and not source.startswith(("/", ".", "$")):
            out[rest.split(":")[0]] = source
    return out


def xpu_servers() -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    """Every place the XPU server runs: its environment over the image's, and the target
    of each persistent volume it mounts -> the volume."""
    single = yaml.safe_load(COMPOSE.read_text())["services"]["vllm"]
    replica = yaml.safe_load(SCALE.read_text())["x-xpu-replica"]
    pod = yaml.safe_load(STATEFULSET.read_text())["spec"]
    container = next(c for c in pod["template"]["spec"]["containers"] if c["name"] == "vllm")
    claims = {t["metadata"]["name"] for t in pod["volumeClaimTemplates"]}
    return {
        "compose vllm": (single.get("environment") or {}, compose_volumes(single)),
        "compose.scale x-xpu-replica": (replica.get("environment") or {}, compose_volumes(replica)),
        "kubernetes vllm": (
            {e["name"]: e.get("value", "") for e in container.get("env") or []},
            {m["mountPath"]: m["name"] for m in container["volumeMounts"] if m["name"] in claims},
        ),
    }


@pytest.mark.parametrize("name", XPU_STACKS)
def test_the_gpu_compilers_caches_are_persistent_and_on_the_compile_cache_volume(name):
    """compute-runtime (NEO) and SYCL keep their compiled kernels on the volume every XPU
    server mounts: a restart, `make down && make up` or a new image recompiles nothing."""
    env = image_env(name)
    settings = (ROOT / "docker" / "arcvllm.env").read_text().splitlines()
    for where, (service_env, volumes) in xpu_servers().items():
        merged = {**env, **{k: str(v) for k, v in service_env.items()}}
        for directory, switch in GPU_CACHES.items():
            assert merged.get(switch) == "1", (where, switch)
            path = merged.get(directory, "")
            mounts = [t for t in volumes if path and under(path, t)]
            assert mounts, f"{where}: {directory}={path or 'unset'} is on no persistent volume"
            assert not any(line.startswith((f"{directory}=", f"{switch}=")) for line in settings)
    # Compose's compile cache, not the anonymous volume of the image's cache root.
    compose_volumes_of_vllm = xpu_servers()["compose vllm"][1]
    assert compose_volumes_of_vllm["/var/cache/arcvllm/compile"] == "compile-cache"
    assert all(under(env[d], "/var/cache/arcvllm/compile") for d in GPU_CACHES)


def test_the_entrypoint_makes_the_gpu_cache_folders_compute_runtime_needs(tmp_path):
    """compute-runtime turns its cache off when NEO_CACHE_DIR does not exist
    (default_cache_config.cpp: pathExists): a fresh volume or claim has no such folder."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "NEO_CACHE_DIR": str(tmp_path / "vol/neo"),
        "SYCL_CACHE_DIR": str(tmp_path / "vol/sycl"),
        "TMPDIR": str(tmp_path / "tmp"),
        "HF_HOME": str(tmp_path / "hf"),
    }
    done = subprocess.run(
        ["bash", str(ROOT / "docker" / "entrypoint.sh"), "true"], env=env, capture_output=True
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "vol/neo").is_dir() and (tmp_path / "vol/sycl").is_dir()


# ---- the XPU index serves the +xpu names only (issue 20, item 14) --------------------------

INSTALL = ROOT / "docker" / "install-vllm-xpu.sh"


def dockerfile_install_args(index_url: str) -> list[str]:
    """The PIP_ARGS the Dockerfile passes to install-vllm-xpu, with the XPU index at
    INDEX_URL (what the build's TORCH_INDEX_URL and TRITON_INDEX_URL would be)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    m = re.search(r'install-vllm-xpu \S+ "[^"]+" "\$VLLM_DEPS_FROM"([^;]*);', text)
    assert m, "the Dockerfile runs install-vllm-xpu no more"
    values = {"TORCH_INDEX_URL": index_url, "TRITON_INDEX_URL": index_url}
    return shlex.split(shell.substitute(m.group(1), values))


def pep503(root: Path, wheels: list[tuple[standins.Wheel, dict[str, str]]]) -> str:
    """A PEP 503 index of WHEELS under ROOT; its file:// URL."""
    for wheel, files in wheels:
        project = root / wheel.project
        project.mkdir(parents=True, exist_ok=True)
        (project / wheel.filename).write_bytes(standins.wheel_bytes(wheel, files))
        links = "".join(f'<a href="{w.name}">{w.name}</a><br/>' for w in project.glob("*.whl"))
        (project / "index.html").write_text(f"<html><body>{links}</body></html>\n")
    return root.as_uri() + "/"


def pure(name: str, version: str, *requires: str) -> tuple[standins.Wheel, dict[str, str]]:
    module = name.replace("-", "_")
    return (
        standins.Wheel(name, version, "py3-none-any", requires),
        {f"{module}/__init__.py": f"VERSION = {version!r}\n"},
    )


@pytest.fixture(scope="module")
def xpu_index_world(tmp_path_factory):
    """A venv with the lock installed (torch +xpu, by exact pin) and vLLM's wheel; the
    default index, and an XPU index that also serves a newer build of a name vLLM wants
    unpinned (dep-b), beside the +xpu build of one the lock lacks (0.20's torchaudio)."""
    tmp = tmp_path_factory.mktemp("xpu-index")
    default = pep503(
        tmp / "pypi",
        [pure("dep-b", "1.0"), pure("dep-c", "1.0"), pure("torchaudio", "2.11.0", "torch==2.11.0")],
    )
    xpu = pep503(
        tmp / "xpu",
        [
            pure("dep-b", "9.0"),
            pure("torch", "2.11.0+xpu"),
            pure("torchaudio", "2.11.0+xpu", "torch==2.11.0"),
            pure("torchaudio", "2.14.0+xpu", "torch==2.14.0"),
        ],
    )
    vllm, files = pure(
        "vllm", "0.20.2", "dep-b>=1", "dep-c", "torch==2.11.0", "torchaudio",
        "vllm-xpu-kernels @ https://example.invalid/k.whl",
    )  # fmt: skip
    (tmp / "dist").mkdir()
    wheel = tmp / "dist" / vllm.filename
    wheel.write_bytes(standins.wheel_bytes(vllm, files))
    # As the real locks: what the default index serves carries its sha256, the +xpu pins none.
    dep_c = next((tmp / "pypi" / "dep-c").glob("*.whl"))
    sha256 = hashlib.sha256(dep_c.read_bytes()).hexdigest()
    (tmp / "lock.txt").write_text(f"torch==2.11.0+xpu\ndep-c==1.0 --hash=sha256:{sha256}\n")
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "v")], check=True)
    # install-vllm-xpu's Python reads requirements with `packaging`, as the image's venv has it
    import packaging

    (tmp / "pp").mkdir()
    (tmp / "pp" / "packaging").symlink_to(Path(packaging.__file__).parent)
    env = {
        "PATH": f"{tmp / 'v' / 'bin'}:{os.environ['PATH']}",
        "PYTHONPATH": str(tmp / "pp"),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": default,
        "PIP_NO_CACHE_DIR": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "TMPDIR": str(tmp),
        "HOME": str(tmp),
    }
    pip = [str(tmp / "v" / "bin" / "pip"), "install", "-q", "--no-deps"]
    subprocess.run([*pip, "--index-url", xpu, "torch==2.11.0+xpu"], env=env, check=True)
    return {"tmp": tmp, "env": env, "xpu": xpu, "wheel": wheel}


def install(world: dict, *args: str, **env: str) -> subprocess.CompletedProcess:
    pip = world["tmp"] / "v" / "bin" / "pip"
    subprocess.run(
        [str(pip), "uninstall", "-q", "-y", "dep-b", "dep-c", "torchaudio"],
        env=world["env"], capture_output=True,
    )  # fmt: skip
    cmd = ["bash", str(INSTALL), str(world["wheel"]), str(world["tmp"] / "lock.txt"), "index"]
    return subprocess.run(
        [*cmd, *args], env={**world["env"], **env}, capture_output=True, text=True
    )


def installed_version(world: dict, name: str) -> str | None:
    python = world["tmp"] / "v" / "bin" / "python"
    code = f"from importlib.metadata import version; print(version({name!r}))"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def test_index_mode_takes_each_name_from_its_own_index_only(xpu_index_world):
    """xpu-0.20 (VLLM_DEPS_FROM=index), run with the Dockerfile's own arguments: dep-b,
    unpinned in the lock, comes from the default index, not as the XPU index's 9.0; the
    +xpu name the lock lacks (torchaudio) from the XPU index, at torch's version."""
    world = xpu_index_world
    done = install(world, *dockerfile_install_args(world["xpu"]))
    assert done.returncode == 0, done.stderr
    assert installed_version(world, "dep-b") == "1.0"
    assert installed_version(world, "dep-c") == "1.0"
    assert installed_version(world, "torchaudio") == "2.11.0+xpu"
    assert installed_version(world, "torch") == "2.11.0+xpu"  # the lock's, untouched


def test_another_index_is_refused_and_the_environments_ignored(xpu_index_world):
    """The siblings: the XPU index handed over as a pip index (as before) stops the build
    in one line; through PIP_EXTRA_INDEX_URL it takes no part; a +xpu name with no XPU
    index given is refused rather than taken from the default index."""
    world = xpu_index_world
    done = install(world, "--extra-index-url", world["xpu"])
    assert done.returncode == 2
    assert "the only option is --xpu-index URL" in done.stderr
    done = install(world, "--xpu-index", world["xpu"], PIP_EXTRA_INDEX_URL=world["xpu"])
    assert done.returncode == 0, done.stderr
    assert installed_version(world, "dep-b") == "1.0"
    assert not list(world["tmp"].glob("tmp*/vllm-requires.txt"))  # its scratch is gone
    done = install(world)
    assert done.returncode == 2
    assert "vLLM wants torch==2.11.0 torchaudio from the XPU index" in done.stderr
    assert installed_version(world, "torchaudio") is None


def test_the_xpu_index_serves_only_the_locks_unhashed_pins():
    """The +xpu lines (pinned by version only) come from the XPU index alone (--index-url),
    and no other pip step of the build names it (an --extra-index-url would let every
    name of that step resolve there)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    assert '--extra-index-url "$TORCH_INDEX_URL"' not in text
    step = re.search(r"pip install [^;]*-r /tmp/xpu-index\.txt", text)
    assert step and '--index-url "$TORCH_INDEX_URL"' in step.group(0)


# ---- libfabric for oneCCL's ofi transport (issue 20, item 11) -------------------------------

WHEELS = ROOT / "build" / "wheels"
VENV = PurePosixPath("/opt/venv")
TRANSPORT_PROVIDERS = ("libtcp-fi.so", "libshm-fi.so", "librxm-fi.so")


@cache
def impi_wheel(name: str) -> Path:
    """The lock's impi-rt wheel for stack NAME, by the sha256 the lock pins (build/wheels)."""
    args = stack.get(name, flavor="xpu").build_args()
    line = next(
        ln for ln in (ROOT / args["XPU_LOCK"]).read_text().splitlines()
        if ln.startswith("impi-rt==")
    )  # fmt: skip
    version, sha256 = line.split("==")[1].split()[0], line.split("--hash=sha256:")[1].strip()
    prefix = f"impi_rt-{version}-"
    filename, _, _ = index.find_file(
        "impi-rt", lambda n: n.startswith(prefix) and n.endswith("x86_64.whl")
    )
    return index.fetch_file("impi-rt", filename, sha256, WHEELS)


def in_wheel(wheel: Path, path: str) -> str | None:
    """Where the wheel installs PATH of the image's venv (its RECORD), or None."""
    if not under(path, str(VENV)):
        return None
    rel = PurePosixPath(path).relative_to(VENV)
    with zipfile.ZipFile(wheel) as zf:
        record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        files = [row.split(",")[0] for row in zf.read(record).decode().splitlines()]
    data = next((f.split("/data/")[0] + "/data" for f in files if ".data/data/" in f), "")
    want = f"{data}/{rel}"
    return want if want in files else None


@pytest.mark.vllm
@pytest.mark.parametrize("name", INSTALLER_STACKS)
def test_oneccls_libfabric_and_its_providers_are_files_of_the_locks_impi_rt(name):
    """CCL_OFI_LIBRARY_PATH (oneCCL's first choice) and FI_PROVIDER_PATH name files the
    pinned impi-rt wheel installs, not the installer's tree that only the CI stand-in
    lays out as assumed."""
    env, wheel = image_env(name), impi_wheel(name)
    assert in_wheel(wheel, env["CCL_OFI_LIBRARY_PATH"]), env["CCL_OFI_LIBRARY_PATH"]
    for provider in TRANSPORT_PROVIDERS:
        assert in_wheel(wheel, f"{env['FI_PROVIDER_PATH']}/{provider}"), provider
    assert str(PurePosixPath(env["CCL_OFI_LIBRARY_PATH"]).parent) in env["LD_LIBRARY_PATH"]
    assert "I_MPI_ROOT" not in env  # no second, contradicting way to libfabric


def venv_of(wheel: Path, root: Path) -> Path:
    """The wheel's libfabric, providers and fi_info laid out under ROOT as in the venv."""
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            _, sep, rel = member.partition(".data/data/")
            if sep and (("fabric" in rel or rel.endswith("-fi.so")) and "/" in rel):
                target = root / "opt/venv" / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(member))
                target.chmod(0o755)
    return root


def fi_info(root: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """impi-rt's fi_info -p tcp with the image's environment, its paths moved under ROOT."""
    moved = {k: env[k].replace("/opt/", f"{root}/opt/") for k in ("FI_PROVIDER_PATH",)}
    moved["LD_LIBRARY_PATH"] = env["LD_LIBRARY_PATH"].replace("/opt/", f"{root}/opt/")
    tool = root / "opt/venv/bin/libfabric/fi_info"
    return subprocess.run(
        [str(tool), "-p", "tcp"], env={"PATH": "/usr/bin:/bin", **moved},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.vllm
def test_the_tcp_provider_loads_from_the_configured_path_and_not_from_the_old_one(tmp_path):
    """libfabric finds its tcp provider (a plugin, not built in) through FI_PROVIDER_PATH:
    with the image's environment fi_info lists it; with the old installer-layout path,
    where impi-rt puts nothing, it finds none (fi_getinfo -61)."""
    env = image_env("xpu-0.23")
    root = venv_of(impi_wheel("xpu-0.23"), tmp_path)
    done = fi_info(root, env)
    assert done.returncode == 0 and "provider: tcp" in done.stdout, done.stdout + done.stderr
    old = {**env, "FI_PROVIDER_PATH": "/opt/intel/oneapi/ccl/latest/opt/mpi/libfabric/lib/prov"}
    done = fi_info(root, old)
    assert done.returncode != 0 and "provider: tcp" not in done.stdout


@pytest.mark.xpu_ci
@pytest.mark.docker
@pytest.mark.usefixtures("engine")
@pytest.mark.parametrize("name", INSTALLER_STACKS)
def test_the_rehearsal_image_lists_the_tcp_provider_and_loads_libfabric(name):
    """In CI's rehearsal of the build (the lock's real impi-rt, the image's own ENV):
    `fi_info -p tcp` lists the provider, and CCL_OFI_LIBRARY_PATH loads with fi_getinfo."""
    image = xpu_ci_image(name)
    done = docker("run", "--rm", "--entrypoint", "/opt/venv/bin/libfabric/fi_info", image,
                  "-p", "tcp", check=False)  # fmt: skip
    assert done.returncode == 0 and "provider: tcp" in done.stdout, done.stdout + done.stderr
    code = (
        "import ctypes, os; lib = ctypes.CDLL(os.environ['CCL_OFI_LIBRARY_PATH']); "
        "print(bool(lib.fi_getinfo), lib.fi_version())"
    )
    done = docker("run", "--rm", "--entrypoint", "python3", image, "-c", code, check=False)
    assert done.returncode == 0 and done.stdout.startswith("True"), done.stderr
