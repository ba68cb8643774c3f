# Which NCCL and which CUDA toolkit a CUDA build of batchdist takes, given the Torch
# that find_package(Torch) found. Included by the top-level CMakeLists.txt; its
# functions are also run alone by tests/torch_cuda_cmake_test.sh (cmake -P).

# Note [one NCCL]: a pip torch's libtorch_cuda.so loads libnccl.so.2 from its own
# wheel (nvidia-nccl, by its RUNPATH) and calls symbols of that release. batchdist
# must compile against that NCCL's header and link that library: one process has one
# libnccl.so.2, and a toolkit's older NCCL under /usr/local (found first on the system
# paths) leaves libtorch_cuda.so's newer symbols undefined at link time. This sets OUT
# to the libnccl that libtorch_cuda.so resolves (ldd, without the caller's
# LD_LIBRARY_PATH: the wheel's own choice), or to "" (no libtorch_cuda.so, or a
# LibTorch with NCCL linked in statically).
function(batchdist_torch_nccl out)
  set(${out} "" PARENT_SCOPE)
  set(torch_cuda "${BATCHDIST_TORCH_LIBDIR}/libtorch_cuda.so")
  find_program(BATCHDIST_LDD ldd)
  if(NOT EXISTS "${torch_cuda}" OR NOT BATCHDIST_LDD)
    return()
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ${BATCHDIST_LDD} "${torch_cuda}"
    OUTPUT_VARIABLE deps ERROR_QUIET)
  if(deps MATCHES "libnccl\\.so[.0-9]* => (/[^ \n]+)")
    get_filename_component(lib "${CMAKE_MATCH_1}" ABSOLUTE)  # drops the RUNPATH's ../
    set(${out} "${lib}" PARENT_SCOPE)
  endif()
endfunction()

# The CUDA major.minor a pip torch was built with (TORCH_INSTALL_PREFIX/version.py),
# or "" (Debian's libtorch, a LibTorch zip).
function(batchdist_torch_cuda_version out)
  set(${out} "" PARENT_SCOPE)
  if(EXISTS "${TORCH_INSTALL_PREFIX}/version.py")
    file(STRINGS "${TORCH_INSTALL_PREFIX}/version.py" line REGEX "^cuda.*=")
    if(line MATCHES "'([0-9]+\\.[0-9]+)")
      set(${out} "${CMAKE_MATCH_1}" PARENT_SCOPE)
    endif()
  endif()
endfunction()

# Stops configure when the CUDA toolkit found (TOOLKIT_VERSION, e.g. 13.0.88, in
# BIN_DIR) is of another major.minor than the one Torch was built with: batchdist
# would link the toolkit's libcudart/libnvrtc, which load ahead of the wheel's, and
# libtorch_cuda.so built for the newer one would run on them.
function(batchdist_check_torch_cuda toolkit_version bin_dir)
  batchdist_torch_cuda_version(torch_cuda)
  string(REGEX MATCH "^[0-9]+\\.[0-9]+" toolkit "${toolkit_version}")
  if(NOT torch_cuda OR NOT toolkit OR toolkit STREQUAL torch_cuda)
    return()
  endif()
  message(FATAL_ERROR "batchdist: Torch ${Torch_VERSION} (${TORCH_INSTALL_PREFIX}) was built with CUDA "
    "${torch_cuda}, but the CUDA toolkit found is ${toolkit_version} (${bin_dir}): batchdist would "
    "link its libcudart ${toolkit} and run libtorch_cuda.so on it.\n"
    "  Install the CUDA ${torch_cuda} toolkit and configure a fresh build directory with "
    "-DCUDAToolkit_ROOT=<it> -DCMAKE_CUDA_COMPILER=<it>/bin/nvcc; or run tests/cuda_leg.sh --torch "
    "${Torch_VERSION}, which puts NVIDIA's CUDA ${torch_cuda} pip wheels (nvidia-cuda-nvcc==${torch_cuda}.*) "
    "in its venv and builds with them; or install the torch built for CUDA ${toolkit}. "
    "-DBATCHDIST_ALLOW_CUDA_MISMATCH=ON builds anyway.")
endfunction()
