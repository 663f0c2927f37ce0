// vemesh/strategies/state_snapshot.h
//
// A copy of everything a TrainingState names (vemesh/strategies/state_dict.h:
// the parameters or FSDP shards, the optimizer state, the step counts), to
// undo a step that did not commit: an elastic mesh's end_step may answer
// `committed = false` after this rank's step succeeded (another rank's
// failed), and the step is then redone from where it started.
//
//   StateSnapshot before;
//   absl::Status s = before.Save(state);   // at the start of each step
//   if (s.ok()) s = TrainStep(step);
//   absl::StatusOr<StepVerdict> v = el.end_step(s);
//   if (v.ok() && !v->committed) s = before.Restore(state);
//
// Save copies the bytes of TrainingState::elastic_state()'s entries (the
// live buffers, and the step counts through their callbacks); Restore writes
// them back in place. A Save on every step costs one memcpy of the state and
// the listing of its entries: the copy's buffers are reused (no allocation
// once they have the state's sizes). InvalidArgument when the state no
// longer has the sizes it had at Save (a module rebuilt in between), with
// nothing written; FailedPrecondition before any Save and after a Save that
// failed (never a mix of two steps). Not thread-safe.

#ifndef VEMESH_STRATEGIES_STATE_SNAPSHOT_H_
#define VEMESH_STRATEGIES_STATE_SNAPSHOT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "vemesh/strategies/state_dict.h"

namespace vemesh::strategies {

class StateSnapshot {
 public:
  // Replaces the copy with `state` as it is now.
  absl::Status Save(TrainingState& state);
  // Puts the copy back into `state`'s buffers and optimizers.
  absl::Status Restore(TrainingState& state) const;
  bool empty() const { return !saved_; }
  // Bytes held (for a memory line).
  size_t bytes() const;

 private:
  bool saved_ = false;
  std::vector<std::string> names_;  // of the entries saved
  std::vector<std::string> bytes_;  // one per entry, in elastic_state order
};

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_STATE_SNAPSHOT_H_
