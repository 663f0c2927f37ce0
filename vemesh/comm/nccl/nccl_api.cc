#include "vemesh/comm/nccl/internal/nccl_api.h"

namespace vemesh {
namespace {

// Bound at link time: the addresses are constants, so the table (and the
// pointer to it below) needs no constructor.
constexpr NcclApi kReal = {
    &::ncclGetVersion,
    &::ncclGetUniqueId,
    &::ncclCommInitRankConfig,
    &::ncclCommSplit,
    &::ncclCommGetAsyncError,
    &::ncclCommAbort,
    &::ncclCommDestroy,
    &::ncclGetErrorString,
    &::ncclGetLastError,
    &::ncclGroupStart,
    &::ncclGroupEnd,
    &::ncclAllReduce,
    &::ncclBroadcast,
    &::ncclReduce,
    &::ncclAllGather,
    &::ncclReduceScatter,
    &::ncclSend,
    &::ncclRecv,
    &::cudaGetDeviceCount,
    &::cudaGetDevice,
    &::cudaSetDevice,
    &::cudaGetLastError,
    &::cudaGetErrorName,
    &::cudaGetErrorString,
    &::cudaStreamCreateWithFlags,
    &::cudaStreamDestroy,
    &::cudaMalloc,
    &::cudaMemset,
    &::cudaFree,
    &::cudaPointerGetAttributes,
    &::cudaEventCreateWithFlags,
    &::cudaEventRecord,
    &::cudaEventQuery,
    &::cudaEventDestroy,
};

}  // namespace

namespace nccl_internal {
constinit std::atomic<const NcclApi*> installed{&kReal};
}  // namespace nccl_internal

const NcclApi& NcclApi::Real() { return kReal; }

ScopedNcclApi::ScopedNcclApi(const NcclApi& api)
    : previous_(nccl_internal::installed.exchange(&api,
                                                  std::memory_order_acq_rel)) {}

ScopedNcclApi::~ScopedNcclApi() {
  nccl_internal::installed.store(previous_, std::memory_order_release);
}

}  // namespace vemesh
