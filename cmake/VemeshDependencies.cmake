# Finds what vemesh builds on. All of it comes from Debian (scripts/setup.sh);
# CUDA and NCCL are optional and looked for under /usr/local/cuda.
find_package(absl REQUIRED)
set(MPI_CXX_SKIP_MPICXX ON)
find_package(MPI REQUIRED COMPONENTS CXX)
find_package(Threads REQUIRED)
# Gloo (Debian libgloo-dev, TCP transport): the CPU backend of env:// jobs.
find_package(Gloo REQUIRED)
# hiredis (Debian libhiredis-dev): the client of RedisStore, the control
# plane of elastic jobs. Debian ships no CMake config for it, only a .pc.
# nlohmann/json (Debian nlohmann-json3-dev, header-only): Placement::FromJson
# reads a placement back; the `vemesh` tool renders its JSON with it.
find_package(nlohmann_json 3.2 REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)

set(VEMESH_HAVE_NCCL OFF)
if(NOT VEMESH_WITH_NCCL STREQUAL "OFF")
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(CUDAToolkit_FOUND AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(VEMESH_HAVE_NCCL ON)
    message(STATUS "vemesh: NCCL backend ON (${NCCL_LIBRARY}, CUDA ${CUDAToolkit_VERSION})")
  elseif(VEMESH_WITH_NCCL STREQUAL "ON")
    message(FATAL_ERROR "VEMESH_WITH_NCCL=ON but CUDA/NCCL were not found under /usr/local/cuda")
  else()
    message(STATUS "vemesh: NCCL backend OFF (CUDA or NCCL not found)")
  endif()
endif()

# Multi-rank tests and tools run under this launcher.
set(VEMESH_MPIEXEC ${MPIEXEC_EXECUTABLE})
