// examples/train_nd/checkpoint_state.h
//
// What this rank trains, named for the library (vemesh/strategies/
// state_dict.h), which turns it into checkpoint pieces and elastic state;
// a checkpoint saved on one mesh loads on any other. The metadata and the
// resume check are the library's (training_metadata.h), with this
// training's identity.
//
//   vemesh::strategies::TrainingState state;
//   absl::Status s = NameTrainingState(plan, {.stage = stage.get(),
//                                             .local_optimizer = &opt},
//                                      &state);
//
// The model: layer<l>.weight ([in, out]) and layer<l>.bias ([1, out]) of
// this stage's layers, even layers column-parallel and odd ones
// row-parallel over TP (MlpShape), and moe.expert<e>.weight / .bias whole,
// by their global index; the optimizer state and step counts follow the
// library's names (<tensor>.exp_avg, ...; state_dict.h). Named with only
// the stage, before FSDP / ZeRO shard the values they find, it loads the
// parameters (StateDictParts::kModel).

#ifndef EXAMPLES_TRAIN_ND_CHECKPOINT_STATE_H_
#define EXAMPLES_TRAIN_ND_CHECKPOINT_STATE_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "parallel_mlp_stage.h"
#include "train_options.h"
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

// A checkpoint's identity: {"model": what fixes the loss curve (model
// shape, experts, seed, batch, optimizer and learning rate; not the mesh,
// the steps or the schedule)}, compared on resume.
std::map<std::string, std::string> CheckpointIdentity(const TrainPlan& plan);

// What an elastic replica must share with the job to join it
// (ElasticOptions::descriptor): a replica with another model, batch or
// optimizer is refused.
std::string JobDescriptor(const TrainPlan& plan);

}  // namespace train_nd

#endif  // EXAMPLES_TRAIN_ND_CHECKPOINT_STATE_H_
