// vemesh/comm/reconfigurable_communicator.h
//
// One long-lived communicator whose group is swapped underneath it (torchft's
// `ProcessGroup.configure`): a strategy built once over it keeps working when
// the group's members change, as an elastic mesh's replicate (DP) group does
// at every membership epoch.
//
//   auto dp = std::make_shared<ReconfigurableCommunicator>("DP_REPLICATE",
//                                                          "gloo");
//   absl::Status s = dp->all_reduce(grad, ReduceOp::kSum);
//   // FailedPrecondition: no group configured yet, naming DP_REPLICATE
//   s = dp->configure(epoch_group, epoch_ranks, /*generation=*/1);
//   s = dp->all_reduce(grad, ReduceOp::kSum);  // over epoch_group
//   ... a replica dies ...
//   s = dp->unconfigure(absl::UnavailableError(
//       "DP_REPLICATE is between membership epochs: recover() first"));
//   s = dp->all_reduce(grad, ReduceOp::kSum);  // Unavailable, that text
//   s = dp->configure(smaller_group, smaller_ranks, /*generation=*/2);
//   s = dp->all_reduce(grad, ReduceOp::kSum);  // over dp->size() replicas
//
// Every operation goes to the group configured when it starts (its own
// checks, its own Work); rank(), size() and ranks() answer the current
// configuration, in the global ranks `configure` was given. Strategies that
// hold one (FullyShardedDataParallel's replicate group, the
// DistributedOptimizer's replicate_group) read size() at every step, so a
// group that shrank or grew between steps averages over the replicas that
// are there now.
//
// Between configurations. `unconfigure(why)` lets go of the group and makes
// every later operation fail with `why`'s code and text (prefixed by the
// operation and this communicator's name) without touching any group;
// rank(), size() and ranks() keep answering the last configuration. Before
// the first `configure` operations are FailedPrecondition naming the group,
// and size() is 1 (rank 0, global rank -1: no member is known yet). These
// are answered before the operation's own argument checks, so a missing
// group is what the error says, not a root outside a group of one.
//
// Abort. abort() (a deadline of a blocking operation included) stops the
// current configuration: its inner communicator is aborted and every later
// operation is Aborted, until the next `configure`, which starts afresh
// (torchft's abort-then-configure). A deadline passed to a Work's wait
// aborts only the inner group the operation ran on.
//
// Threads. configure and unconfigure may be called from any thread (the
// elastic mesh's recovery). An operation holds its group (a shared_ptr) for
// its whole duration, so a group swapped or dropped meanwhile by another
// thread stays alive until the operation finished; the dropped group is
// freed outside the lock, by whichever holder lets go last (a Gloo group then
// closes its connections). rank(), size() and ranks() are safe from any
// thread, but only the thread that configures (the training thread, between
// steps) sees them consistent with the operations it starts. A Span from
// ranks() stays valid until the kKeptConfigurations-th configure after the
// one it came from: enough for a step that reads it before a configure and
// uses it after, not to be kept across steps.
//
// The backend is fixed at construction (what backend() answers, e.g. what
// a strategy checks at Create); a configure with a group of another backend
// is InvalidArgument. split answers Unimplemented: split the groups that are
// configured instead.

#ifndef VEMESH_COMM_RECONFIGURABLE_COMMUNICATOR_H_
#define VEMESH_COMM_RECONFIGURABLE_COMMUNICATOR_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "vemesh/comm/communicator.h"

namespace vemesh {

class ReconfigurableCommunicator final : public Communicator {
 public:
  // How many configurations' rank lists are kept alive (see "Threads").
  static constexpr int kKeptConfigurations = 4;

  // `name` is what errors call the group ("DP_REPLICATE"); `backend` is what
  // backend() answers for the whole life of this communicator ("gloo").
  ReconfigurableCommunicator(std::string name, std::string backend);
  ~ReconfigurableCommunicator() override;

  // Swaps in `inner`: later operations go to it. `global_ranks[i]` is the
  // global rank of inner rank i (one per member: its size is inner->size());
  // this rank is inner->rank(). `generation` is the caller's number for the
  // configuration (the elastic mesh's epoch), answered by generation().
  // Clears an abort of the configuration before. InvalidArgument, naming the
  // value, for a null `inner`, a rank list of the wrong length or with a
  // rank twice, or an inner group of another backend; nothing changes then.
  absl::Status configure(std::shared_ptr<Communicator> inner,
                         std::vector<int> global_ranks, int64_t generation);
  // Drops the group (freed outside the lock, once no operation holds it);
  // every later operation fails with `why` until the next configure.
  // InvalidArgument for an OK `why`, with nothing changed.
  absl::Status unconfigure(absl::Status why);

  // The last configure's `generation`; -1 before the first.
  int64_t generation() const;
  // Whether a group is configured now (not before the first configure nor
  // after unconfigure).
  bool configured() const;
  const std::string& name() const { return name_; }

  int rank() const override;
  int size() const override;
  absl::Span<const int> ranks() const override;
  absl::string_view backend() const override { return backend_; }

  // Unimplemented: the configured groups are made by their owner.
  absl::StatusOr<std::shared_ptr<Communicator>> split(int color,
                                                      int key) override;
  // The current group's handle; a null handle between configurations.
  NativeHandle native_handle() const override;

 protected:
  // Every operation goes to the group configured now (its own checks and
  // Work); the Work keeps that group alive whatever another thread does.
  WorkOr Start(const Operation& op) override;
  // Aborts the current group too.
  void OnAbort() override;
  // The not-configured error, before the arguments are checked against a
  // size() that belongs to no group.
  absl::Status CheckUsable(absl::string_view op) const override;

 private:
  // One configuration's view, immutable once published.
  struct View {
    std::vector<int> ranks;
    int rank = 0;
  };

  // The group for one operation, or the error that says why there is none.
  absl::StatusOr<std::shared_ptr<Communicator>> Use(absl::string_view op) const;

  const std::string name_;
  const std::string backend_;
  // The current view, read without the lock; it points into `views_`.
  std::atomic<const View*> view_;
  mutable std::mutex mu_;
  std::deque<std::unique_ptr<const View>> views_;  // newest last; under mu_
  std::shared_ptr<Communicator> inner_;            // under mu_
  absl::Status why_;                               // under mu_
  int64_t generation_ = -1;                        // under mu_
};

}  // namespace vemesh

#endif  // VEMESH_COMM_RECONFIGURABLE_COMMUNICATOR_H_
