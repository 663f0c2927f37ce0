// examples/train_nd/checkpoint_state.h
//
// What this rank holds of the training state, described for
// vemesh/checkpoint with names and shapes of the SERIAL model, so that a
// checkpoint saved on one mesh loads on any other:
//
//   TrainingState state{.stage = stage.get(), .local_optimizer = &opt};
//   vemesh::checkpoint::StateDict dict;
//   absl::Status s = DescribeState(plan, state, StateParts::kAll, &dict);
//   s = vemesh::checkpoint::Save(dict, step, dir, world);
//
// Tensors, all float64, 2-D (a bias is 1 x out):
//   layer<l>.weight, layer<l>.bias   the serial model's; this rank adds its
//       TP block (column layer: a block of columns, row layer: of rows; a
//       row layer's bias whole), only for its pipeline stage's layers. DP
//       replicas add the same boxes (the library writes them once). Under
//       FSDP the unit's flat shard is cut into per-parameter boxes
//       (FlatRangeToBoxes), so DP_SHARD ranks add disjoint pieces.
//   moe.expert<e>.weight / .bias      expert e, by its global index.
//   <tensor>.exp_avg, <tensor>.exp_avg_sq (AdamW), <tensor>.momentum_buffer
//       (SGD with momentum): the optimizer state of each value, laid out as
//       the tensor is, from wherever it lives (DataParallel: whole per
//       rank; ZeRO and FSDP: this rank's flat shard, again cut into boxes).
// The optimizers' step count is the training step (every one of them steps
// once per training step), so the manifest's step restores it.
//
// Metadata: "step" and "data_position" (the next batch's index; batches are
// a function of the seed and the index), and "model": the fingerprint of
// what fixes the serial loss curve (ModelFingerprint), compared on resume.
//
// Loading reuses the same descriptions as places to write into, in two
// parts: kParameters right after the stage is built (before FSDP or ZeRO
// take the values: they shard what they find, so their shards and gathered
// copies are rebuilt from the loaded values), kOptimizer once the
// optimizers exist (their state buffers, written in place).

#ifndef EXAMPLES_TRAIN_ND_CHECKPOINT_STATE_H_
#define EXAMPLES_TRAIN_ND_CHECKPOINT_STATE_H_

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "parallel_mlp_stage.h"
#include "train_options.h"
#include "vemesh/checkpoint/checkpoint.h"
#include "vemesh/strategies/distributed_optimizer.h"
#include "vemesh/strategies/fully_sharded_data_parallel.h"
#include "vemesh/strategies/optimizer.h"

namespace train_nd {

// Pointers to what one rank trains with; unset members are absent.
struct TrainingState {
  ParallelMlpStage* stage = nullptr;  // required
  // Exactly one of these holds the replicated layers' optimizer state
  // (none of them before the optimizers are made: kParameters only).
  vemesh::strategies::Optimizer* local_optimizer = nullptr;  // DataParallel
  vemesh::strategies::DistributedOptimizer* zero = nullptr;
  vemesh::strategies::FullyShardedDataParallel* fsdp = nullptr;
  vemesh::strategies::Optimizer* expert_optimizer = nullptr;
};

enum class StateParts {
  kAll,         // saving
  kParameters,  // loading, before FSDP / ZeRO are made
  kOptimizer,   // loading, after
};

// Adds this rank's pieces to `dict` (see above). Under FSDP the parameters
// come from its shards (the Parameter objects are freed), so kParameters
// with `state.fsdp` set is InvalidArgument, as is a piece whose local shape
// differs from the plan's (a bug, named).
absl::Status DescribeState(const TrainPlan& plan, const TrainingState& state,
                           StateParts parts,
                           vemesh::checkpoint::StateDict* dict);

// The metadata of a checkpoint at `step` (see above).
void SetStateMetadata(const TrainPlan& plan, int64_t step,
                      vemesh::checkpoint::StateDict* dict);

// What fixes the loss curve: model shape, experts, seed, batch, optimizer
// and learning rate (not the mesh, the steps or the schedule).
std::string ModelFingerprint(const TrainPlan& plan);

// OK when a loaded checkpoint's metadata fits `plan` and leaves steps to
// train; InvalidArgument naming `path` and what differs otherwise.
absl::Status CheckResumable(
    const TrainPlan& plan, const std::string& path, int64_t step,
    const absl::flat_hash_map<std::string, std::string>& metadata);

}  // namespace train_nd

#endif  // EXAMPLES_TRAIN_ND_CHECKPOINT_STATE_H_
