// examples/train_nd/checkpoint_state.h
//
// What this rank trains, named for the library
// (vemesh/strategies/state_dict.h): the serial model's tensor names and
// shapes, which layers are column or row tensor-parallel, and the
// optimizers and sharding that hold their state. The library turns that
// into checkpoint pieces (and elastic state); a checkpoint saved on one mesh
// loads on any other.
//
//   TrainingParts parts{.stage = stage.get(), .local_optimizer = &opt};
//   vemesh::strategies::TrainingState state;
//   absl::Status s = NameTrainingState(plan, parts, &state);
//   vemesh::checkpoint::StateDict dict;
//   s = state.get_state_dict(&dict);
//   SetStateMetadata(plan, step, &dict);
//   s = vemesh::checkpoint::Save(dict, step, dir, world);
//
// The model: layer<l>.weight ([in, out]) and layer<l>.bias ([1, out]) of
// this stage's layers, even layers column-parallel and odd ones
// row-parallel over TP (MlpShape), and moe.expert<e>.weight / .bias whole,
// by their global index; the optimizer state and step counts follow the
// library's names (<tensor>.exp_avg, ...; state_dict.h).
//
// Metadata: "step" and "data_position" (the next batch's index; batches are
// a function of the seed and the index), and "model": the fingerprint of
// what fixes the serial loss curve (ModelFingerprint), compared on resume.
//
// Loading: the parameters right after the stage is built (DescribeState
// with kParameters: FSDP and ZeRO shard the values they find), the
// optimizer state once the optimizers exist (get_state_dict(kOptimizer),
// Load, set_state_dict).

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
#include "vemesh/strategies/state_dict.h"

namespace train_nd {

// Pointers to what one rank trains with; unset members are absent.
struct TrainingParts {
  ParallelMlpStage* stage = nullptr;  // required
  // At most one of these holds the replicated layers' optimizer state
  // (none of them before the optimizers are made).
  vemesh::strategies::Optimizer* local_optimizer = nullptr;  // DataParallel
  vemesh::strategies::DistributedOptimizer* zero = nullptr;
  vemesh::strategies::FullyShardedDataParallel* fsdp = nullptr;
  vemesh::strategies::Optimizer* expert_optimizer = nullptr;
};
// Names `parts` in `state` (see above). Errors are the library's,
// InvalidArgument naming the tensor.
absl::Status NameTrainingState(const TrainPlan& plan,
                               const TrainingParts& parts,
                               vemesh::strategies::TrainingState* state);

enum class StateParts {
  kAll,         // saving
  kParameters,  // loading, before FSDP / ZeRO are made
  kOptimizer,   // loading, after
};

// The model's pieces (kParameters, or kAll without optimizers) added to
// `dict`, for callers without optimizer state (the elastic loop). The step
// counts of optimizer state live in a TrainingState, which has to outlive
// Save / Load: with optimizers, or kParameters under FSDP, it is
// InvalidArgument (use NameTrainingState).
absl::Status DescribeState(const TrainPlan& plan, const TrainingParts& parts,
                           StateParts which,
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
