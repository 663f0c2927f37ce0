// examples/train_nd/elastic_hsdp.h
//
// An elastic replica trained with HSDP: DP_REPLICATE is the elastic
// dimension (one launch per replica), each replica shards its layers over
// DP_SHARD with FullyShardedDataParallel (FULL_SHARD), and the gradient
// shards are summed over the epoch's DP_REPLICATE group by one all_reduce,
// after every operation on the replica's own groups (docs/ELASTIC.md), then
// applied with plain SGD.
//
//   auto h = *ElasticHsdp::Create(plan, stage.get());   // on epoch 1's mesh
//   loss = h->Step(plan, *stage, step);   // one training step
//   std::vector<std::vector<double>> s = h->SaveShards();
//   h->Rebuild(plan);                     // after each recovery: new groups
//
// The state a replica holds is each rank's local shards (State/LoadState):
// a joiner's rank receives them from the live rank with its own DP_SHARD
// (and PP, TP) coordinate, which holds the same shard. FSDP takes its
// communicators at Create, so a new epoch rebuilds the module around the
// shards it held (the shard layout depends only on DP_SHARD, which stays).

#ifndef EXAMPLES_TRAIN_ND_ELASTIC_HSDP_H_
#define EXAMPLES_TRAIN_ND_ELASTIC_HSDP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "parallel_mlp_stage.h"
#include "train_options.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/strategies/fully_sharded_data_parallel.h"

namespace train_nd {

class ElasticHsdp {
 public:
  using Shards = std::vector<std::vector<double>>;
  // Shards `stage`'s layers (their current values, equal on every replica)
  // over this epoch's DP_SHARD. Collective over the replica's DP_SHARD
  // group only.
  static absl::StatusOr<std::unique_ptr<ElasticHsdp>> Create(
      const TrainPlan& plan, ParallelMlpStage* stage);

  // After a recovery: the same shards on the new epoch's groups.
  absl::Status Rebuild(const TrainPlan& plan);

  // One step of the global batch: the loss, or the first error. The
  // shards change only when every operation succeeded.
  // `fault` is called with "tp" before the pipeline and with "dp" and
  // "stop" before the DP_REPLICATE all_reduce (the fault tests).
  absl::StatusOr<double> Step(const TrainPlan& plan, int step,
                              const std::function<void(const char*)>& fault);

  Shards SaveShards() const;
  void RestoreShards(const Shards& saved);
  // The registered state: the local shards' bytes, and their loading.
  std::string State() const;
  absl::Status LoadState(absl::string_view bytes);
  // Unit `u`'s local shard as live bytes (register_state_bytes: sent,
  // received and fingerprinted in place); empty past the last unit.
  size_t num_units() const { return shapes_.size(); }
  absl::Span<char> ShardBytes(size_t u);
  // Adds `delta` to this rank's first shard element, if it has one (the
  // corrupt fault).
  void Corrupt(double delta);
  // FNV-1a of the local shards: equal on the ranks of one DP_REPLICATE
  // group iff their shards are.
  int64_t Digest() const;
  // This epoch's DP_REPLICATE and DP_SHARD groups.
  const std::shared_ptr<vemesh::Communicator>& replicate() const {
    return replicate_;
  }
  const std::shared_ptr<vemesh::Communicator>& shard() const { return shard_; }

 private:
  explicit ElasticHsdp(ParallelMlpStage* stage) : stage_(stage) {}
  // Builds the module on the current registry mesh; `carry`: the shards
  // to hold instead of the parameters' values.
  absl::Status Build(const Shards* carry);

  ParallelMlpStage* stage_;
  // Each unit's parameters' shapes (FSDP frees the values).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> shapes_;
  std::optional<vemesh::strategies::FullyShardedDataParallel> fsdp_;
  std::shared_ptr<vemesh::Communicator> replicate_;
  std::shared_ptr<vemesh::Communicator> shard_;
};

}  // namespace train_nd

#endif  // EXAMPLES_TRAIN_ND_ELASTIC_HSDP_H_
