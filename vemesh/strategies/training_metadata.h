// vemesh/strategies/training_metadata.h
//
// What a training checkpoint says about the run that saved it, and whether
// a run may resume from it: the metadata every job would otherwise write by
// hand next to its state (PeriodicCheckpoint writes the same).
//
//   const std::map<std::string, std::string> identity = {
//       {"model", "mlp 4x64 seed=1 batch=32 adamw lr=0.001"}};
//   checkpoint::StateDict dict;
//   absl::Status s = state.get_state_dict(&dict);
//   SetTrainingMetadata(identity, step, &dict);
//   // ... checkpoint::Save(dict, step, dir, world) ...
//   // On resume: the identity checked before any weight is written, then
//   // the data position and the steps left.
//   checkpoint::LoadOptions load;
//   load.metadata = identity;
//   auto loaded = checkpoint::Load(dict, dir, world, load);
//   if (!loaded.ok()) return loaded.status();  // another model, a bad file
//   s = CheckResumable(*loaded, identity, steps);
//   if (!s.ok()) return s;   // nothing left to train
//
// Metadata: each key of `identity` (what fixes the training: the model,
// its seed, batch and optimizer; not the mesh), "step" (committed steps)
// and "data_position" (the next batch's index: the step itself, for data
// that is a function of the batch's index).
//
// CheckResumable: InvalidArgument naming the checkpoint's path and what
// differs: an identity key missing or with another value (the key and
// both values; LoadOptions::metadata makes Load refuse it first),
// a data_position that is not the step, or a step at or past `steps`
// (nothing left to train).

#ifndef VEMESH_STRATEGIES_TRAINING_METADATA_H_
#define VEMESH_STRATEGIES_TRAINING_METADATA_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "vemesh/checkpoint/checkpoint.h"

namespace vemesh::strategies {

void SetTrainingMetadata(const std::map<std::string, std::string>& identity,
                         int64_t step, checkpoint::StateDict* dict);

absl::Status CheckResumable(const checkpoint::LoadResult& loaded,
                            const std::map<std::string, std::string>& identity,
                            int64_t steps);

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_TRAINING_METADATA_H_
