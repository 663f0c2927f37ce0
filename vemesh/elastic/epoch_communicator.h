// vemesh/elastic/epoch_communicator.h
//
// The communicator an elastic mesh hands out for one membership epoch: a
// group of the replica's own launch (PP, TP: unchanged across epochs) or the
// epoch's replica group (DP, rebuilt every epoch), seen through the global
// ranks of that epoch's mesh.
//
//   std::shared_ptr<Communicator> dp = VESCALE_DEVICE_MESH
//       .get_data_parallel_dim_groups().value();   // epoch 3's DP group
//   ... a replica dies; the mesh recovers into epoch 4 ...
//   dp->all_reduce(...);   // FailedPrecondition "stale mesh epoch 3,
//                          // current 4": ask the registry again
//
// Two reasons it exists: a group of the replica's launch knows only the
// ranks of that launch, while a mesh spanning every replica numbers ranks
// globally (the pipeline runner finds its stage peer by global rank); and a
// handle kept across a membership change must fail loudly instead of
// talking to a group that no longer matches the mesh (the DP ranks moved).
//
// `retire()` makes every later operation fail and lets go of the inner
// communicator (a Gloo group closes its connections, which releases a peer
// still blocked on it), once no operation of this process is in flight on
// it. The elastic mesh retires every communicator of an epoch when it
// leaves that epoch (an NCCL one it aborts first: NCCL's rule).
//
// Over an NCCL communicator (an elastic cuda mesh's DP group) an operation
// is bounded by this communicator's timeout (`set_timeout`, the elastic
// mesh's op_timeout), and its abort, by a deadline or by `abort()`, is one
// ncclCommAbort inside ncclGroupStart/ncclGroupEnd (AbortCommunicators).

#ifndef VEMESH_ELASTIC_EPOCH_COMMUNICATOR_H_
#define VEMESH_ELASTIC_EPOCH_COMMUNICATOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "vemesh/comm/communicator.h"

namespace vemesh {

class EpochCommunicator final : public Communicator {
 public:
  // `global_ranks[i]` is the mesh's global rank of inner rank i.
  // `current_epoch` is the elastic mesh's epoch, shared by every
  // communicator it made, so a stale one can name the current epoch.
  EpochCommunicator(std::shared_ptr<Communicator> inner,
                    std::vector<int> global_ranks, int64_t epoch,
                    std::shared_ptr<const std::atomic<int64_t>> current_epoch);

  int64_t epoch() const { return epoch_; }
  // Irreversible: every later operation is FailedPrecondition.
  void retire();
  bool retired() const;
  // Operations started on this communicator (any thread): the elastic mesh
  // reads whether a step ran one over its DP group, whose success then
  // stands for the step's agreement over DP (ElasticMesh::end_step).
  int64_t started() const { return started_.load(std::memory_order_relaxed); }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  absl::Span<const int> ranks() const override { return ranks_; }
  absl::string_view backend() const override { return backend_; }

  // An epoch's groups are made by the elastic mesh only.
  absl::StatusOr<std::shared_ptr<Communicator>> split(int color,
                                                      int key) override;
  NativeHandle native_handle() const override;

 protected:
  // Every operation goes to the inner communicator (its own checks and
  // Work); the Work keeps it alive even if another thread retires it.
  WorkOr Start(const Operation& op) override;
  // Aborts the inner communicator too.
  void OnAbort() override;

 private:
  // The inner communicator for one operation, or the stale-epoch error.
  // The copy keeps it alive through the operation even if another thread
  // retires it meanwhile.
  absl::StatusOr<std::shared_ptr<Communicator>> Use(absl::string_view op) const;

  const std::vector<int> ranks_;
  const int rank_;
  const int64_t epoch_;
  const std::string backend_;
  const std::shared_ptr<const std::atomic<int64_t>> current_epoch_;
  mutable std::mutex mu_;
  std::shared_ptr<Communicator> inner_;  // null once retired; under mu_
  std::atomic<int64_t> started_{0};
};

}  // namespace vemesh

#endif  // VEMESH_ELASTIC_EPOCH_COMMUNICATOR_H_
