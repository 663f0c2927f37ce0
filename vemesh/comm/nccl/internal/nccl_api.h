// vemesh/comm/nccl/internal/nccl_api.h
//
// The seam between the NCCL backend and the libraries under it: every NCCL
// and CUDA runtime function the backend (comm/nccl/*.cc) calls is one entry of
// NcclApi, reached through Nccl(). Entry points check LoadNccl() first, so
// a missing library is a Status, never a crash:
//
//   VEMESH_RETURN_IF_ERROR(LoadNccl().status());  // Unavailable: missing
//   Nccl().ncclCommSplit(parent, color, key, &child, &config);
//
// Nothing links libnccl or libcudart: one build of vemesh serves CPU-only
// and GPU hosts (as cupy and nccl4py do), and a program that never asks
// for a GPU never loads either. In a program that installs nothing, the table
// is the real one, bound with dlopen/dlsym once, thread-safely, at the first
// use (the first "cuda" mesh, CudaDeviceCount()):
//
//   libnccl.so.2                     or the path in VEMESH_NCCL_LIBRARY
//   libcudart.so.<CUDA major of the headers built against> (13), then
//   libcudart.so                     or the path in VEMESH_CUDART_LIBRARY
//
// Bare names are searched as the dynamic loader does (LD_LIBRARY_PATH,
// ld.so.cache, the runpath); a variable's value is used as given, without
// fallback, and is read once, at the first use. When a library or one of
// its symbols is missing, LoadNccl() is Unavailable naming the library, the
// symbol, dlerror()'s text and what to do, and so is every entry point
// that needs the backend (the table's entries then answer
// ncclSystemError / cudaErrorSharedObjectInitFailed instead of crashing).
// After loading, a call costs one load of the table pointer, a branch, and
// one indirect call.
//
// A test installs a table of its own for a scope, so that the backend runs
// without a GPU, or without the libraries at all, and sees every call:
//
//   NcclApi fake = NcclApi::Real();        // start from the real one
//   fake.ncclCommSplit = &RecordSplit;     // replace what the test watches
//   ScopedNcclApi installed(fake);         // until the end of the scope
//
// The entries keep the names of the functions they stand for, so a reader
// who searches for `ncclCommSplit` finds the call. Entries are plain function
// pointers (no state): a fake keeps its state in its own globals.
//
// Internal to the library and its tests: it needs nccl.h and
// cuda_runtime_api.h (headers only), which vemesh's public headers never
// include. Only in builds that found them (VEMESH_HAVE_NCCL).

#ifndef VEMESH_COMM_NCCL_INTERNAL_NCCL_API_H_
#define VEMESH_COMM_NCCL_INTERNAL_NCCL_API_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstddef>

#include "absl/status/statusor.h"

// ncclCommShrink's flags, for headers older than 2.27 too.
#if defined(NCCL_SHRINK_ABORT)
#define VEMESH_NCCL_SHRINK_DEFAULT NCCL_SHRINK_DEFAULT
#define VEMESH_NCCL_SHRINK_ABORT NCCL_SHRINK_ABORT
#else
#define VEMESH_NCCL_SHRINK_DEFAULT 0x00
#define VEMESH_NCCL_SHRINK_ABORT 0x01
#endif

