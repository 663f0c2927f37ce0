// vemesh/comm/nccl/internal/nccl_status.h
//
// CUDA's and NCCL's return codes as absl::Status, one rule for the whole
// NCCL backend:
//
//   VEMESH_RETURN_IF_ERROR(NcclStatus(Nccl().ncclGroupEnd(), "ncclGroupEnd"));
//   VEMESH_RETURN_IF_ERROR(CudaStatus(Nccl().cudaSetDevice(d),
//   "cudaSetDevice"));
//
// NCCL: ncclRemoteError and ncclSystemError are Unavailable (a lost peer, a
// socket), ncclInvalidArgument and ncclInvalidUsage InvalidArgument,
// anything else Internal with NCCL's message; ncclInProgress is OK (the
// caller polls it to the end). CUDA: "no device" is FailedPrecondition,
// anything else Internal. Internal to the NCCL backend (needs nccl.h).

#ifndef VEMESH_COMM_NCCL_INTERNAL_NCCL_STATUS_H_
#define VEMESH_COMM_NCCL_INTERNAL_NCCL_STATUS_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace vemesh {

// CUDA's answers when this process has no usable GPU (no device, a driver
// too old for the runtime, a device number that does not exist).
bool IsNoDevice(cudaError_t code);

// OK for cudaSuccess; otherwise "<call> failed: <name>: <text>" (and CUDA's
// non-sticky error cleared, so that later calls start clean).
absl::Status CudaStatus(cudaError_t code, absl::string_view call);

// OK for ncclSuccess and ncclInProgress; otherwise "<call> failed: <NCCL's
// text>: <NCCL's last error>".
absl::Status NcclStatus(ncclResult_t code, absl::string_view call);

}  // namespace vemesh

#endif  // VEMESH_COMM_NCCL_INTERNAL_NCCL_STATUS_H_
