#include "vemesh/comm/nccl/internal/nccl_status.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "vemesh/comm/nccl/internal/nccl_api.h"

namespace vemesh {

bool IsNoDevice(cudaError_t code) {
  return code == cudaErrorNoDevice || code == cudaErrorInsufficientDriver ||
         code == cudaErrorInvalidDevice;
}

absl::Status CudaStatus(cudaError_t code, absl::string_view call) {
  if (code == cudaSuccess) return absl::OkStatus();
  Nccl().cudaGetLastError();  // clear a non-sticky error so later calls start
                              // clean
  std::string text =
      absl::StrCat(call, " failed: ", Nccl().cudaGetErrorName(code), ": ",
                   Nccl().cudaGetErrorString(code));
  return IsNoDevice(code) ? absl::FailedPreconditionError(text)
                          : absl::InternalError(text);
}

// ncclInProgress is not an error here: the caller polls it to the end.
absl::Status NcclStatus(ncclResult_t code, absl::string_view call) {
  if (code == ncclSuccess || code == ncclInProgress) return absl::OkStatus();
  // The argument of ncclGetLastError is unused (NCCL's documentation); null
  // also keeps it safe after an abort freed the communicator.
  const char* last = Nccl().ncclGetLastError(nullptr);
  std::string text =
      absl::StrCat(call, " failed: ", Nccl().ncclGetErrorString(code),
                   last != nullptr && *last != '\0' ? ": " : "",
                   last != nullptr ? last : "");
  switch (code) {
    case ncclRemoteError:  // a peer exited or the network failed
    case ncclSystemError:  // a socket or other system call failed
      return absl::UnavailableError(text);
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(text);
    default:
      return absl::InternalError(text);
  }
}

}  // namespace vemesh
