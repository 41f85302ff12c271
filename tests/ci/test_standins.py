"""CI stand-ins (arcvllm/ci/standins.yaml): named in one place with reasons, replacing only
what the stack pins, shaped as the real inputs; the base image and index in Docker."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from support import ROOT
from support.stacks import XPU_STACKS

from arcvllm import stack
from arcvllm.builder import image, index
from arcvllm.ci import standin_base, standins
from arcvllm.cli import main
from arcvllm.docker import docker_binary
from arcvllm.errors import ArcvllmError

# The docker tests here read what `make build-xpu-ci` makes (scripts/ci/standins.sh).
pytestmark = pytest.mark.xpu_ci


@pytest.fixture(scope="module")
def config() -> standins.Config:
    return standins.load()


@pytest.fixture(scope="module")
def made(config, tmp_path_factory) -> Path:
    """Stand-ins as `make` writes them, with placeholder bytes for the debs (no apt here)."""
    root = tmp_path_factory.mktemp("standins")
    standins.make_wheels(config, root)
    standins.make_oneccl(config, root)
    entry = config.entry("gpu-debs")
    (root / entry["dir"]).mkdir()
    for name, (version, _) in entry["packages"].items():
        (root / entry["dir"] / standins._deb_file(name, version)).write_bytes(name.encode())
    return root


def metadata(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return z.read(name).decode().splitlines()


# ---- the one place: every substitution named, with a reason ------------------------------


def test_every_standin_says_what_it_stands_in_for_and_why(config):
    for name, entry in config.standins.items():
        assert str(entry["reason"]).strip(), name
        assert str(entry["stands_in_for"]).strip(), name


def test_a_standin_without_a_reason_is_refused():
    with pytest.raises(ArcvllmError, match="stand-in base-image needs `reason`"):
        standins.parse({"standins": {"base-image": {"stands_in_for": "ubuntu:24.04"}}})


def test_a_stack_naming_an_unknown_standin_is_refused():
    data = {
        "standins": {"x": {"stands_in_for": "y", "reason": "z"}},
        "stacks": {"xpu-0.23": {"XPU_BASE_IMAGE": "nope"}},
    }
    with pytest.raises(ArcvllmError, match="XPU_BASE_IMAGE names no stand-in: nope"):
        standins.parse(data)


def test_every_xpu_stack_has_standins_and_each_replaces_a_pin_it_sets(config):
    by_name, _ = stack.load()
    xpu = {s.name for s in by_name.values() if s.flavor == "xpu"}
    assert set(config.stacks) == xpu
    for name, keys in config.stacks.items():
        missing = set(keys) - set(by_name[name].build_args())
        assert not missing, f"{name}: stand-ins for pins it does not set: {missing}"


def test_a_standin_for_a_pin_the_stack_lacks_is_refused():
    with pytest.raises(ArcvllmError, match=r"xpu-0\.33 sets no ONECCL_INSTALLER_URL"):
        standins.ci_build_args({"FLAVOR": "xpu"}, {"ONECCL_INSTALLER_URL": "x"}, "xpu-0.33")


# ---- the build args ----------------------------------------------------------------------


@pytest.fixture
def no_index(monkeypatch):
    from arcvllm.builder import index

    monkeypatch.setattr(index, "file_url", lambda *a: "https://mirror.invalid/vllm.tar.gz")


@pytest.mark.parametrize("name", XPU_STACKS)
def test_ci_args_are_the_stacks_own_but_for_the_standins(name, config, made, no_index):
    real_stack = stack.get(name)
    real = index.build_args(real_stack)
    ci = image.ci_build_args(real_stack, made)
    assert ci["FLAVOR"] == "xpu"
    assert set(ci) == set(real)
    changed = {k for k in real if ci[k] != real[k]}
    assert changed == set(config.stacks[name])  # each stand-in replaces, nothing else moves


def test_ci_args_point_at_files_that_exist_with_their_sums(made, no_index):
    ci = image.ci_build_args(stack.get("xpu-0.23"), made)
    in_build = "file:///wheelhouse/standins/"
    urls = ci["GPU_DEBS"].split()
    assert len(urls) == 8 and all(u.startswith(in_build + "debs/") for u in urls)
    pairs = ci["GPU_DEBS_SHA256"].split()
    sums = dict(zip(pairs[1::2], pairs[::2], strict=True))
    for url in urls:
        local = made / url.removeprefix(in_build)
        assert sums[local.name] == hashlib.sha256(local.read_bytes()).hexdigest()
    kernels = ci["VLLM_XPU_KERNELS"].split(" @ ")[1].removeprefix(in_build)
    assert (
        ci["VLLM_XPU_KERNELS_SHA256"] == hashlib.sha256((made / kernels).read_bytes()).hexdigest()
    )
    installer = ci["ONECCL_INSTALLER_URL"].removeprefix(in_build)
    digest = hashlib.sha256((made / installer).read_bytes()).hexdigest()
    assert ci["ONECCL_INSTALLER_SHA256"] == f"{digest}  {installer}"
    assert ci["TORCH_INDEX_URL"] == in_build + "xpu-index/"


def test_build_args_before_the_standins_are_made_is_one_line_and_exit_3(tmp_path, capsys):
    code = main(["stack", "build-args", "xpu-0.23", "--ci", "--standins-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 3
    assert err.count("\n") == 1 and "scripts/ci/standins.sh" in err


def test_ci_build_args_of_a_cpu_stack_is_a_usage_error(capsys):
    assert main(["stack", "build-args", "cpu", "--ci"]) == 2
    assert "CI stand-ins are for xpu" in capsys.readouterr().err


# ---- the wheels --------------------------------------------------------------------------


def test_standin_wheels_are_the_same_bytes_on_every_run(config, made, tmp_path):
    standins.make_wheels(config, tmp_path)
    first = sorted((made / "wheels").iterdir())
    assert [p.name for p in first] == sorted(p.name for p in (tmp_path / "wheels").iterdir())
    for wheel in first:
        assert wheel.read_bytes() == (tmp_path / "wheels" / wheel.name).read_bytes(), wheel.name
    assert standins.make_wheels(config, tmp_path) == "current"


def test_each_wheel_says_it_is_a_standin_and_its_record_holds(made):
    for wheel in (made / "wheels").iterdir():
        assert any(
            line.startswith("Summary: CI stand-in for") and "no XPU code" in line
            for line in metadata(wheel)
        ), wheel.name
        with zipfile.ZipFile(wheel) as z:
            record = next(n for n in z.namelist() if n.endswith("RECORD"))
            for row in z.read(record).decode().splitlines():
                path, digest, _ = row.split(",")
                if digest:
                    raw = hashlib.sha256(z.read(path)).digest()
                    want = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
                    assert digest == f"sha256={want}", f"{wheel.name}: {path}"


def test_torch_pins_its_oneapi_runtime_as_the_stacks_lock_does(made):
    wheels = made / "wheels"
    old = metadata(wheels / "torch-2.11.0+xpu-cp312-cp312-manylinux_2_28_x86_64.whl")
    new = metadata(wheels / "torch-2.14.0+xpu-cp312-cp312-manylinux_2_28_x86_64.whl")
    assert 'Requires-Dist: intel-sycl-rt==2025.3.2; platform_system == "Linux"' in old
    assert 'Requires-Dist: triton-xpu==3.7.0; platform_system == "Linux"' in old
    assert 'Requires-Dist: intel-sycl-rt==2026.1.0; platform_system == "Linux"' in new
    assert 'Requires-Dist: triton-xpu==3.8.0; platform_system == "Linux"' in new


def test_the_kernels_wheels_have_the_file_names_the_stacks_pin(config):
    kernels = config.kernel_wheels()
    for name, keys in config.stacks.items():
        if "VLLM_XPU_KERNELS" in keys:
            real = stack.get(name).build_args()["VLLM_XPU_KERNELS"]
            assert real.rsplit("/", 1)[1] == kernels[keys["VLLM_XPU_KERNELS"]].filename


def test_the_index_has_a_page_per_project_linking_wheels_by_sha256(made):
    index = made / "xpu-index"
    assert {p.name for p in index.iterdir() if p.is_dir()} == {
        "torch", "torchvision", "torchaudio", "triton-xpu", "triton", "certifi",
    }  # fmt: skip
    page = (index / "torch" / "index.html").read_text()
    assert "../../wheels/torch-2.11.0+xpu-cp312-cp312-manylinux_2_28_x86_64.whl#sha256=" in page
    assert "torch-2.14.0+xpu" in page


# ---- the torch stand-in: what vLLM's build reads ------------------------------------------


@pytest.fixture(scope="module")
def torch_site(made, tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    wheel = made / "wheels" / "torch-2.11.0+xpu-cp312-cp312-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    return site


def run_python(site: Path, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(["python3", "-c", code], env=env, capture_output=True, text=True)


def test_torch_standin_answers_what_vllms_setup_py_reads(torch_site):
    code = (
        "import torch\n"
        "from torch.utils.cpp_extension import CUDA_HOME, ROCM_HOME\n"
        "assert CUDA_HOME is None and ROCM_HOME is None\n"
        "assert torch.version.cuda is None and torch.version.hip is None\n"
        "import os; assert os.path.isdir(torch.utils.cmake_prefix_path + '/Torch')\n"
        "print(torch.__version__, torch.version.xpu)\n"
    )
    result = run_python(torch_site, code)
    assert result.returncode == 0, result.stderr
    version, xpu = result.stdout.split()
    assert version == "2.11.0+xpu" and xpu


def test_torch_standin_refuses_anything_else(torch_site):
    result = run_python(torch_site, "import torch; torch.zeros(1)")
    assert result.returncode != 0
    assert "CI stand-in for torch 2.11.0+xpu has no XPU code" in result.stderr


def cmake() -> str:
    found = shutil.which("cmake", path=f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}")
    if not found:
        pytest.skip("no cmake (the `cmake` wheel from PyPI will do)")
    return found


def configure(torch_site: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    assert not Path("/opt/intel/oneapi/compiler/latest").exists(), "a real SYCL compiler here"
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(probe NONE)\nfind_package(Torch REQUIRED)\n"
    )
    clean = {k: v for k, v in os.environ.items() if k not in ("SYCL_ROOT", "CMPLR_ROOT")}
    prefix = run_python(torch_site, "import torch; print(torch.utils.cmake_prefix_path)").stdout
    result = subprocess.run(
        [
            cmake(),
            "-S",
            str(src),
            "-B",
            str(tmp_path / "build"),
            f"-DCMAKE_PREFIX_PATH={prefix.strip()}",
        ],
        env={**clean, **env},
        capture_output=True,
        text=True,
    )
    # CMake wraps its messages: compare words
    result.stderr = " ".join(result.stderr.split())
    return result


def sycl_root(tmp_path: Path, *without: str) -> Path:
    """A directory laid out as oneAPI's compiler (icx answering its version), less WITHOUT."""
    root = tmp_path / "compiler"
    files = {
        "bin/icx": "#!/bin/sh\necho 'Intel(R) oneAPI DPC++/C++ Compiler 2025.3.2 (2025.3.2.1)'\n",
        "include/sycl/sycl.hpp": "",
        "lib/libsycl.so": "",
        "lib/libOpenCL.so": "",
    }
    for name, text in files.items():
        if name not in without:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
    if "bin/icx" not in without:
        (root / "bin/icx").chmod(0o755)
    return root


