// vemesh/bootstrap/store_bootstrap.h
//
// The Bootstrap of jobs started the PyTorch way (torchrun, env://,
// Kubernetes' PyTorchJob, hand-written Slurm scripts): every rank knows its
// RANK and WORLD_SIZE and reaches one Store (a TcpStore hosted by rank 0 at
// MASTER_ADDR:MASTER_PORT, or any other Store). Host-memory worlds are Gloo
// communicators that rendezvous through the same store, lazily: world()
// connects no pairs until the world's first operation or split
// (GlooCommunicator::CreateLazy), so a mesh whose groups connect among their
// members (GlooCommunicator::subgroup) leaves no rank a socket per world
// member.
//
//   auto store = ...;                                  // every rank: the same
//   auto boot = std::make_shared<StoreBootstrap>(store, rank, size, "job");
//   auto all = boot->all_gather("x", absl::Now() + absl::Seconds(5));
//
// all_gather, round n: every rank sets `<prefix>/ag/<n>/<rank>`; rank 0
// waits for all of them and proposes the combined list as the round's
// verdict; a rank whose deadline passes first proposes a failure instead.
// The verdict key is written once, by compare-and-set, so exactly one
// proposal wins and every rank - a late one too - reads the same outcome:
// all get the list, or all get DeadlineExceeded naming the ranks that never
// arrived. Ranks other than 0 wait a grace period past their deadline for
// rank 0's proposal before proposing failure themselves, so that a slow
// store round trip does not turn a complete round into a failed one.
// Each rank acknowledges the verdict once read, and rank 0 - whose process
// hosts the store under env:// - returns only after the ranks that arrived
// did (bounded), so that a job failing right after a round does not take
// the store away from ranks still reading its outcome.

#ifndef VEMESH_BOOTSTRAP_STORE_BOOTSTRAP_H_
#define VEMESH_BOOTSTRAP_STORE_BOOTSTRAP_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "vemesh/bootstrap/bootstrap.h"
#include "vemesh/rendezvous/store.h"

namespace vemesh {

class StoreBootstrap final : public Bootstrap {
 public:
  // `prefix` namespaces every key this bootstrap writes; `gloo_host` is the
  // address peers reach this rank's Gloo connections at.
  StoreBootstrap(std::shared_ptr<Store> store, int rank, int size,
                 std::string prefix, std::string reason = "a Store",
                 std::string gloo_host = "127.0.0.1");

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::string_view kind() const override { return "store"; }
  std::string reason() const override { return reason_; }

  absl::StatusOr<std::vector<std::string>> all_gather(
      absl::string_view data, absl::Time deadline) override;
  std::shared_ptr<Store> store() const override { return store_; }
  absl::StatusOr<std::shared_ptr<Communicator>> world(
      absl::Time deadline, absl::Duration op_timeout) override;

  // How long ranks other than 0 wait past their deadline for rank 0's
  // verdict, and rank 0 for the others to read a failed one (tests shorten
  // it).
  void set_grace(absl::Duration grace) { grace_ = grace; }
  // Rank 0 reads `key` before each verdict: when it is set (the store
  // recorded a rank claimed twice), the verdict is that error on every
  // rank. In the first round rank 0 first waits up to `settle` for it, so
  // that a second job starting at the same moment is caught.
  void set_conflict_key(std::string key, absl::Duration settle) {
    conflict_key_ = std::move(key);
    settle_ = settle;
  }

 private:
  absl::StatusOr<std::vector<std::string>> Round(const std::string& round,
                                                 absl::string_view data,
                                                 absl::Time deadline);

  std::shared_ptr<Store> store_;
  int rank_;
  int size_;
  std::string prefix_;
  std::string reason_;
  std::string gloo_host_;
  absl::Duration grace_ = absl::Seconds(2);
  std::string conflict_key_;
  absl::Duration settle_;
  int64_t round_ = 0;
  int64_t worlds_ = 0;
  std::atomic<bool> broken_{false};
  // One collective at a time: calls from two threads would pair up
  // differently on different ranks.
  std::mutex mu_;
};

}  // namespace vemesh

#endif  // VEMESH_BOOTSTRAP_STORE_BOOTSTRAP_H_
