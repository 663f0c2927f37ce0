// examples/train_nd/checkpoint_state.h
//
// What identifies this training to the library: a checkpoint's identity
// (compared on resume: vemesh/strategies/training_metadata.h) and an
// elastic replica's job descriptor (compared when it joins). What this rank
// trains is named by the model (ParallelMlpStage::NameParameters) and by how
// it trains (DataParallelTrainer::AddTo, or the optimizers' own Add* calls
// in the static loop): vemesh/strategies/state_dict.h.

#ifndef EXAMPLES_TRAIN_ND_CHECKPOINT_STATE_H_
#define EXAMPLES_TRAIN_ND_CHECKPOINT_STATE_H_

#include <map>
#include <string>

#include "train_options.h"

namespace train_nd {

// What fixes the loss curve, one key each: the model's shape and experts,
// the seed, the batch, the optimizer and the learning rate (not the mesh,
// the steps or the schedule). Resuming another's checkpoint is refused
// naming the first key that differs.
std::map<std::string, std::string> CheckpointIdentity(const TrainPlan& plan);

// CheckpointIdentity and what else the replicas of one elastic job must
// share (the steps, the micro-batches and the schedule: they fix the bits
// of each step), as ElasticOptions::descriptor's "key=value;..." text: a
// replica of another job is refused naming the items that differ.
std::string JobDescriptor(const TrainPlan& plan);

}  // namespace train_nd

#endif  // EXAMPLES_TRAIN_ND_CHECKPOINT_STATE_H_
