#include "vemesh/elastic/epoch_communicator.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/backend.h"
#include "vemesh/comm/forwarded_work.h"
#include "vemesh/comm/work.h"

namespace vemesh {

EpochCommunicator::EpochCommunicator(
    std::shared_ptr<Communicator> inner, std::vector<int> global_ranks,
    int64_t epoch, std::shared_ptr<const std::atomic<int64_t>> current_epoch)
    : ranks_(std::move(global_ranks)),
      rank_(inner->rank()),
      epoch_(epoch),
      backend_(inner->backend()),
      current_epoch_(std::move(current_epoch)),
      inner_(std::move(inner)) {}

void EpochCommunicator::retire() {
  std::shared_ptr<Communicator> last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = std::move(inner_);
  }
  // Freed here, outside the lock (a Gloo group closes its connections).
}

bool EpochCommunicator::retired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return inner_ == nullptr;
}

absl::StatusOr<std::shared_ptr<Communicator>> EpochCommunicator::Use(
    absl::string_view op) const {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t current = current_epoch_->load(std::memory_order_acquire);
  if (inner_ == nullptr || current != epoch_) {
    return absl::FailedPreconditionError(absl::StrCat(
        op, " on a communicator of stale mesh epoch ", epoch_, ", current ",
        current, ": ask VESCALE_DEVICE_MESH for the current group"));
  }
  return inner_;
}

Communicator::WorkOr EpochCommunicator::Start(const Operation& op) {
  started_.fetch_add(1, std::memory_order_relaxed);
  VEMESH_ASSIGN_OR_RETURN(auto c, Use(op.Name()));
  return StartForwarded(Self(), *c, op);
}

void EpochCommunicator::OnAbort() {
  std::shared_ptr<Communicator> c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    c = inner_;
  }
  // One call for one communicator still goes through AbortCommunicators:
  // an NCCL one is then released inside ncclGroupStart/ncclGroupEnd.
  if (c != nullptr) {
    AbortCommunicators({c}, "its elastic epoch communicator was aborted");
  }
}

absl::StatusOr<std::shared_ptr<Communicator>> EpochCommunicator::split(int,
                                                                       int) {
  return absl::UnimplementedError(absl::StrCat(
      "split of an elastic mesh's group (epoch ", epoch_,
      "): its groups are rebuilt per epoch by the mesh; split the replica's "
      "own communicators instead"));
}

NativeHandle EpochCommunicator::native_handle() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (inner_ == nullptr) return NativeHandle{backend_, nullptr};
  return inner_->native_handle();
}

}  // namespace vemesh
