"""The files of the torch +xpu stand-in wheel: what vLLM's build reads of torch, no more.

vLLM's setup.py imports torch, reads torch.version (hip / xpu / cuda) and
torch.utils.cpp_extension's CUDA_HOME / ROCM_HOME; an extension build runs CMake's
find_package(Torch). torch +xpu's CMake config needs a SYCL compiler (its
FindSYCLToolkit.cmake looks at SYCL_ROOT, CMPLR_ROOT, then /opt/intel/oneapi/compiler/latest;
pytorch#149353): the stand-in's config does the same check and stops the same way, so a
build that would fail on the real image fails here too. Anything else of torch raises.
"""

from __future__ import annotations

INIT = """
from torch import utils, version
from torch.version import __version__


def __getattr__(name):
    raise AttributeError(f"torch.{name}: the CI stand-in for torch {__version__} has no XPU code")
"""

VERSION = """
__version__ = "{version}"
git_version = "0000000000000000000000000000000000000000"
debug = False
cuda = None
hip = None
xpu = "20250302"
"""

CPP_EXTENSION = """
# What vLLM's setup.py imports: torch +xpu has neither CUDA nor ROCm.
CUDA_HOME = None
ROCM_HOME = None
SYCL_HOME = None
"""

FIND_SYCL = """\
# CI stand-in for torch +xpu's FindSYCLToolkit.cmake: where it looks, and when it gives up.
include(FindPackageHandleStandardArgs)
set(SYCL_ROOT "")
if(DEFINED ENV{SYCL_ROOT})
  set(SYCL_ROOT "$ENV{SYCL_ROOT}")
elseif(DEFINED ENV{CMPLR_ROOT})
  set(SYCL_ROOT "$ENV{CMPLR_ROOT}")
elseif(CMAKE_SYSTEM_NAME MATCHES "Linux")
  set(SYCL_ROOT "/opt/intel/oneapi/compiler/latest")
endif()
find_program(SYCL_COMPILER NAMES icpx HINTS "${SYCL_ROOT}/bin" NO_DEFAULT_PATH)
find_path(SYCL_INCLUDE_DIR NAMES sycl/sycl.hpp HINTS "${SYCL_ROOT}/include" NO_DEFAULT_PATH)
find_file(SYCL_LIBRARY NAMES libsycl.so HINTS "${SYCL_ROOT}/lib" NO_DEFAULT_PATH)
find_package_handle_standard_args(SYCLToolkit
  REQUIRED_VARS SYCL_COMPILER SYCL_INCLUDE_DIR SYCL_LIBRARY
  REASON_FAILURE_MESSAGE
    "no SYCL compiler in SYCL_ROOT, CMPLR_ROOT or /opt/intel/oneapi/compiler/latest")
set(SYCL_FOUND ${SYCLTOOLKIT_FOUND})
"""

XPU_CMAKE = """\
# CI stand-in for torch +xpu's Caffe2/public/xpu.cmake: torch built for XPU needs SYCL.
if(NOT SYCL_FOUND)
  list(APPEND CMAKE_MODULE_PATH "${CMAKE_CURRENT_LIST_DIR}/..")
  find_package(SYCLToolkit)
endif()
if(NOT SYCL_FOUND)
  message(FATAL_ERROR "torch +xpu needs the SYCL toolkit (Intel oneAPI DPC++ compiler): "
    "set SYCL_ROOT or CMPLR_ROOT; none at '${SYCL_ROOT}'")
endif()
"""

CAFFE2_CONFIG = """\
# CI stand-in for torch +xpu's Caffe2Config.cmake.
set(USE_XPU ON)
include("${CMAKE_CURRENT_LIST_DIR}/public/xpu.cmake")
"""

TORCH_CONFIG = """\
# CI stand-in for torch {version}'s TorchConfig.cmake: the SYCL check of torch +xpu, then an
# empty torch target (no libtorch to link).
get_filename_component(TORCH_INSTALL_PREFIX "${{CMAKE_CURRENT_LIST_DIR}}/../../../" ABSOLUTE)
include("${{TORCH_INSTALL_PREFIX}}/share/cmake/Caffe2/Caffe2Config.cmake")
message(STATUS "CI stand-in for torch {version}: no libtorch, nothing links")
if(NOT TARGET torch)
  add_library(torch INTERFACE IMPORTED)
endif()
set(TORCH_LIBRARIES torch)
set(TORCH_INCLUDE_DIRS "${{TORCH_INSTALL_PREFIX}}/include")
set(TORCH_CXX_FLAGS "")
set(Torch_FOUND TRUE)
"""

TORCH_CONFIG_VERSION = """\
set(PACKAGE_VERSION "{version}")
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
endif()
"""


def files(version: str, doc: str) -> dict[str, str]:
    """path -> text of the torch stand-in wheel for torch VERSION (e.g. 2.11.0+xpu)."""
    plain = version.split("+")[0]
    return {
        "torch/__init__.py": doc + INIT,
        "torch/version.py": doc + VERSION.format(version=version),
        "torch/utils/__init__.py": doc,
        "torch/utils/cpp_extension.py": doc + CPP_EXTENSION,
        "torch/include/STANDIN": "CI stand-in: no headers\n",
        "torch/share/cmake/Torch/TorchConfig.cmake": TORCH_CONFIG.format(version=version),
        "torch/share/cmake/Torch/TorchConfigVersion.cmake": TORCH_CONFIG_VERSION.format(
            version=plain
        ),
        "torch/share/cmake/Caffe2/Caffe2Config.cmake": CAFFE2_CONFIG,
        "torch/share/cmake/Caffe2/FindSYCLToolkit.cmake": FIND_SYCL,
        "torch/share/cmake/Caffe2/public/xpu.cmake": XPU_CMAKE,
    }
