// vemesh/comm/nccl/cuda_device.h
//
// Which CUDA device a rank of a "cuda" mesh binds, decided from what the
// process sees, never from a guess about the machine:
//
//   "cuda:N"                     -> device N (N < the visible devices)
//   "cuda", one visible device   -> device 0: CUDA_VISIBLE_DEVICES leaves
//     and CUDA_VISIBLE_DEVICES set  each task its own GPU (srun
//                                   --gpus-per-task=1, a per-rank mask)
//   "cuda" otherwise             -> the host-local rank (rank k of a host
//                                   takes device k), which must be below the
//                                   visible devices
//
//   DeviceChoiceInput in;
//   in.visible_count = 1;                  // cudaGetDeviceCount
//   in.visible_devices = "3";              // CUDA_VISIBLE_DEVICES
//   in.host_local_rank = 2; in.host_size = 4;
//   ChooseCudaDevice(in);                  // 0
//
// ChooseCudaDevice is pure (the unit tests run it with no GPU); the thin
// real query beside it reads cudaGetDeviceCount through the NCCL seam
// (vemesh/comm/nccl/internal/nccl_api.h: a fake there drives it too) and the
// environment. A device that cannot be had is an error naming both numbers
// and CUDA_VISIBLE_DEVICES' value when it is set: InvalidArgument for an
// index the caller wrote ("cuda:N"), FailedPrecondition when the job puts
// more ranks on a host than it lets each see devices.

#ifndef VEMESH_COMM_NCCL_CUDA_DEVICE_H_
#define VEMESH_COMM_NCCL_CUDA_DEVICE_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace vemesh {

struct DeviceChoiceInput {
  // The devices this process sees (cudaGetDeviceCount, after
  // CUDA_VISIBLE_DEVICES and cgroup masks); at least 1.
  int visible_count = 0;
  // CUDA_VISIBLE_DEVICES, when set (even empty).
  std::optional<std::string> visible_devices;
  // N of "cuda:N"; -1 for plain "cuda" (other negatives are refused).
  int requested = -1;
  // This rank's place on its host (DeviceMesh::host_local_rank) and the
  // number of ranks there.
  int host_local_rank = 0;
  int host_size = 1;
};

// What a caller asks for: "cuda:N" (requested = N) or plain "cuda"
// (requested = -1: the host-local rank's device, or 0 under one device per
// task).
struct CudaDeviceRequest {
  int requested = -1;
  int host_local_rank = 0;
  int host_size = 1;
};

// The device to bind, or why none can be (see the file comment).
absl::StatusOr<int> ChooseCudaDevice(const DeviceChoiceInput& in);

// The same choice for this process: the visible count from
// CudaDeviceCount() (FailedPrecondition "no usable GPU" when CUDA finds
// none or has no driver; Unavailable when libcudart or libnccl cannot be
// loaded; Unimplemented without NCCL support) and
// CUDA_VISIBLE_DEVICES from the environment.
absl::StatusOr<int> ChooseCudaDeviceHere(const CudaDeviceRequest& request);

}  // namespace vemesh

#endif  // VEMESH_COMM_NCCL_CUDA_DEVICE_H_
