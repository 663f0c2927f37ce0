// vemesh/comm/nccl/internal/nccl_api.h
//
// The seam between the NCCL backend and the libraries under it: every NCCL
// and CUDA runtime function that nccl_communicator.cc calls is one entry of
// NcclApi, reached through Nccl(). In a program that installs nothing, the
// table is bound to libnccl and libcudart, and a call costs one load of the
// table pointer and one indirect call.
//
//   Nccl().ncclCommSplit(parent, color, key, &child, &config);
//
// A test installs a table of its own for a scope, so that the backend runs
// without a GPU and the test sees every call it makes:
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
// cuda_runtime_api.h, which vemesh's public headers never include. Only in
// builds with NCCL (VEMESH_HAVE_NCCL).

#ifndef VEMESH_COMM_NCCL_INTERNAL_NCCL_API_H_
#define VEMESH_COMM_NCCL_INTERNAL_NCCL_API_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstddef>

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
                                ncclDataType_t type, int root,
                                ncclComm_t comm, cudaStream_t stream);
  ncclResult_t (*ncclReduce)(const void* send, void* recv, size_t count,
                             ncclDataType_t type, ncclRedOp_t op, int root,
                             ncclComm_t comm, cudaStream_t stream);
  ncclResult_t (*ncclAllGather)(const void* send, void* recv, size_t count,
                                ncclDataType_t type, ncclComm_t comm,
                                cudaStream_t stream);
  ncclResult_t (*ncclReduceScatter)(const void* send, void* recv,
                                    size_t count, ncclDataType_t type,
                                    ncclRedOp_t op, ncclComm_t comm,
                                    cudaStream_t stream);
  ncclResult_t (*ncclSend)(const void* send, size_t count,
                           ncclDataType_t type, int peer, ncclComm_t comm,
                           cudaStream_t stream);
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

  // The table bound to the linked libnccl and libcudart.
  static const NcclApi& Real();
};

namespace nccl_internal {
// The table in use; never null. Constant-initialised to the real one, so it
// is valid before any static constructor runs.
extern std::atomic<const NcclApi*> installed;
}  // namespace nccl_internal

// The table every NCCL and CUDA call of the backend goes through.
inline const NcclApi& Nccl() {
  return *nccl_internal::installed.load(std::memory_order_acquire);
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
