// vemesh/strategies/elastic_loop.h
//
// The elastic training loop (docs/USER_GUIDE.md §5a) as one call: the user
// names what a rank trains once (a TrainingState: FSDP units, ZeRO shards,
// DDP parameters, optimizer state) and gives the step; the loop registers
// the state with the elastic mesh (the library carries it to joiners and
// fingerprints it), lets each step carry the verdict's agreement over DP
// (ElasticMesh::set_verdict_rides_on_step: no per-step tax; every replica
// of the job runs this loop), snapshots it before each step and puts it back
// when the step does not commit, calls end_step and recover(), prints what
// happened, saves periodic checkpoints in the background and restores the
// latest one when the whole job starts afresh.
//
//   TrainingState state;                      // named once
//   if (absl::Status s = state.AddFsdp(fsdp, units); !s.ok()) return s;
//   absl::StatusOr<ElasticLoopResult> done = RunElasticLoop(
//       *VESCALE_DEVICE_MESH.elastic(), state,
//       {.steps = 1000, .log = launch_rank == 0 ? stdout : nullptr},
//       {.step = [&](int64_t step) { return TrainStep(step); }});
//   if (!done.ok()) return done.status();  // store lost, states differ,
//                                          // the same bug 3 times in a row
//   if (done->evicted) return absl::OkStatus();  // launch it again to rejoin
//
// The step trains step `step` (0-based) on the mesh's groups (the same
// objects in every epoch) and returns its loss or its first error; every
// operation on the replica's own groups comes before its first over the
// elastic dimension (elastic_mesh.h). A step that fails is undone on every
// rank of its replica and retried after recover(); its status is in the
// "step S failed" line and in the recovery's record. A step that returns
// Cancelled ends the loop at once with that status (the caller leaves the
// job, as a killed replica would: the others recover without it). Hooks:
// `on_recovery` after each recovery that kept this replica (re-slice the data
// over the new DP size), `on_commit` after each committed step, `finish` as the
// work of the round after the last step (it runs while every replica is still
// in the job: a failure there is a failed round, recovered and run again),
// `before_recover` before each recover() (tests inject faults there).
//
// Lines written to `log` (one each, flushed; the replica's rank 0 passes
// stdout, the others null):
//   membership: epoch E, DP=N [R0, R1] (replica K is DP rank D; WHY; resume
//     at step S[, state sent to the new replicas]) agreed in A ms, built in
//     B ms, state T ms, at UNIX_MS ms
//   step S/N loss L time T ms DP=D at UNIX_MS ms; verdict V ms; snapshot
//     P ms; train H ms
//     (each committed step; T from the step's start to its verdict, V the
//     end_step call alone, P the copy of the state for an undo, H the step
//     hook alone, D the data-parallel size: where a step's time goes)
//   step S failed at UNIX_MS ms: STATUS
//   recovery: detect D ms, agree A ms, rebuild R ms, state S ms; first good
//     step K at=UNIX_MS                               (once it committed)
//   membership: epoch E, DP=N [...]: replica K evicted
//   resumed at step S from DIR                        (a checkpoint restored)
//   checkpoint: step S saved
// (WHY is "start", "membership changed" or "recovered from a failed step".)
//
// Checkpoints (options.checkpoint, or options.periodic_checkpoint over the
// replica's own ranks): the replica at DP rank 0 saves after the committed
// steps PeriodicCheckpoint asks for; a launch that starts a fresh job
// (resume step 0, no state received from the members) restores the latest
// one first. A failed save is printed and training goes on (the previous
// checkpoint stays latest).
//
// Collective over the replica's ranks at its start when it makes its own
// checkpoint's group (periodic_checkpoint without checkpoint_world): every
// rank of a replica passes the same checkpoint options.
//
// Bounds: after max_rounds rounds without finishing, Internal. Errors:
// periodic_checkpoint's options (PeriodicCheckpoint::Create's:
// InvalidArgument), the group's split (a rank of the replica gone:
// Unavailable or DeadlineExceeded, within the replica group's timeout),
// end_step's and recover()'s (control plane lost,
// DataLoss, a failure that is not a lost member repeated past
// max_step_retries), the snapshot's,
// the hooks' (on_recovery's, as is).

