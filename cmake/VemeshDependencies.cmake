# Finds what vemesh builds on. All of it comes from Debian (scripts/setup.sh);
# CUDA's and NCCL's headers are optional and looked for under /usr/local/cuda.
find_package(absl REQUIRED)
if(VEMESH_WITH_MPI)
  set(MPI_CXX_SKIP_MPICXX ON)
  find_package(MPI REQUIRED COMPONENTS CXX)
else()
  message(STATUS "vemesh: MPI backend and bootstrap OFF (VEMESH_WITH_MPI=OFF)")
endif()
find_package(Threads REQUIRED)
# Gloo (Debian libgloo-dev, TCP transport): the CPU backend of env:// jobs.
if(VEMESH_WITH_GLOO)
  find_package(Gloo REQUIRED)
else()
  message(STATUS "vemesh: Gloo backend OFF (VEMESH_WITH_GLOO=OFF)")
endif()
# hiredis (Debian libhiredis-dev): the client of RedisStore, the control
# plane of elastic jobs. Debian ships no CMake config for it, only a .pc.
# nlohmann/json (Debian nlohmann-json3-dev, header-only): Placement::FromJson
# reads a placement back; the `vemesh` tool renders its JSON with it.
find_package(nlohmann_json 3.2 REQUIRED)
if(VEMESH_WITH_REDIS)
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)
else()
  message(STATUS "vemesh: RedisStore OFF (VEMESH_WITH_REDIS=OFF)")
endif()

# The NCCL backend builds on NCCL's and the CUDA runtime's headers alone:
# libvemesh loads libnccl and libcudart with dlopen at the first use
# (vemesh/comm/nccl/internal/nccl_api.h), so one build serves CPU-only and
# GPU hosts and no consumer links them. VEMESH_HAVE_NCCL: the headers were
# found; VEMESH_NCCL_INCLUDE_DIRS: where.
set(VEMESH_HAVE_NCCL OFF)
if(NOT VEMESH_WITH_NCCL STREQUAL "OFF")
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_path(CUDART_INCLUDE_DIR cuda_runtime_api.h
            HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  if(NCCL_INCLUDE_DIR AND CUDART_INCLUDE_DIR)
    set(VEMESH_HAVE_NCCL ON)
    set(VEMESH_NCCL_INCLUDE_DIRS ${NCCL_INCLUDE_DIR} ${CUDART_INCLUDE_DIR})
    list(REMOVE_DUPLICATES VEMESH_NCCL_INCLUDE_DIRS)
    message(STATUS "vemesh: NCCL backend ON (headers in ${VEMESH_NCCL_INCLUDE_DIRS}; "
                   "libnccl and libcudart are loaded at run time)")
  elseif(VEMESH_WITH_NCCL STREQUAL "ON")
    message(FATAL_ERROR "VEMESH_WITH_NCCL=ON but nccl.h and cuda_runtime_api.h "
                        "were not found under /usr/local/cuda/include (set CUDAToolkit_ROOT)")
  else()
    message(STATUS "vemesh: NCCL backend OFF (nccl.h or cuda_runtime_api.h not found)")
  endif()
  # Only for the in-tree programs that call CUDA or NCCL themselves (a GPU
  # test's cudaMalloc, a benchmark's raw ncclAllReduce): libvemesh never
  # links these.
  find_library(NCCL_LIBRARY nccl
               HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib /usr/local/cuda/lib64)
endif()

# Multi-rank tests and tools run under this launcher.
set(VEMESH_MPIEXEC ${MPIEXEC_EXECUTABLE})
