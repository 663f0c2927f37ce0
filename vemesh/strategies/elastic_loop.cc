#include "vemesh/strategies/elastic_loop.h"

#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/strategies/elastic_state.h"
#include "vemesh/strategies/state_snapshot.h"

namespace vemesh::strategies {
namespace {

long long Ms(absl::Time t) {
  return static_cast<long long>(absl::ToUnixMillis(t));
}

void Line(std::FILE* log, const std::string& text) {
  if (log == nullptr) return;
  std::fprintf(log, "%s\n", text.c_str());
  std::fflush(log);
}

std::string MembershipLine(const Recovery& r, int replica,
                           absl::string_view why) {
  return absl::StrFormat(
      "membership: epoch %d, DP=%d [%s] (replica %d is DP rank %d; %s; resume "
      "at step %d%s) agreed in %.1f ms, built in %.1f ms, state %.1f ms, at "
      "%d ms",
      r.epoch, r.dp_size, absl::StrJoin(r.replicas, ", "), replica, r.dp_rank,
      why, r.resume_step,
      r.state_carried ? ", state sent to the new replicas" : "",
      absl::ToDoubleMilliseconds(r.agree_time),
      absl::ToDoubleMilliseconds(r.build_time),
      absl::ToDoubleMilliseconds(r.state_time), Ms(absl::Now()));
}

// The data-parallel size: the product of the mesh's DP dimensions (DP, or
// DP_REPLICATE x DP_SHARD).
int64_t DataParallelSize(const ElasticMesh& mesh) {
  int64_t n = 1;
  for (const std::string& d : mesh.mesh().mesh_dim_names()) {
    if (!absl::StartsWith(d, "DP")) continue;
    absl::StatusOr<int64_t> size = mesh.mesh().size(d);
    if (size.ok()) n *= *size;
  }
  return n;
}

// Whether this rank's registered state equals the same coordinate's on
// every replica: one all_reduce of {d, -d} (max) over the elastic dimension.
absl::StatusOr<bool> SameAsOtherReplicas(ElasticMesh& mesh) {
  VEMESH_ASSIGN_OR_RETURN(uint64_t fingerprint, mesh.state_fingerprint());
  const int64_t mine = static_cast<int64_t>(fingerprint >> 1);
  VEMESH_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> group,
                          mesh.mesh().get_group(mesh.replica_dim()));
  int64_t d[2] = {mine, -mine};
  if (group->size() > 1) {
    VEMESH_RETURN_IF_ERROR(
        group->all_reduce(absl::MakeSpan(d), ReduceOp::kMax));
  }
  return d[0] == -d[1];
}

// `same` combined (min) over every dimension but the elastic one: after
// the loop, when no replica can fail a step any more. A failed all_reduce
// is its status, not "different" (ElasticLoopResult::comparison).
absl::StatusOr<bool> SameOnEveryRank(ElasticMesh& mesh, bool same) {
  int64_t v = same ? 1 : 0;
  for (const std::string& d : mesh.mesh().mesh_dim_names()) {
    if (d == mesh.replica_dim()) continue;
    VEMESH_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> g,
                            mesh.mesh().get_group(d));
    if (g->size() == 1) continue;
    absl::Status s = g->all_reduce(absl::MakeSpan(&v, 1), ReduceOp::kMin);
    if (!s.ok()) {
      return absl::Status(
          s.code(), absl::StrCat("end-of-job comparison of the replicas over ",
                                 d, ": ", s.message()));
    }
  }
  return v == 1;
}

}  // namespace