#ifndef VEMESH_STRATEGIES_ELASTIC_LOOP_H_
#define VEMESH_STRATEGIES_ELASTIC_LOOP_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/elastic/elastic_mesh.h"
#include "vemesh/strategies/periodic_checkpoint.h"
#include "vemesh/strategies/state_dict.h"

namespace vemesh::strategies {

struct ElasticLoopOptions {
  // The job's length in committed steps (at least 1).
  int64_t steps = 0;
  // Where the loop's lines go; null: nowhere.
  std::FILE* log = nullptr;
  // Each step lasts at least this long (demos; fault tests that act from
  // outside at a moment of their choosing).
  absl::Duration pace = absl::ZeroDuration();
  // Background checkpoints over the replica's ranks (see above); null: none.
  PeriodicCheckpoint* checkpoint = nullptr;
  // Or the loop's own: made from these options over `checkpoint_world` (the
  // replica's own ranks, e.g. its launch's world; null: a group of the
  // replica's ranks the loop makes, ElasticMesh::new_replica_group) when
  // `checkpoint` is null, and released before the loop returns (the saver's
  // communicator and the loop's group with it; `checkpoint_world` stays
  // yours). Both set, or a world without options: InvalidArgument. A
  // replica evicted commits its save in flight first.
  std::optional<PeriodicCheckpointOptions> periodic_checkpoint = {};
  std::shared_ptr<Communicator> checkpoint_world = nullptr;
  // Rounds (steps tried, failed ones included) before the loop gives up:
  // 0 is 4 * steps + 1000.
  int64_t max_rounds = 0;
  // The end-of-job check: in the round after the last step each rank's
  // registered state (a 64-bit fingerprint of state.elastic_state()'s
  // bytes) is compared with the same coordinate of every other replica (one
  // all_reduce over the elastic dimension), and after the loop the answers
  // are combined over the replica's own dimensions (ElasticLoopResult::
  // identical: the same on every rank of the job; a comparison that could
  // not be made is ElasticLoopResult::comparison, identical then false).
  bool compare_replicas = false;
};

struct ElasticLoopHooks {
  // Required: trains step `step` (0-based); its loss or its first error.
  std::function<absl::StatusOr<double>(int64_t step)> step;
  // After each recovery that kept this replica, with its record.
  std::function<absl::Status(const Recovery& r)> on_recovery;
  // After each committed step: `steps` committed so far, the step's loss.
  std::function<void(int64_t steps, double loss)> on_commit;
  // The work of the round after the last step (see above).
  std::function<absl::Status()> finish;
  // Before each recover(), with the steps committed.
  std::function<void(int64_t steps)> before_recover;
};

struct ElasticLoopResult {
  int64_t steps = 0;       // committed (options.steps unless evicted)
  int64_t start_step = 0;  // where this launch began (resume or checkpoint)
  int recoveries = 0;
  int64_t undone = 0;    // steps that did not commit, their updates undone
  bool evicted = false;  // not a member any more: launch it again to rejoin
  // The loss of each committed step this launch trained and kept, by its
  // 0-based index (a recovery that resumes at an earlier step drops those
  // after it): what strategies::CompareLossCurve checks. One map entry per
  // step (about 64 bytes: 64 MB at a million steps).
  std::map<int64_t, double> losses;
  // Who ran it: the mesh's replica id, elastic dimension, and its size in
  // the last epoch (the replicas at the end).
  int replica = -1;
  std::string replica_dim;
  int replicas = 0;
  // LiveCommunicatorCount() when the loop began and when it returned (its
  // own checkpoint released; the saver a checkpoint of yours made during
  // the loop not counted): equal unless communicators leaked (a count of
  // the whole process: meaningful where a process is one rank). An evicted
  // replica returns early: these two, `replicas` and the comparison are
  // left unset.
  int64_t communicators_at_start = 0;
  int64_t communicators_at_end = 0;
  // options.compare_replicas: every replica ended with the same state.
  bool identical = false;
  // options.compare_replicas: OK, or why the comparison itself failed (a
  // communication error): `identical` is then false without meaning that
  // the states differ. FailedPrecondition when compare_replicas is false.
  absl::Status comparison;
};

absl::StatusOr<ElasticLoopResult> RunElasticLoop(
    ElasticMesh& mesh, TrainingState& state, const ElasticLoopOptions& options,
    const ElasticLoopHooks& hooks);

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_ELASTIC_LOOP_H_
