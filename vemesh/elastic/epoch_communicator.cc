#include "vemesh/elastic/epoch_communicator.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "vemesh/status_macros.h"

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

absl::Status EpochCommunicator::barrier() {
  VEMESH_ASSIGN_OR_RETURN(auto c, Use("barrier"));
  return c->barrier();
}

absl::Status EpochCommunicator::broadcast(void* data, size_t count,
                                          DataType type, int root) {
  VEMESH_ASSIGN_OR_RETURN(auto c, Use("broadcast"));
  return c->broadcast(data, count, type, root);
}

absl::Status EpochCommunicator::all_reduce(const void* send, void* recv,
                                           size_t count, DataType type,
                                           ReduceOp op) {
  VEMESH_ASSIGN_OR_RETURN(auto c, Use("all_reduce"));
  return c->all_reduce(send, recv, count, type, op);
}

absl::Status EpochCommunicator::all_gather(const void* send, void* recv,
                                           size_t count, DataType type) {
  VEMESH_ASSIGN_OR_RETURN(auto c, Use("all_gather"));
  return c->all_gather(send, recv, count, type);
}

absl::Status EpochCommunicator::reduce_scatter(const void* send, void* recv,
                                               size_t count, DataType type,
                                               ReduceOp op) {
  VEMESH_ASSIGN_OR_RETURN(auto c, Use("reduce_scatter"));
  return c->reduce_scatter(send, recv, count, type, op);
}

absl::Status EpochCommunicator::send(const void* data, size_t count,
                                     DataType type, int peer) {
  VEMESH_ASSIGN_OR_RETURN(auto c, Use("send"));
  return c->send(data, count, type, peer);
}

absl::Status EpochCommunicator::recv(void* data, size_t count, DataType type,
                                     int peer) {
  VEMESH_ASSIGN_OR_RETURN(auto c, Use("recv"));
  return c->recv(data, count, type, peer);
}

absl::Status EpochCommunicator::send_recv(const void* send_data,
                                          size_t send_count, int dest,
                                          void* recv_data, size_t recv_count,
                                          int source, DataType type) {
  VEMESH_ASSIGN_OR_RETURN(auto c, Use("send_recv"));
  return c->send_recv(send_data, send_count, dest, recv_data, recv_count,
                      source, type);
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
