"""The toolchain Triton's Intel backend compiles its kernel launcher with, checked for real.

triton-xpu (3.7/3.8: third_party/intel/backend/driver.py, python/triton/runtime/build.py)
builds a small C++ module the first time each kernel signature runs: it includes
<Python.h>, <level_zero/ze_api.h> and <sycl/sycl.hpp>, and links -lsycl -lze_loader. vLLM
runs Triton kernels on every XPU step, so an image without these fails at its first
request. `arcvllm toolchain` compiles and loads a file of that shape, with the include and
library folders found the way the driver finds them, and names the first missing piece.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from arcvllm.errors import Unavailable

LAUNCHER = r"""
#include <Python.h>
#include <level_zero/ze_api.h>
#include <sycl/sycl.hpp>

// The shape of triton-xpu's launcher: a Python module whose function takes a SYCL queue
// and a Level Zero handle. Nothing runs on a device here; compiling and linking is the test.
static PyObject *launch(PyObject *self, PyObject *args) {
  sycl::queue *queue = nullptr;
  ze_module_handle_t module = nullptr;
  (void)queue; (void)module; (void)self; (void)args;
  if (&zeInit == nullptr) return NULL;
  Py_RETURN_NONE;
}
static PyMethodDef methods[] = {{"launch", launch, METH_VARARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "arcvllm_launcher", NULL, -1,
                                        methods};
PyMODINIT_FUNC PyInit_arcvllm_launcher(void) { return PyModule_Create(&module_def); }
"""


@dataclass(frozen=True)
class Toolchain:
    compiler: str
    python_include: str
    sycl_include: str
    sycl_lib: str
    level_zero_include: str


def _compiler() -> str:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++", "icpx"):
        if name and (path := shutil.which(name)):
            return path
    raise Unavailable("no C++ compiler (CXX, c++, g++, clang++ or icpx) on PATH")


def _python_include() -> str:
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").is_file():
        raise Unavailable(f"no Python.h in {include} (the python3-dev package)")
    return include


def _sycl() -> tuple[str, str]:
    """The intel-sycl-rt wheel's include and lib folders, as the driver's find_sycl does."""
    try:
        files = metadata.files("intel-sycl-rt") or []
    except metadata.PackageNotFoundError:
        raise Unavailable("no intel-sycl-rt wheel (sycl/sycl.hpp, libsycl.so)") from None
    header = lib = None
    for f in files:
        path = Path(f.locate()).resolve()  # .data files land outside site-packages
        if path.parts[-3:] == ("include", "sycl", "sycl.hpp"):
            header = path.parent.parent
        elif path.parts[-2:] == ("lib", "libsycl.so"):
            lib = path.parent
    if header is None or lib is None:
        raise Unavailable("the intel-sycl-rt wheel has no include/sycl/sycl.hpp or libsycl.so")
    return str(header), str(lib)


def _level_zero() -> str:
    roots = [os.environ.get("LEVEL_ZERO_V1_SDK_PATH"), os.environ.get("ZE_PATH"), "/usr"]
    for root in filter(None, roots):
        if (Path(root) / "include" / "level_zero" / "ze_api.h").is_file():
            return str(Path(root) / "include")
    raise Unavailable("no level_zero/ze_api.h (the Level Zero dev package)")


def find() -> Toolchain:
    """Every piece, or the first missing one as one line."""
    sycl_include, sycl_lib = _sycl()
    return Toolchain(_compiler(), _python_include(), sycl_include, sycl_lib, _level_zero())


def first_error(stderr: str) -> str:
    """The compiler's first diagnostic of severity error (`error:`, `fatal error:`), not a
    warning that happens to say "errorenous"; else its last line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.search(r"\berror:", ln)]
    if errors:
        return errors[0]
    return lines[-1] if lines else ""


def check(workdir: Path) -> Toolchain:
    """Compile, link and load the launcher-shaped module in WORKDIR."""
    tc = find()
    source, out = workdir / "launcher.cpp", workdir / "arcvllm_launcher.so"
    source.write_text(LAUNCHER)
    cmd = [
        tc.compiler, str(source), "-O0", "-shared", "-fPIC", "-std=c++17", "-o", str(out),
        f"-I{tc.python_include}", f"-I{tc.sycl_include}", f"-I{tc.level_zero_include}",
        f"-L{tc.sycl_lib}", "-lsycl", "-lze_loader",
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise Unavailable(f"the launcher does not build: {first_error(result.stderr)}")
    try:
        ctypes.CDLL(str(out))
    except OSError as exc:
        raise Unavailable(f"the launcher does not load: {exc}") from None
    return tc


def check_here() -> dict[str, str]:
    """`check` in a folder of its own, removed after: the toolchain's facts."""
    with tempfile.TemporaryDirectory(prefix="arcvllm-toolchain-") as tmp:
        return asdict(check(Path(tmp)))


def render(facts: dict[str, str]) -> str:
    """The facts a line each, then what was proved."""
    lines = [f"{key:20} {value}" for key, value in facts.items()]
    return "\n".join(
        [*lines, "toolchain: the Triton launcher builds, links -lsycl -lze_loader and loads"]
    )
