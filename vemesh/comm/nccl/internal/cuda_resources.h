// vemesh/comm/nccl/internal/cuda_resources.h
//
// The CUDA side of an NCCL communicator: its device made current for a
// scope, and the stream and scratch buffer it owns.
//
//   DeviceGuard guard(device_);                 // any thread
//   if (!guard.status().ok()) return guard.status();
//   cudaStream_t stream = nullptr;
//   void* scratch = nullptr;
//   VEMESH_RETURN_IF_ERROR(MakeStream(&stream, &scratch));
//   ...
//   FreeStream(stream, scratch);
//
// Internal to the NCCL backend (needs cuda_runtime_api.h).

#ifndef VEMESH_COMM_NCCL_INTERNAL_CUDA_RESOURCES_H_
#define VEMESH_COMM_NCCL_INTERNAL_CUDA_RESOURCES_H_

#include <cuda_runtime_api.h>

#include <optional>

#include "absl/status/status.h"
#include "vemesh/comm/nccl/cuda_device.h"

namespace vemesh {

// Makes `device` current for a scope and puts the caller's device back:
// abort() and the destructor may run on any thread, which must not find
// its current device changed.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  bool changed_ = false;
  absl::Status status_;
};

// Chooses this rank's device for `request` and makes it current in
// `*guard` (left empty when no device could be chosen). Local only: the
// ranks agree on the outcome before any NCCL call, so that one rank failing
// never leaves the others waiting in an init. Returns the device, -1 when
// none, and the first failure.
struct PreparedDevice {
  int device = -1;
  absl::Status status;
};
PreparedDevice PrepareDevice(const CudaDeviceRequest& request,
                             std::optional<DeviceGuard>* guard);

// Makes this rank's stream and scratch buffer (one zeroed int32: barrier is
// an all_reduce of it) on the current device.
absl::Status MakeStream(cudaStream_t* stream, void** scratch);
// Frees what MakeStream made; null members are skipped.
void FreeStream(cudaStream_t stream, void* scratch);

}  // namespace vemesh

#endif  // VEMESH_COMM_NCCL_INTERNAL_CUDA_RESOURCES_H_
