# The CPU half of PyPI's torch wheel, without its CUDA half.
#
# PyPI's Linux torch is a CUDA build: its TorchConfig/Caffe2Config insist on
# the CUDA toolkit (nvcc) and its libtorch.so needs libtorch_cuda.so, which
# needs cuBLAS, cuDNN, NCCL and the rest (~2.7 GB of nvidia-* wheels). The
# kernels a CPU program calls all live in libtorch_cpu.so and libc10.so; of
# CUDA, libtorch_cpu.so needs only libcudart and libcupti (the profiler's
# optional GPU side, never called without a GPU), two small wheels that
# scripts/setup installs beside torch. This module defines what TorchConfig
# would for a CPU program:
#   Torch_VERSION, TORCH_INSTALL_PREFIX, TORCH_LIBRARIES (the target torch_wheel_cpu), TORCH_LIBRARY
# from ANATOMY_TORCH_PREFIX (torch.utils.cmake_prefix_path: <site-packages>/torch/share/cmake).

get_filename_component(TORCH_INSTALL_PREFIX "${ANATOMY_TORCH_PREFIX}/../.." ABSOLUTE)
get_filename_component(_wheel_site_packages "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)

set(_wheel_version_h "${TORCH_INSTALL_PREFIX}/include/torch/headeronly/version.h")
if(NOT EXISTS "${_wheel_version_h}")
  set(_wheel_version_h "${TORCH_INSTALL_PREFIX}/include/torch/csrc/api/include/torch/version.h")
endif()
if(NOT EXISTS "${_wheel_version_h}")
  message(FATAL_ERROR "TorchWheelCPU: ${TORCH_INSTALL_PREFIX} is not a torch wheel's folder (no include/torch/.../version.h)")
endif()
file(STRINGS "${_wheel_version_h}" _wheel_version_lines REGEX "#define TORCH_VERSION_(MAJOR|MINOR|PATCH) [0-9]+")
foreach(_part MAJOR MINOR PATCH)
  string(REGEX REPLACE ".*TORCH_VERSION_${_part} ([0-9]+).*" "\\1" _wheel_${_part} "${_wheel_version_lines}")
endforeach()
set(Torch_VERSION "${_wheel_MAJOR}.${_wheel_MINOR}.${_wheel_PATCH}")

# Only the wheel's own folders are searched: with Debian's LibTorch installed,
# a library found in /usr/lib would mix two LibTorch versions.
foreach(_lib torch_cpu c10)
  find_library(TORCH_WHEEL_${_lib}_LIBRARY ${_lib} PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH REQUIRED)
endforeach()
# libtorch_cpu.so's two CUDA libraries, from the nvidia-cuda-runtime and
# nvidia-cuda-cupti wheels (their cu13 layout, or the older per-package one).
set(_wheel_cuda_dirs)
foreach(_so libcudart libcupti)
  file(GLOB _found "${_wheel_site_packages}/nvidia/*/lib/${_so}.so.*")
  if(NOT _found)
    message(FATAL_ERROR "TorchWheelCPU: ${_so}.so.* not found under ${_wheel_site_packages}/nvidia: "
            "libtorch_cpu.so is linked against it; scripts/setup installs nvidia-cuda-runtime and nvidia-cuda-cupti beside torch")
  endif()
  list(GET _found 0 _first)
  get_filename_component(_dir "${_first}" DIRECTORY)
  list(APPEND _wheel_cuda_dirs "${_dir}")
endforeach()
list(REMOVE_DUPLICATES _wheel_cuda_dirs)
string(REPLACE ";" ":" _wheel_rpath_link "${_wheel_cuda_dirs}")

add_library(torch_wheel_cpu INTERFACE IMPORTED)
target_include_directories(torch_wheel_cpu SYSTEM INTERFACE
  "${TORCH_INSTALL_PREFIX}/include"
  "${TORCH_INSTALL_PREFIX}/include/torch/csrc/api/include")
# what TorchConfig gives a program of a wheel built with distributed support
target_compile_definitions(torch_wheel_cpu INTERFACE USE_DISTRIBUTED USE_C10D_GLOO USE_RPC USE_TENSORPIPE)
target_link_libraries(torch_wheel_cpu INTERFACE "${TORCH_WHEEL_torch_cpu_LIBRARY}" "${TORCH_WHEEL_c10_LIBRARY}")
# the linker follows libtorch_cpu.so's NEEDED entries; the loader finds them by RUNPATH
target_link_options(torch_wheel_cpu INTERFACE "LINKER:-rpath-link,${_wheel_rpath_link}")
set(ANATOMY_TORCH_EXTRA_RPATH "${TORCH_INSTALL_PREFIX}/lib;${_wheel_cuda_dirs}")
set(TORCH_LIBRARIES torch_wheel_cpu)
set(TORCH_LIBRARY "${TORCH_WHEEL_torch_cpu_LIBRARY}")  # as TorchConfig names it (tests/build/test_one_libtorch.sh)