namespace vemesh {

struct NcclApi {
  // -- NCCL: communicators ----------------------------------------------------
  ncclResult_t (*ncclGetVersion)(int* version);
  ncclResult_t (*ncclGetUniqueId)(ncclUniqueId* id);
  ncclResult_t (*ncclCommInitRankConfig)(ncclComm_t* comm, int nranks,
                                         ncclUniqueId id, int rank,
                                         ncclConfig_t* config);
  ncclResult_t (*ncclCommSplit)(ncclComm_t comm, int color, int key,
                                ncclComm_t* newcomm, ncclConfig_t* config);
  // NCCL >= 2.27 (headers and library); where either is older the entry
  // answers ncclInvalidUsage and LoadNccl() does not fail for it.
  ncclResult_t (*ncclCommShrink)(ncclComm_t comm, int* exclude_ranks,
                                 int exclude_count, ncclComm_t* newcomm,
                                 ncclConfig_t* config, int shrink_flags);
  ncclResult_t (*ncclCommGetAsyncError)(ncclComm_t comm,
                                        ncclResult_t* async_error);
  ncclResult_t (*ncclCommAbort)(ncclComm_t comm);
  ncclResult_t (*ncclCommDestroy)(ncclComm_t comm);
  const char* (*ncclGetErrorString)(ncclResult_t result);
  const char* (*ncclGetLastError)(ncclComm_t comm);
  // -- NCCL: groups and operations --------------------------------------------
  ncclResult_t (*ncclGroupStart)();
  ncclResult_t (*ncclGroupEnd)();
  ncclResult_t (*ncclAllReduce)(const void* send, void* recv, size_t count,
                                ncclDataType_t type, ncclRedOp_t op,
                                ncclComm_t comm, cudaStream_t stream);
  ncclResult_t (*ncclBroadcast)(const void* send, void* recv, size_t count,
                                ncclDataType_t type, int root, ncclComm_t comm,
                                cudaStream_t stream);
  ncclResult_t (*ncclReduce)(const void* send, void* recv, size_t count,
                             ncclDataType_t type, ncclRedOp_t op, int root,
                             ncclComm_t comm, cudaStream_t stream);
  ncclResult_t (*ncclAllGather)(const void* send, void* recv, size_t count,
                                ncclDataType_t type, ncclComm_t comm,
                                cudaStream_t stream);
  ncclResult_t (*ncclReduceScatter)(const void* send, void* recv, size_t count,
                                    ncclDataType_t type, ncclRedOp_t op,
                                    ncclComm_t comm, cudaStream_t stream);
  ncclResult_t (*ncclSend)(const void* send, size_t count, ncclDataType_t type,
                           int peer, ncclComm_t comm, cudaStream_t stream);
  ncclResult_t (*ncclRecv)(void* recv, size_t count, ncclDataType_t type,
                           int peer, ncclComm_t comm, cudaStream_t stream);
  // -- CUDA runtime -----------------------------------------------------------
  cudaError_t (*cudaGetDeviceCount)(int* count);
  cudaError_t (*cudaGetDevice)(int* device);
  cudaError_t (*cudaSetDevice)(int device);
  cudaError_t (*cudaGetLastError)();
  const char* (*cudaGetErrorName)(cudaError_t error);
  const char* (*cudaGetErrorString)(cudaError_t error);
  cudaError_t (*cudaStreamCreateWithFlags)(cudaStream_t* stream,
                                           unsigned int flags);
  cudaError_t (*cudaStreamDestroy)(cudaStream_t stream);
  cudaError_t (*cudaMalloc)(void** pointer, size_t size);
  cudaError_t (*cudaMemset)(void* pointer, int value, size_t count);
  cudaError_t (*cudaFree)(void* pointer);
  cudaError_t (*cudaPointerGetAttributes)(cudaPointerAttributes* attributes,
                                          const void* pointer);
  cudaError_t (*cudaEventCreateWithFlags)(cudaEvent_t* event,
                                          unsigned int flags);
  cudaError_t (*cudaEventRecord)(cudaEvent_t event, cudaStream_t stream);
  cudaError_t (*cudaEventQuery)(cudaEvent_t event);
  cudaError_t (*cudaEventDestroy)(cudaEvent_t event);

  // The table bound to libnccl and libcudart, loaded at the first call
  // (see the file comment). Always complete: an entry the loader could not
  // bind answers an error; LoadNccl() says why.
  static const NcclApi& Real();
};

// The table in use, ready for calls: the installed one when a test
// installed one, else the real one, loaded at the first call. Unavailable
// when a library or a symbol of the real one is missing (see the file
// comment).
absl::StatusOr<const NcclApi*> LoadNccl();

namespace nccl_internal {
// The table a test installed; null for the real one. Constant-initialised,
// so it is valid before any static constructor runs.
extern std::atomic<const NcclApi*> installed;
}  // namespace nccl_internal

// The table every NCCL and CUDA call of the backend goes through.
inline const NcclApi& Nccl() {
  const NcclApi* api = nccl_internal::installed.load(std::memory_order_acquire);
  return api != nullptr ? *api : NcclApi::Real();
}

// Whether the headers built against and the library in use (Nccl()) are
// NCCL 2.27 or newer: grouped splits and aborts, ncclCommShrink.
inline bool NcclAtLeast227() {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  int version = 0;
  return Nccl().ncclGetVersion(&version) == ncclSuccess &&
         version >= NCCL_VERSION(2, 27, 0);
#else
  return false;
#endif
}

// Installs `api` (which must outlive the scope) for the life of this object,
// then puts back the table that was there. For tests: install before the
// backend makes its first communicator and keep it until the last one is
// freed (a communicator made with one table and freed with another would
// hand a fake handle to the real library, or the reverse). Scopes nest;
// not for concurrent use from several threads.
class ScopedNcclApi {
 public:
  explicit ScopedNcclApi(const NcclApi& api);
  ~ScopedNcclApi();
  ScopedNcclApi(const ScopedNcclApi&) = delete;
  ScopedNcclApi& operator=(const ScopedNcclApi&) = delete;

 private:
  const NcclApi* previous_;
};

}  // namespace vemesh

#endif  // VEMESH_COMM_NCCL_INTERNAL_NCCL_API_H_