def test_torch_cmake_config_stops_without_a_sycl_compiler(torch_site, tmp_path):
    result = configure(torch_site, tmp_path)
    assert result.returncode != 0
    assert "torch +xpu needs the XPU runtime and SYCL toolkit" in result.stderr
    assert "no SYCL_ROOT, CMPLR_ROOT" in result.stderr


def test_torch_cmake_config_stops_at_a_sycl_root_without_icx(torch_site, tmp_path):
    result = configure(torch_site, tmp_path, CMPLR_ROOT=str(sycl_root(tmp_path, "bin/icx")))
    assert result.returncode != 0
    assert "no icx with a version" in result.stderr


def test_torch_cmake_config_passes_with_a_compiler_at_sycl_root(torch_site, tmp_path):
    result = configure(torch_site, tmp_path, SYCL_ROOT=str(sycl_root(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert "Found SYCL" in result.stdout and "20250302" in result.stdout
    assert "CI stand-in for torch 2.11.0+xpu" in result.stdout


# ---- the oneCCL installer ----------------------------------------------------------------


def test_oneccl_standin_lays_out_what_the_build_checks(config, tmp_path):
    entry = config.entry("oneccl-installer")
    prefix = tmp_path / "ccl" / Path(entry["prefix"]).name
    script = tmp_path / entry["file"]
    script.write_text(standins.ONECCL_SCRIPT.format(file=entry["file"], prefix=prefix))
    refused = subprocess.run(["bash", str(script), "--silent"], capture_output=True, text=True)
    assert refused.returncode == 2
    result = subprocess.run(
        ["bash", str(script), "-a", "--silent", "--eula", "accept"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "CI stand-in" in result.stdout
    assert prefix.name.startswith("20")
    for path in ("lib", "opt/mpi/libfabric/lib/prov", "env"):
        assert (prefix / path).is_dir(), path
    assert (prefix / "opt/mpi/libfabric/lib/libfabric.so").exists()
    assert (prefix / "env/vars.sh").is_file()


# ---- the base image ----------------------------------------------------------------------

GOOD = {
    "glibc": "2.43",
    "uid1000": "ubuntu:1000",
    "pip": "pip 23.2.1",
    "stdlib": "ok",
    "layout": "ok",
    "python-upgrades": "0",
    "debs": "ok",
    "ze_api": "ok",
}


def test_the_base_is_made_again_when_what_it_is_made_of_changes_not_its_prose(config):
    def fingerprint(**changes) -> str:
        entry = {**config.entry("base-image"), **changes}
        changed = standins.Config({**config.standins, "base-image": entry}, config.stacks)
        return standins.base_fingerprint(changed, Path("/py/3.12.1"))

    assert fingerprint(reason="reworded") == fingerprint()
    assert fingerprint(suite="trixie") != fingerprint()
    assert fingerprint(runtime_debs="libssl3t64") != fingerprint()


def test_a_stale_base_is_made_by_any_user_and_a_current_one_is_kept(config, monkeypatch):
    """No root check: mmdebstrap runs as a container's root on the engine (standin_base)."""
    monkeypatch.setattr(standins, "host_python", lambda patterns: Path("/opt/python3.12"))
    monkeypatch.setattr(standins, "require_docker", lambda: None)
    monkeypatch.setattr(standins, "apt_mirror", lambda: "http://mirror.invalid/debian")
    monkeypatch.setattr(standins, "image_label", lambda image, label: "stale")
    monkeypatch.setattr(standins.os, "geteuid", lambda: 1000)
    built = []
    monkeypatch.setattr(standin_base, "build", lambda *args: built.append(args))
    assert standins.make_base(config, Path("/nonexistent")) == "made"
    assert [args[-1] for args in built] == [config.entry("base-image")["maker"]]
    built.clear()
    monkeypatch.setattr(standins, "image_label", lambda image, label: standins.base_fingerprint(
        config, Path("/opt/python3.12")))  # fmt: skip
    assert standins.make_base(config, Path("/nonexistent")) == "current"
    assert built == []


def _prefix(path: Path) -> Path:
    (path / "bin").mkdir(parents=True)
    return path


def test_the_python_is_the_named_prefix_else_the_newest_of_the_first_place_with_one(
    tmp_path, monkeypatch
):
    monkeypatch.delenv(standins.PYTHON_ENV, raising=False)
    for version in ("3.12.1", "3.12.10", "3.12.9"):
        _prefix(tmp_path / "mine" / version)
    _prefix(tmp_path / "theirs" / "3.12.11")
    places = [str(tmp_path / "none" / "3.12.*"), str(tmp_path / "mine" / "3.12.*"),
              str(tmp_path / "theirs" / "3.12.*")]  # fmt: skip
    assert standins.host_python(places) == tmp_path / "mine" / "3.12.10"
    monkeypatch.setenv("HOME", str(tmp_path / "mine"))
    assert standins.host_python(["~/3.12.*"]) == tmp_path / "mine" / "3.12.10"
    named = _prefix(tmp_path / "elsewhere")
    monkeypatch.setenv(standins.PYTHON_ENV, str(named))
    assert standins.host_python(places) == named


def test_no_python_or_a_named_non_prefix_is_one_line_naming_the_setting(tmp_path, monkeypatch):
    monkeypatch.delenv(standins.PYTHON_ENV, raising=False)
    with pytest.raises(
        standins.Unavailable, match=r"no CPython 3\.12 .* set ARCVLLM_STANDIN_PYTHON"
    ):
        standins.host_python([str(tmp_path / "3.12.*")])
    monkeypatch.setenv(standins.PYTHON_ENV, str(tmp_path))
    with pytest.raises(
        standins.Unavailable, match=r"ARCVLLM_STANDIN_PYTHON=.* not a CPython prefix"
    ):
        standins.host_python([])


def test_the_shape_check_passes_the_shape_it_wants(config):
    assert standin_base.problems(GOOD, config.entry("base-image"), with_debs=True) == []


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("glibc", "2.36", "glibc 2.36 < 2.39"),
        ("uid1000", "vllm:1000", "UID 1000 is vllm:1000"),
        ("pip", "", "no working pip"),
        ("stdlib", "", "lacks ssl"),
        ("python-upgrades", "2", "apt would replace"),
        ("debs", "E: unmet dependencies", "do not install"),
        ("ze_api", "", "ze_api.h"),
    ],
)
def test_the_shape_check_fails_on_each_difference(config, key, value, says):
    found = standin_base.problems({**GOOD, key: value}, config.entry("base-image"), True)
    assert len(found) == 1 and says in found[0]


# ---- in Docker: the base image, the debs on it, pip and the index -------------------------


@pytest.fixture(scope="module")
def standins_made(engine) -> Path:
    """scripts/ci/standins.sh as CI runs it (quick when everything is current)."""
    result = subprocess.run(
        ["scripts/ci/standins.sh"], cwd=ROOT, capture_output=True, text=True, timeout=3600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return ROOT / standins.DEFAULT_DIR


@pytest.mark.docker
def test_base_standin_has_ubuntu_2404s_shape_and_the_gpu_debs_install(config, standins_made):
    debs = standins_made / config.entry("gpu-debs")["dir"]
    assert standin_base.check(config.entry("base-image"), debs, docker_binary()) == []


@pytest.mark.docker
def test_the_shape_check_fails_on_plain_debian(config, engine):
    entry = {**config.entry("base-image"), "image": "debian:bookworm-slim"}
    found = standin_base.check(entry, None, docker_binary())
    assert any("UID 1000" in p for p in found)
    assert any("python3.12" in p for p in found)


@pytest.mark.docker
def test_a_maker_that_fails_leaves_no_image(config, engine, tmp_path):
    """The tar streams from the maker to `docker import`: before, a maker that failed left
    an empty image under the stand-in's name with the label of a current one (797 bytes)."""
    entry = {**config.entry("base-image"), "image": f"arcvllm-test-standin-{os.getpid()}:base"}
    python = standins.host_python(entry["python"]["host_globs"])
    absent = "arcvllm-test-absent/maker:0"
    with pytest.raises(ArcvllmError, match=f"mmdebstrap in {absent} failed"):
        standin_base.build(entry, python, "http://mirror.invalid", "x", tmp_path, docker_binary(),
                           absent)  # fmt: skip
    left = subprocess.run([docker_binary(), "images", "-q", entry["image"].split(":")[0]],
                          capture_output=True, text=True)  # fmt: skip
    assert left.stdout.strip() == ""
    assert list(tmp_path.iterdir()) == []


PIP_SCRIPT = r"""
set -eu
python3.12 -m venv /tmp/v
/tmp/v/bin/pip install -q "pip>=24,<25"
/tmp/v/bin/pip --version
index=file:///wheelhouse/standins/xpu-index/
for set in "torch==2.11.0+xpu torchvision==0.26.0+xpu torchaudio==2.11.0+xpu triton-xpu==3.7.0" \
    "torch==2.14.0+xpu torchvision==0.29.0+xpu torchaudio==2.14.0+xpu triton-xpu==3.8.0" \
    "triton==3.8.0+xpu"; do
    /tmp/v/bin/pip download -q --no-deps -d /tmp/d --index-url "$index" $set
done
ls /tmp/d
/tmp/v/bin/pip download -q --no-deps -d /tmp/e --index-url "$index" torch==2.12.0+xpu \
    >/dev/null 2>&1 && echo "UNEXPECTED torch 2.12.0+xpu" || echo "absent version refused"
/tmp/v/bin/pip install -q --dry-run --report /tmp/r.json --extra-index-url "$index" \
    torch==2.11.0+xpu
python3.12 -c 'import json
meta = [i["metadata"] for i in json.load(open("/tmp/r.json"))["install"]]
print("resolved", *sorted(m["name"] + "==" + m["version"] for m in meta))'
"""


@pytest.mark.docker
def test_pip_24_resolves_the_standin_index_with_the_real_oneapi_wheels(standins_made):
    ca = "/etc/ssl/certs/ca-certificates.crt"
    result = subprocess.run(
        [
            docker_binary(), "run", "--rm", "-v", f"{standins_made}:/wheelhouse/standins:ro",
            "-v", f"{ca}:/ca.crt:ro", "-e", "PIP_CERT=/ca.crt",
            "-e", "PIP_DISABLE_PIP_VERSION_CHECK=1",
            "arcvllm-standin/ubuntu:24.04", "bash", "-c", PIP_SCRIPT,
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert out.startswith("pip 24.")
    assert out.count(".whl") == 9
    assert "absent version refused" in out
    resolved = out.split("resolved", 1)[1].split()
    assert "torch==2.11.0+xpu" in resolved and "triton-xpu==3.7.0" in resolved
    assert "intel-sycl-rt==2025.3.2" in resolved  # from the package index: real


def test_every_pin_only_the_xpu_index_serves_has_a_stand_in_there(made):
    """A lock line without a sha256 is one the XPU index serves (stacks.yaml, the lock's
    header): the stand-in index must carry its exact version, or pip cannot resolve the
    real lock the real way (xpu-0.33 pins certifi 2026.10.19, an XPU-index build)."""
    served = {
        (p.name, a.split("-")[1])
        for p in (made / "xpu-index").iterdir()
        if p.is_dir()
        for a in (p / "index.html").read_text().split('">')[1:]
    }
    for lock in sorted((ROOT / "configs" / "locks").glob("xpu-*.txt")):
        for line in lock.read_text().splitlines():
            if line[:1].isalnum() and "==" in line and " --hash=" not in line:
                name, version = line.split("==")
                project = name.lower().replace("_", "-")
                assert (project, version.strip()) in served, f"{lock.name}: {line}"


def test_the_prefix_rewritten_is_the_one_the_python_was_built_for(tmp_path):
    lib = tmp_path / "copy" / "lib" / "python3.12"
    lib.mkdir(parents=True)
    data = lib / "_sysconfigdata__linux_x86_64-linux-gnu.py"
    data.write_text("build_time_vars = {'prefix': '/install', 'LIBDIR': '/install/lib'}\n")
    assert standin_base.recorded_prefix(lib, tmp_path / "copy") == "/install"
    data.unlink()
    assert standin_base.recorded_prefix(lib, tmp_path / "copy") == str(tmp_path / "copy")
