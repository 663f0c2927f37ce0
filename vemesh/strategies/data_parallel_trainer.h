// vemesh/strategies/data_parallel_trainer.h
//
// How one rank's layers are trained over the mesh's data-parallel
// dimensions, chosen by one option and built once: DDP (DataParallel and a
// torch.optim-shaped Optimizer over DP), ZeRO over DP_SHARD with
// DP_REPLICATE averaged (DistributedOptimizer), or HSDP (FSDP HYBRID_SHARD:
// units sharded over DP_SHARD, gradient shards all-reduced over
// DP_REPLICATE). On an elastic mesh the groups it holds are the mesh's
// long-lived ones, reconfigured with every membership: nothing is rebuilt
// after a recovery (docs/ELASTIC.md).
//
//   // The model named first (HSDP frees the values at Create):
//   TrainingState state;
//   absl::Status s = state.AddParameters({&w0, &w1}, placements);
//   auto trainer = DataParallelTrainer::Create(
//       *mesh, {{"layer0", {&w0}}, {"layer1", {&w1}}},
//       {.mode = DataParallelMode::kHsdp,
//        .optimizer = OptimizerOptions::AdamW(1e-3)});
//   if (!trainer.ok()) return trainer.status();
//   s = (*trainer)->AddTo(state);      // then how they are trained
//   // Each step:
//   s = (*trainer)->BeginStep();       // zero gradients; HSDP: gather
//   // ... forward and backward on w0, w1 ...
//   s = (*trainer)->AfterBackward();   // inside the replica (DP_SHARD)
//   // ... the loss over the replica's own groups, if any ...
//   s = (*trainer)->Step();            // over DP_REPLICATE, then update
//
// AfterBackward runs only the replica's own operations (HSDP: each unit's
// reduce-scatter over DP_SHARD) and Step the rest (the gradients' reduction
// over the elastic dimension, then the optimizer), so that a step keeps the
// elastic rule: every operation on the replica's own groups before the first
// over DP. kZero is the exception: DistributedOptimizer::Step reduce-
// scatters over DP_SHARD before and all-gathers over it after the
// DP_REPLICATE all_reduce; a DP_REPLICATE failure there is still reported
// the same on every rank of the replica (DistributedOptimizer's
// replicate_failed path), so the step's verdict stays consistent. Under
// HSDP every unit stays gathered from BeginStep to AfterBackward (a
// pipeline interleaves micro-batches).
//
// Modes and groups: kDdp averages over the registry's data-parallel
// dimensions (CurrentDataParallelGroup: the registry's default mesh, not
// `mesh`; in buckets of bucket_elements, no overlap); kZero and kHsdp need
// `mesh`'s `shard_dim` and `replicate_dim`.
// Errors: InvalidArgument naming the mode and the missing dimension, the
// empty unit list, or a parameter listed in two units (naming it and both
// units); the strategies' own errors as they come.
// Not thread-safe; the parameters must outlive the trainer.

#ifndef VEMESH_STRATEGIES_DATA_PARALLEL_TRAINER_H_
#define VEMESH_STRATEGIES_DATA_PARALLEL_TRAINER_H_

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/mesh/device_mesh.h"
#include "vemesh/strategies/data_parallel.h"
#include "vemesh/strategies/distributed_optimizer.h"
#include "vemesh/strategies/fully_sharded_data_parallel.h"
#include "vemesh/strategies/optimizer.h"
#include "vemesh/strategies/state_dict.h"

namespace vemesh::strategies {

enum class DataParallelMode {
  kDdp,   // replicated parameters and optimizer, gradients averaged over DP
  kZero,  // ZeRO over shard_dim, averaged over replicate_dim too
  kHsdp,  // FSDP HYBRID_SHARD over (replicate_dim, shard_dim)
};

struct DataParallelTrainerOptions {
  DataParallelMode mode = DataParallelMode::kDdp;
  OptimizerOptions optimizer{};                // plain SGD unless set
  ZeroStage zero_stage = ZeroStage::kTwo;      // kZero
  size_t bucket_elements = 1 << 20;            // kDdp
  std::string shard_dim = "DP_SHARD";          // kZero, kHsdp
  std::string replicate_dim = "DP_REPLICATE";  // kZero, kHsdp
};

class DataParallelTrainer {
 public:
  // Collective over the data-parallel groups (FSDP and ZeRO agree on their
  // shapes). `units`: this rank's parameters, one unit per layer (FSDP's
  // units; flattened in order for kDdp and kZero).
  static absl::StatusOr<std::unique_ptr<DataParallelTrainer>> Create(
      const DeviceMesh& mesh, std::vector<FsdpUnit> units,
      const DataParallelTrainerOptions& options);

  DataParallelTrainer(const DataParallelTrainer&) = delete;
  DataParallelTrainer& operator=(const DataParallelTrainer&) = delete;

  // Gradients to zero; HSDP: every unit gathered (backward order).
  absl::Status BeginStep();
  // HSDP: every unit's gradients reduce-scattered over shard_dim (the
  // replica's own operations); nothing for kDdp and kZero.
  absl::Status AfterBackward();
  // The reduction over the elastic dimension and the optimizer's update.
  absl::Status Step();

  // Adds how the parameters are held and stepped to `state` (AddFsdp,
  // AddDistributedOptimizer or AddOptimizer); the parameters themselves
  // must have been added first (vemesh/strategies/state_dict.h).
  absl::Status AddTo(TrainingState& state);

  DataParallelMode mode() const { return options_.mode; }
  // The groups a loss is summed over (null for kDdp: the registry's DP).
  const std::shared_ptr<Communicator>& shard_group() const { return shard_; }
  const std::shared_ptr<Communicator>& replicate_group() const {
    return replicate_;
  }
  // Whichever holds the state (null / empty for the other modes).
  FullyShardedDataParallel* fsdp() { return fsdp_ ? &*fsdp_ : nullptr; }
  DistributedOptimizer* zero() { return zero_.get(); }
  Optimizer* optimizer() { return optimizer_ ? &*optimizer_ : nullptr; }

 private:
  explicit DataParallelTrainer(const DataParallelTrainerOptions& options)
      : options_(options) {}

  DataParallelTrainerOptions options_;
  std::vector<std::vector<Parameter*>> units_;
  std::vector<Parameter*> params_;  // the units' parameters, in order
  std::shared_ptr<Communicator> shard_, replicate_;
  std::optional<FullyShardedDataParallel> fsdp_;
  std::unique_ptr<DistributedOptimizer> zero_;
  std::optional<Optimizer> optimizer_;
  std::optional<DataParallel> dp_;
};

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_DATA_PARALLEL_TRAINER_H_
