#include "vemesh/comm/nccl/cuda_device.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "vemesh/comm/nccl/nccl_communicator.h"

namespace vemesh {
namespace {

// " (CUDA_VISIBLE_DEVICES=...)" when it is set: the first thing to look at
// when a process sees fewer devices than the machine has.
std::string VisibleNote(const DeviceChoiceInput& in) {
  if (!in.visible_devices.has_value())
    return " (CUDA_VISIBLE_DEVICES is not set)";
  return absl::StrCat(" (CUDA_VISIBLE_DEVICES='", *in.visible_devices, "')");
}

}  // namespace

absl::StatusOr<int> ChooseCudaDevice(const DeviceChoiceInput& in) {
  if (in.visible_count < 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("no usable GPU: this process sees ", in.visible_count,
                     " CUDA devices", VisibleNote(in)));
  }
  if (in.requested < -1) {
    return absl::InvalidArgumentError(
        "a negative CUDA device index: expected cuda:N with N >= 0");
  }
  if (in.requested >= 0) {
    if (in.requested < in.visible_count) return in.requested;
    return absl::InvalidArgumentError(absl::StrCat(
        "device 'cuda:", in.requested, "' does not exist: this process sees ",
        in.visible_count, " CUDA device(s)", VisibleNote(in),
        ", so expected cuda:0 to cuda:", in.visible_count - 1));
  }
  if (in.host_size < 1 || in.host_local_rank < 0 ||
      in.host_local_rank >= in.host_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("host-local rank ", in.host_local_rank, " of a host of ",
                     in.host_size, " ranks: expected 0 <= rank < size"));
  }
  // One device per task: the launcher (or the program) gave each rank its
  // own GPU and hid the others, so every rank's device is its device 0.
  if (in.visible_count == 1 && in.visible_devices.has_value()) return 0;
  if (in.host_local_rank < in.visible_count) return in.host_local_rank;
  return absl::FailedPreconditionError(absl::StrCat(
      "host-local rank ", in.host_local_rank, " (of ", in.host_size,
      " ranks on this host) binds CUDA device ", in.host_local_rank,
      ", but this process sees only ", in.visible_count, " device(s)",
      VisibleNote(in), ": start at most ", in.visible_count,
      " ranks per host, give each task its own GPU (srun --gpus-per-task=1), "
      "or pass 'cuda:N'"));
}

absl::StatusOr<int> ChooseCudaDeviceHere(const CudaDeviceRequest& request) {
  DeviceChoiceInput in;
  auto count = CudaDeviceCount();
  if (!count.ok()) return count.status();
  in.visible_count = *count;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"))
    in.visible_devices = v;
  in.requested = request.requested;
  in.host_local_rank = request.host_local_rank;
  in.host_size = request.host_size;
  return ChooseCudaDevice(in);
}

}  // namespace vemesh
