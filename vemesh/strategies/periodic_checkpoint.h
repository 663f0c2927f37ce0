// vemesh/strategies/periodic_checkpoint.h
//
// A training job's periodic checkpoints, written in the background, and the
// resume of a fresh job from the latest one: what an elastic job needs to
// survive the loss of every replica (the state otherwise lives nowhere but
// in the replicas), around checkpoint::AsyncSaver and checkpoint::Load.
//
//   auto ckpt = PeriodicCheckpoint::Create(
//       replica_world, {.dir = "/ckpt", .every = 50, .keep_last = 2,
//                       .identity = {{"model", "mlp-4x64"}}});
//   if (!ckpt.ok()) return ckpt.status();
//   // A fresh job (every member started at step 0): the latest checkpoint,
//   // model and optimizer state, into `state`'s live buffers (0: none).
//   absl::StatusOr<int64_t> start = (*ckpt)->Restore(state);
//   if (!start.ok()) return start.status();
//   for (int64_t step = *start; step < steps; ++step) {
//     VEMESH_RETURN_IF_ERROR(TrainStep(step));  // committed
//     auto saved = (*ckpt)->AfterStep(state, step + 1, dp_rank == 0);
//     if (saved.ok() && saved->has_value()) { /* **saved is durable */ }
//   }
//   absl::StatusOr<std::optional<int64_t>> last = (*ckpt)->Finish();
//
// `world` is the ranks holding one whole copy of the model: an elastic
// replica's own ranks (its launch's world), or a plain job's world. Only the
// copy whose `writer` is true saves (the replica at DP rank 0; every rank of
// that copy passes the same value, and may pass another after a membership
// change: a save in flight is still committed by the copy that started it).
//
// AfterStep, every `every` committed steps: commits the save in flight
// (its ranks' files fsynced, the manifest, `latest`), then, on the writer,
// copies this rank's pieces and starts the next in the background (the
// buffers may change as soon as it returns). It returns the step whose
// save it committed, if any; a failed save is its error (training may go
// on: the previous checkpoint stays the latest). Finish commits the last.
// AfterStep, Restore and Finish are collective over `world` (its ranks call
// them in the same order), like checkpoint::Save.
//
// Restore loads the latest committed checkpoint of `dir` (every rank of
// `world` agrees whether there is one) once its identity is checked, before
// any buffer is written: each key of Options::identity must have been saved
// with the same value, else InvalidArgument naming the key and both values
// (a checkpoint of another model). What the checkpoint's metadata says is
// in restored(). A `writer` flag that differs across the ranks of `world`
// is InvalidArgument on every rank.
// Every save writes Options::identity, "step" and "data_position" (the
// step: the next batch to train on is the step's own; training_metadata.h).

#ifndef VEMESH_STRATEGIES_PERIODIC_CHECKPOINT_H_
#define VEMESH_STRATEGIES_PERIODIC_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "vemesh/checkpoint/async_saver.h"
#include "vemesh/checkpoint/checkpoint.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/strategies/state_dict.h"

namespace vemesh::strategies {

struct PeriodicCheckpointOptions {
  std::string dir;
  // Save after every `every`-th committed step; 0 never saves (Restore
  // still loads).
  int64_t every = 0;
  int keep_last = 2;  // committed step directories kept, at least 1
  // What a checkpoint must match to be resumed (the model, its shapes).
  std::map<std::string, std::string> identity = {};
  // The job that owns the directory's checkpoints (checkpoint::SaveOptions:
  // a save into a directory another job owns is refused); with
  // `adopt_restored_job`, the job of the checkpoint Restore loaded instead
  // (a job restarted under another name continues its checkpoints).
  std::string job = {};
  bool adopt_restored_job = false;
  // The saving mesh as the job describes it, recorded for `inspect`.
  std::string mesh = {};
};

class PeriodicCheckpoint {
 public:
  // InvalidArgument naming the option: an empty dir, every < 0,
  // keep_last < 1, a null world.
  static absl::StatusOr<std::unique_ptr<PeriodicCheckpoint>> Create(
      std::shared_ptr<Communicator> world, PeriodicCheckpointOptions options);
  ~PeriodicCheckpoint();
  PeriodicCheckpoint(const PeriodicCheckpoint&) = delete;
  PeriodicCheckpoint& operator=(const PeriodicCheckpoint&) = delete;

  // The latest checkpoint's step (0: none), its state in `state`.
  absl::StatusOr<int64_t> Restore(TrainingState& state);
  // After committed step `step` (a count: 1 after the first step).
  absl::StatusOr<std::optional<int64_t>> AfterStep(TrainingState& state,
                                                   int64_t step, bool writer);
  // Commits the save in flight, if any: its step.
  absl::StatusOr<std::optional<int64_t>> Finish();

  const std::optional<checkpoint::LoadResult>& restored() const {
    return restored_;
  }
  const PeriodicCheckpointOptions& options() const { return options_; }
  // Communicators this checkpoint holds besides `world` (its saver's, made
  // at the first save): 0 or 1.
  int64_t communicators() const { return saver_ != nullptr ? 1 : 0; }

 private:
  PeriodicCheckpoint(std::shared_ptr<Communicator> world,
                     PeriodicCheckpointOptions options);

  std::shared_ptr<Communicator> world_;
  PeriodicCheckpointOptions options_;
  std::unique_ptr<checkpoint::AsyncSaver> saver_;  // made at the first save
  std::optional<int64_t> in_flight_;               // the step being saved
  std::optional<checkpoint::LoadResult> restored_;
};

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_PERIODIC_CHECKPOINT_H_
