#include "vemesh/comm/nccl/internal/cuda_resources.h"

#include <cstdint>

#include "vemesh/comm/nccl/internal/nccl_api.h"
#include "vemesh/comm/nccl/internal/nccl_status.h"

namespace vemesh {

DeviceGuard::DeviceGuard(int device) {
  if (Nccl().cudaGetDevice(&previous_) != cudaSuccess) {
    Nccl().cudaGetLastError();
    previous_ = -1;
  }
  if (previous_ != device) {
    status_ = CudaStatus(Nccl().cudaSetDevice(device), "cudaSetDevice");
    changed_ = status_.ok();
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_ && previous_ >= 0 &&
      Nccl().cudaSetDevice(previous_) != cudaSuccess) {
    Nccl().cudaGetLastError();
  }
}

PreparedDevice PrepareDevice(const CudaDeviceRequest& request,
                             std::optional<DeviceGuard>* guard) {
  PreparedDevice out;
  auto chosen = ChooseCudaDeviceHere(request);
  if (!chosen.ok()) {
    out.status = chosen.status();
    return out;
  }
  out.device = *chosen;
  guard->emplace(out.device);
  out.status = (*guard)->status();
  return out;
}

absl::Status MakeStream(cudaStream_t* stream, void** scratch) {
  absl::Status status = CudaStatus(
      Nccl().cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking),
      "cudaStreamCreateWithFlags");
  if (status.ok()) {
    status =
        CudaStatus(Nccl().cudaMalloc(scratch, sizeof(int32_t)), "cudaMalloc");
  }
  if (status.ok()) {
    status = CudaStatus(Nccl().cudaMemset(*scratch, 0, sizeof(int32_t)),
                        "cudaMemset");
  }
  return status;
}

void FreeStream(cudaStream_t stream, void* scratch) {
  if (scratch != nullptr) Nccl().cudaFree(scratch);
  if (stream != nullptr) Nccl().cudaStreamDestroy(stream);
}

}  // namespace vemesh
