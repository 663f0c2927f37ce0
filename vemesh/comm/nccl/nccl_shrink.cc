// Aborting NCCL communicators together (one NCCL group of ncclCommAbort)
// and shrinking one (ncclCommShrink, or a rebuild over the shrunk twin):
// NCCL's rules of 2.27+, see nccl_communicator.h.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "vemesh/base/log.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/nccl/internal/cuda_resources.h"
#include "vemesh/comm/nccl/internal/nccl_api.h"
#include "vemesh/comm/nccl/internal/nccl_poll.h"
#include "vemesh/comm/nccl/internal/nccl_status.h"
#include "vemesh/comm/nccl/nccl_communicator.h"

namespace vemesh {

void NcclCommunicator::OnAbortMany(
    absl::Span<Communicator* const> same_backend) {
  // Every one is an NcclCommunicator (AbortCommunicators groups by backend).
  std::vector<NcclCommunicator*> comms;
  for (Communicator* c : same_backend) {
    comms.push_back(static_cast<NcclCommunicator*>(c));
  }
  // Locked in one order, so two concurrent calls cannot deadlock.
  std::sort(comms.begin(), comms.end(), std::less<NcclCommunicator*>());
  std::vector<std::unique_lock<std::mutex>> locks;
  locks.reserve(comms.size());
  for (NcclCommunicator* c : comms) {
    c->lineage_aborted_->store(true, std::memory_order_release);
    locks.emplace_back(c->comm_mu_);
  }
  DeviceGuard guard(device_);
  const bool grouped = NcclAtLeast227();
  if (grouped) Nccl().ncclGroupStart();
  for (NcclCommunicator* c : comms) {
    if (c->comm_ == nullptr) continue;
    const ncclResult_t code = Nccl().ncclCommAbort(c->comm_);
    c->comm_ = nullptr;
    if (code != ncclSuccess && code != ncclInProgress) {
      LogWarning(absl::StrCat("ncclCommAbort failed: ",
                              Nccl().ncclGetErrorString(code)));
    }
  }
  if (grouped) {
    const ncclResult_t code = Nccl().ncclGroupEnd();
    if (code != ncclSuccess && code != ncclInProgress) {
      LogWarning(absl::StrCat("ncclGroupEnd after ncclCommAbort failed: ",
                              Nccl().ncclGetErrorString(code)));
    }
  }
}

absl::StatusOr<std::shared_ptr<Communicator>> NcclCommunicator::Shrink(
    absl::Span<const int> exclude, const ShrinkOptions& options) {
  // The host side first, on every survivor: the new twin answers ranks()
  // and carries a rebuild's unique id.
  auto twin = twin_->shrink(exclude, options);
  if (!twin.ok()) {
    return absl::Status(
        twin.status().code(),
        absl::StrCat("shrink of the host twin: ", twin.status().message()));
  }
  const bool abort_in_flight =
      options.abort_in_flight || in_flight_.load(std::memory_order_acquire) > 0;
  DeviceGuard guard(device_);
  if (!guard.status().ok()) return guard.status();
  ncclComm_t child = nullptr;
  ncclConfig_t config = NonBlockingConfig();
  std::vector<int> excluded(exclude.begin(), exclude.end());
  bool derived = false;
  absl::Status status;
  if (NcclAtLeast227()) {
    std::lock_guard<std::mutex> lock(comm_mu_);
    if (comm_ != nullptr) {
      derived = true;
      status =
          NcclStatus(Nccl().ncclCommShrink(
                         comm_, excluded.empty() ? nullptr : excluded.data(),
                         static_cast<int>(excluded.size()), &child, &config,
                         abort_in_flight ? VEMESH_NCCL_SHRINK_ABORT
                                         : VEMESH_NCCL_SHRINK_DEFAULT),
                     "ncclCommShrink");
    }
  }
  if (!derived) {
    // Aborted (ncclCommAbort freed it) or an NCCL without ncclCommShrink:
    // a new communicator of the survivors over the shrunk twin.
    VEMESH_ASSIGN_OR_RETURN(auto rebuilt,
                            Create(*std::move(twin), device_, options_));
    return std::shared_ptr<Communicator>(std::move(rebuilt));
  }
  if (status.ok()) {
    status = AwaitReady(child, "ncclCommShrink", DeadlineAfter(timeout()));
  }
  cudaStream_t stream = nullptr;
  void* scratch = nullptr;
  if (status.ok()) status = MakeStream(&stream, &scratch);
  if (!status.ok()) {
    if (child != nullptr) Nccl().ncclCommAbort(child);
    FreeStream(stream, scratch);
    return status;
  }
  // The excluded peers may be gone: never ncclCommDestroy the parent or
  // anything of its lineage (the world, the other dimensions). The child
  // starts a lineage of its own.
  lineage_aborted_->store(true, std::memory_order_release);
  if (abort_in_flight) {
    // Its operations were terminated: it is aborted for every holder (and
    // released now, by ncclCommAbort).
    abort("ncclCommShrink with NCCL_SHRINK_ABORT ended its operations");
  }
  return std::shared_ptr<Communicator>(new NcclCommunicator(
      *std::move(twin), device_, options_, child, stream, scratch));
}

}  // namespace vemesh
