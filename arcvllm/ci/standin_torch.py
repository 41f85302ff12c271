"""The files of the torch +xpu stand-in wheel: what vLLM's build reads of torch, no more.

vLLM's setup.py imports torch, reads torch.version (hip / xpu / cuda) and
torch.utils.cpp_extension's CUDA_HOME / ROCM_HOME; an extension build asks
torch.utils.cmake_prefix_path and runs CMake's find_package(Torch). torch +xpu's CMake
config needs a SYCL compiler (its FindSYCLToolkit.cmake looks at SYCL_ROOT, CMPLR_ROOT, then
/opt/intel/oneapi/compiler/latest; pytorch#149353): the stand-in's config does the same
check and stops the same way, so a build that would fail on the real image fails here too.
Anything else of torch raises.
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

UTILS = """
import os.path

# Where vLLM's CMakeLists.txt looks for TorchConfig.cmake (append_cmake_prefix_path).
cmake_prefix_path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "share", "cmake")
"""

CPP_EXTENSION = """
# What vLLM's setup.py imports: torch +xpu has neither CUDA nor ROCm.
CUDA_HOME = None
ROCM_HOME = None
SYCL_HOME = None
"""

FIND_SYCL = r"""
# CI stand-in for torch +xpu's FindSYCLToolkit.cmake: where it looks (SYCL_ROOT, CMPLR_ROOT,
# else /opt/intel/oneapi/compiler/latest when it exists) and what it needs there (icx and
# its version, include/sycl, libsycl and libOpenCL in lib).
include(FindPackageHandleStandardArgs)
set(SYCL_ROOT "")
if(DEFINED ENV{SYCL_ROOT})
  set(SYCL_ROOT "$ENV{SYCL_ROOT}")
elseif(DEFINED ENV{CMPLR_ROOT})
  set(SYCL_ROOT "$ENV{CMPLR_ROOT}")
elseif(CMAKE_SYSTEM_NAME MATCHES "Linux" AND EXISTS "/opt/intel/oneapi/compiler/latest")
  set(SYCL_ROOT "/opt/intel/oneapi/compiler/latest")
endif()
set(SYCL_FOUND FALSE)
if(SYCL_ROOT STREQUAL "")
  set(SYCL_REASON_FAILURE "no SYCL_ROOT, CMPLR_ROOT or /opt/intel/oneapi/compiler/latest")
  return()
endif()
find_program(SYCL_COMPILER NAMES icx PATHS "${SYCL_ROOT}" PATH_SUFFIXES bin bin64
  NO_DEFAULT_PATH)
set(SYCL_COMPILER_VERSION "")
if(SYCL_COMPILER)
  execute_process(COMMAND "${SYCL_COMPILER}" --version OUTPUT_VARIABLE _sycl_version)
  if(_sycl_version MATCHES "Intel\\(R\\) .* Compiler ([0-9]+)\\.([0-9]+)\\.([0-9]+)")
    math(EXPR SYCL_COMPILER_VERSION
      "${CMAKE_MATCH_1} * 10000 + ${CMAKE_MATCH_2} * 100 + ${CMAKE_MATCH_3}")
  endif()
endif()
if(NOT SYCL_COMPILER_VERSION)
  set(SYCL_REASON_FAILURE "no icx with a version in ${SYCL_ROOT}/bin")
  return()
endif()
find_file(SYCL_INCLUDE_SYCL_DIR NAMES sycl HINTS "${SYCL_ROOT}/include" NO_DEFAULT_PATH)
set(SYCL_INCLUDE_DIR "${SYCL_ROOT}/include" ${SYCL_INCLUDE_SYCL_DIR})
find_file(SYCL_LIBRARY_DIR NAMES lib lib64 HINTS "${SYCL_ROOT}" NO_DEFAULT_PATH)
find_library(SYCL_LIBRARY NAMES sycl libsycl.so HINTS "${SYCL_LIBRARY_DIR}" NO_DEFAULT_PATH)
find_library(OCL_LIBRARY NAMES OpenCL libOpenCL.so HINTS "${SYCL_LIBRARY_DIR}" NO_DEFAULT_PATH)
if(NOT SYCL_LIBRARY OR NOT OCL_LIBRARY OR NOT SYCL_INCLUDE_SYCL_DIR)
  set(SYCL_REASON_FAILURE "incomplete SYCL toolkit at ${SYCL_ROOT}")
  return()
endif()
find_package_handle_standard_args(SYCL FOUND_VAR SYCL_FOUND
  REQUIRED_VARS SYCL_INCLUDE_DIR SYCL_LIBRARY_DIR SYCL_LIBRARY
  VERSION_VAR SYCL_COMPILER_VERSION)
"""

XPU_CMAKE = """\
# CI stand-in for torch +xpu's Caffe2/public/xpu.cmake: torch built for XPU needs SYCL.
if(TARGET torch::xpurt)
  return()
endif()
find_package(SYCLToolkit REQUIRED)
if(NOT SYCL_FOUND)
  set(PYTORCH_FOUND_XPU FALSE)
  return()
endif()
set(PYTORCH_FOUND_XPU TRUE)
add_library(torch::xpurt INTERFACE IMPORTED)
"""

CAFFE2_CONFIG = """\
# CI stand-in for torch +xpu's Caffe2Config.cmake: XPU was on when torch was built, so the
# XPU runtime must be found, or the configuration stops.
set(old_CMAKE_MODULE_PATH "${CMAKE_MODULE_PATH}")
list(APPEND CMAKE_MODULE_PATH "${CMAKE_CURRENT_LIST_DIR}")
include("${CMAKE_CURRENT_LIST_DIR}/public/xpu.cmake")
set(CMAKE_MODULE_PATH "${old_CMAKE_MODULE_PATH}")
if(NOT PYTORCH_FOUND_XPU)
  message(FATAL_ERROR "torch +xpu needs the XPU runtime and SYCL toolkit (oneAPI DPC++): "
    "${SYCL_REASON_FAILURE}. Set SYCL_ROOT or CMPLR_ROOT, or install oneAPI.")
endif()
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
        "torch/utils/__init__.py": doc + UTILS,
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