absl::StatusOr<ElasticLoopResult> RunElasticLoop(
    ElasticMesh& mesh, TrainingState& state, const ElasticLoopOptions& options,
    const ElasticLoopHooks& hooks) {
  if (options.steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RunElasticLoop: steps is ", options.steps, ", expected at least 1"));
  }
  if (!hooks.step) {
    return absl::InvalidArgumentError(
        "RunElasticLoop: hooks.step is empty, expected the training step");
  }
  // Counted before the loop's own checkpoint (and its group) exist: it
  // releases them before it returns.
  ElasticLoopResult result;
  result.communicators_at_start = LiveCommunicatorCount();
  std::unique_ptr<PeriodicCheckpoint> own_checkpoint;
  PeriodicCheckpoint* checkpoint = options.checkpoint;
  if (checkpoint != nullptr && options.periodic_checkpoint.has_value()) {
    return absl::InvalidArgumentError(
        "RunElasticLoop: both checkpoint and periodic_checkpoint are set; "
        "expected one (yours, or the options of the loop's own)");
  }
  if (options.checkpoint_world != nullptr &&
      !options.periodic_checkpoint.has_value()) {
    return absl::InvalidArgumentError(
        "RunElasticLoop: checkpoint_world is set without periodic_checkpoint; "
        "expected the options of the checkpoint it is for");
  }
  if (checkpoint == nullptr && options.periodic_checkpoint.has_value()) {
    std::shared_ptr<Communicator> world = options.checkpoint_world;
    if (world == nullptr) {  // the replica's own ranks, a group of its own
      VEMESH_ASSIGN_OR_RETURN(world, mesh.new_replica_group());
    }
    VEMESH_ASSIGN_OR_RETURN(
        own_checkpoint, PeriodicCheckpoint::Create(
                            std::move(world), *options.periodic_checkpoint));
    checkpoint = own_checkpoint.get();
  }
  std::FILE* log = options.log;
  const int replica = mesh.replica();
  // The round after the last step (below) lets each step carry the
  // verdict's agreement over DP (no per-step tax).
  mesh.set_verdict_rides_on_step(true);
  Line(log, MembershipLine(mesh.last_recovery(), replica, "start"));
  // A caller's checkpoint may make its saver's communicator during the
  // loop and keep it: not a leak.
  const int64_t held_at_start =
      options.checkpoint != nullptr ? options.checkpoint->communicators() : 0;
  result.replica = replica;
  result.replica_dim = mesh.replica_dim();
  int64_t step = mesh.last_recovery().resume_step;
  // A fresh job (every member at step 0, nothing received): the latest
  // checkpoint, if any, before the state is registered and compared.
  if (checkpoint != nullptr && step == 0 &&
      !mesh.last_recovery().receives_state) {
    absl::StatusOr<int64_t> restored = checkpoint->Restore(state);
    if (!restored.ok()) return restored.status();
    step = *restored;
    if (step > 0) {
      Line(log, absl::StrCat("resumed at step ", step, " from ",
                             checkpoint->restored()->path));
    }
  }
  result.start_step = step;
  // The last save in flight, committed (its files and `latest`).
  auto commit_last_save = [&] {
    if (checkpoint == nullptr) return;
    absl::StatusOr<std::optional<int64_t>> last = checkpoint->Finish();
    if (!last.ok()) {
      Line(log, absl::StrCat("checkpoint: last save failed: ",
                             last.status().ToString()));
    } else if (last->has_value()) {
      Line(log, absl::StrCat("checkpoint: step ", **last, " saved"));
    }
  };
  // Live buffers, no copy: sent to joiners and to a replica a step ahead.
  if (absl::Status s = RegisterElasticState(mesh, state); !s.ok()) return s;
  // The first thing of the first round: a failed transfer is a failed step.
  absl::Status synced = mesh.sync_state();
  if (absl::IsDataLoss(synced)) return synced;
  bool send_state = !synced.ok();
  StateSnapshot before;
  // The last recovery's record, printed once its first step commits.
  std::optional<Recovery> record;
  const int64_t max_rounds =
      options.max_rounds > 0 ? options.max_rounds : 4 * options.steps + 1000;
  // The round after the last step trains nothing: its end_step makes sure
  // every replica committed that step too (one that failed it sends all
  // into recovery, and the last step is trained again).
  for (int64_t round = 0;; ++round) {
    if (round > max_rounds) {
      return absl::InternalError(
          absl::StrCat("RunElasticLoop: ", round, " rounds without finishing ",
                       options.steps, " steps (at step ", step, ")"));
    }
    const absl::Time start = absl::Now();
    const bool finishing = step >= options.steps && !send_state;
    absl::StatusOr<double> loss = absl::UnknownError("not run");
    if (send_state) loss = synced;  // the state did not arrive: recover
    // Only a round that changed the state has an undo (an earlier,
    // committed step's snapshot must never be put back).
    bool stepped = false;
    // The round's parts, for the step line (where a step's time goes).
    absl::Duration snapshot_time, train_time;
    if (finishing) {
      absl::Status done = hooks.finish ? hooks.finish() : absl::OkStatus();
      if (done.ok() && options.compare_replicas) {
        absl::StatusOr<bool> same = SameAsOtherReplicas(mesh);
        done = same.status();
        if (same.ok()) result.identical = *same;
      }
      if (done.ok()) {
        loss = 0.0;
      } else {
        loss = done;
      }
    } else if (!send_state) {
      absl::Status saved = before.Save(state);
      snapshot_time = absl::Now() - start;
      if (!saved.ok()) {
        loss = saved;
      } else {
        stepped = true;
        loss = hooks.step(step);
        train_time = absl::Now() - start - snapshot_time;
        if (absl::IsCancelled(loss.status())) return loss.status();
      }
      absl::SleepFor(options.pace - (absl::Now() - start));
    }
    if (!loss.ok()) {
      Line(log, absl::StrCat("step ", step + 1, " failed at ", Ms(absl::Now()),
                             " ms: ", loss.status().ToString()));
    }
    const absl::Time verdict_start = absl::Now();
    absl::StatusOr<StepVerdict> verdict = mesh.end_step(loss.status());
    const absl::Duration verdict_time = absl::Now() - verdict_start;
    if (!verdict.ok()) return verdict.status();
    if (verdict->committed && record.has_value() && !send_state) {
      Line(log, absl::StrFormat(
                    "recovery: detect %.1f ms, agree %.1f ms, rebuild %.1f ms, "
                    "state %.1f ms; first good step %d at=%d",
                    absl::ToDoubleMilliseconds(record->detect_time),
                    absl::ToDoubleMilliseconds(record->agree_time),
                    absl::ToDoubleMilliseconds(record->build_time),
                    absl::ToDoubleMilliseconds(record->state_time),
                    step + (finishing ? 0 : 1), Ms(absl::Now())));
      record.reset();
    }
    if (verdict->committed && finishing) {
      if (!verdict->recover) break;
    } else if (verdict->committed) {
      ++step;
      result.losses[step - 1] = *loss;
      if (hooks.on_commit) hooks.on_commit(step, *loss);
      if (checkpoint != nullptr) {
        absl::StatusOr<std::optional<int64_t>> saved = checkpoint->AfterStep(
            state, step, mesh.last_recovery().dp_rank == 0);
        if (!saved.ok()) {
          // The previous checkpoint stays the latest; training goes on.
          Line(log, absl::StrCat("checkpoint: step ", step,
                                 " not saved: ", saved.status().ToString()));
        } else if (saved->has_value()) {
          Line(log, absl::StrCat("checkpoint: step ", **saved, " saved"));
        }
      }
      Line(log,
           absl::StrFormat("step %d/%d loss %.12f time %.2f ms DP=%d at %d ms; "
                           "verdict %.3f ms; snapshot %.3f ms; train %.3f ms",
                           step, options.steps, *loss,
                           absl::ToDoubleMilliseconds(absl::Now() - start),
                           DataParallelSize(mesh), Ms(absl::Now()),
                           absl::ToDoubleMilliseconds(verdict_time),
                           absl::ToDoubleMilliseconds(snapshot_time),
                           absl::ToDoubleMilliseconds(train_time)));
    } else if (stepped) {
      ++result.undone;
      if (absl::Status s = before.Restore(state); !s.ok()) return s;
    }
    if (!verdict->recover) continue;
    if (hooks.before_recover) hooks.before_recover(step);
    absl::StatusOr<Recovery> r = mesh.recover(step);
    if (!r.ok()) return r.status();
    if (r->evicted) {
      Line(log, absl::StrFormat("membership: epoch %d, DP=%d [%s]: replica %d "
                                "evicted",
                                r->epoch, r->dp_size,
                                absl::StrJoin(r->replicas, ", "), replica));
      result.steps = step;
      result.evicted = true;
      // The save in flight is complete but for its commit: every rank of
      // this replica was evicted with it, so each commits it here.
      commit_last_save();
      return result;
    }
    ++result.recoveries;
    // The library loaded the members' state where this replica lacked it
    // or was one step ahead: resume where they are.
    record = *r;
    step = r->resume_step;
    result.losses.erase(result.losses.lower_bound(step), result.losses.end());
    send_state = false;
    Line(log,
         MembershipLine(*r, replica,
                        verdict->committed ? "membership changed"
                                           : "recovered from a failed step"));
    if (hooks.on_recovery) {
      if (absl::Status s = hooks.on_recovery(*r); !s.ok()) return s;
    }
  }
  commit_last_save();
  // Every replica committed the round above: the replica's own groups are
  // safe to use again.
  if (options.compare_replicas) {
    absl::StatusOr<bool> same = SameOnEveryRank(mesh, result.identical);
    result.comparison = same.status();
    result.identical = same.ok() && *same;
  } else {
    result.comparison = absl::FailedPreconditionError(
        "not asked: ElasticLoopOptions::compare_replicas is false");
  }
  result.steps = step;
  result.replicas = mesh.last_recovery().dp_size;
  own_checkpoint.reset();
  result.communicators_at_end =
      LiveCommunicatorCount() -
      (options.checkpoint != nullptr
           ? options.checkpoint->communicators() - held_at_start
           : 0);
  return result;
}

}  // namespace vemesh::strategies
