// ElasticMesh's step and recovery: end_step's verdict, the state carried
// to a new epoch, and the recovery loop (Rebuild) that recover() runs.

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "vemesh/elastic/elastic_mesh.h"
#include "vemesh/elastic/internal/elastic_mesh_internal.h"
#include "vemesh/elastic/internal/quorum_round.h"

namespace vemesh {
namespace {

// Bounds the retries of one recover() besides its deadline.
constexpr int kMaxEpochAttempts = 64;

}  // namespace

using elastic_internal::IsRetryable;
using elastic_internal::kProbeTimeout;
using elastic_internal::NextEpoch;

absl::StatusOr<Recovery> ElasticMesh::Rebuild(
    int64_t failed, std::optional<MembershipRecord> first, int64_t committed) {
  const absl::Time deadline = absl::Now() + options_.recovery_timeout;
  absl::Duration agree_time;
  absl::Duration build_time;
  absl::Status last_error;
  absl::Time store_down_since = absl::InfiniteFuture();
  absl::Duration backoff = absl::Milliseconds(20);
  for (int attempt = 0; attempt < kMaxEpochAttempts; ++attempt) {
    if (absl::Now() >= deadline) break;
    const absl::Time agree_start = absl::Now();
    MembershipRecord record;
    if (first.has_value()) {
      record = *std::move(first);
      first.reset();
    } else {
      auto shared = ShareRecord(
          inner_rank_ == 0
              ? ChooseEpoch(failed, deadline)
              : absl::StatusOr<MembershipRecord>(MembershipRecord{}));
      if (absl::IsUnavailable(shared.status()) && absl::Now() < deadline) {
        // The store is unreachable (Redis restarting): retried with backoff
        // for a few lease TTLs, by every rank of the replica together (the
        // status is shared), as the heartbeat rides out a restart.
        const absl::Time now = absl::Now();
        if (store_down_since == absl::InfiniteFuture()) store_down_since = now;
        if (now - store_down_since <
            std::max(4 * options_.heartbeat_ttl, absl::Seconds(2))) {
          absl::SleepFor(std::min(backoff, deadline - now));
          backoff = std::min(2 * backoff, absl::Milliseconds(320));
          --attempt;  // waiting for the store builds no epoch
          continue;
        }
      }
      if (!shared.ok() && !last_error.ok()) {
        // Why the epochs before failed (a group that cannot form names the
        // addresses tried).
        return absl::Status(shared.status().code(),
                            absl::StrCat(shared.status().message(),
                                         "; last: ", last_error.message()));
      }
      if (!shared.ok()) return shared.status();
      record = *std::move(shared);
    }
    if (!record.admits(options_.replica, incarnation_)) {
      Remember(MembershipRecord{});
      current_epoch_->store(record.epoch);
      last_ = Recovery{};
      last_.evicted = true;
      last_.dp_rank = -1;
      last_.epoch = record.epoch;
      last_.dp_size = static_cast<int>(record.members.size());
      last_.replicas = record.members;
      return last_;
    }
    const absl::Time build_start = absl::Now();
    agree_time += build_start - agree_start;
    auto r = Establish(record, committed);
    build_time += absl::Now() - build_start;
    if (r.ok() && !state_.empty()) {
      // The library carries the registered state before any step commits.
      last_ = *r;
      const absl::Time state_start = absl::Now();
      const bool carried = transfer_pending_;
      absl::Status s =
          CarryState(absl::StrCat("after the change to epoch ", record.epoch));
      r->state_time = absl::Now() - state_start;
      r->state_carried = carried && s.ok();
      if (absl::IsDataLoss(s) || (!s.ok() && !IsRetryable(s))) return s;
      if (!s.ok()) r = s;  // retired: the next epoch
    }
    if (r.ok()) {
      Remember(record);
      if (inner_rank_ == 0 && options_.data_plane_detection) {
        // Which members' ports answer from here (a port that never did
        // may be an address wrong from this host: its refusal proves
        // nothing).
        for (int id : record.members) {
          const uint64_t inc = record.incarnation_of(id);
          if (id == options_.replica || reachable_->incarnations.count(inc)) {
            continue;
          }
          auto probe = control_->Probe(id, inc, kProbeTimeout);
          if (probe.ok() && probe->liveness == Liveness::kListening) {
            reachable_->Answered(inc, probe->address);
          }
        }
      }
      last_ = *r;
      last_.step_status = step_status_;
      last_.detect_time = detect_time_;
      last_.agree_time = agree_time;
      last_.build_time = build_time;
      return last_;
    }
    if (!IsRetryable(r.status())) return r.status();
    last_error = r.status();
    RetireEpoch();
    failed = record.epoch;
  }
  return absl::DeadlineExceededError(
      absl::StrCat("replica ", options_.replica, ": no epoch after ", failed,
                   " could be built within ElasticOptions.recovery_timeout (",
                   absl::FormatDuration(options_.recovery_timeout), ")",
                   last_error.ok() ? "" : "; last: ", last_error.message()));
}

void ElasticMesh::Remember(const MembershipRecord& record) {
  *known_ = record;
  std::lock_guard<std::mutex> lock(guard_->mu);
  guard_->record = record.epoch == 0 ? "" : EncodeMembership(record);
  // The epoch this replica is in was read from the store just now: the
  // first steps need no reading of their own.
  guard_->seen_epoch = std::max(guard_->seen_epoch, record.epoch);
  guard_->remembered_at = absl::Now();
}

absl::StatusOr<StepVerdict> ElasticMesh::end_step(
    const absl::Status& step_status) {
  if (last_.evicted) {
    return absl::FailedPreconditionError(absl::StrCat(
        "replica ", options_.replica, " was evicted in epoch ", last_.epoch,
        ": it takes no part in the job's steps; launch it again to rejoin"));
  }
  int64_t failed = step_status.ok() ? 0 : 1;
  // Not a lost member's doing: counted, and retried only so often.
  const int64_t error_code = failed != 0 && !IsRetryable(step_status)
                                 ? static_cast<int64_t>(step_status.code())
                                 : 0;
  // Retire at once: a peer blocked on our DP group gets a closed connection
  // now instead of waiting out its timeout; and the epoch's other ranks are
  // told, so that a replica that cannot progress (one of its ranks died)
  // ends its live ranks, releasing the ranks blocked with them in DP
  // groups this rank is not in.
  const int64_t failed_epoch = epoch();
  if (failed != 0) RetireEpoch();
  if (failed != 0 && error_code == 0) AbortEpochPeers(failed_epoch);
  int64_t seen = -1;
  int64_t lost = 0;
  // The heartbeat thread's last reading of the record: no store round trip
  // on the step's path (see Guard), however old the reading is (a newer
  // epoch that this replica has not seen yet was made by replicas that
  // retired this epoch's groups: its next DP operation fails). The store is
  // read here only on a failure path (a late lease, a record the store
  // lost) and, at DP rank 0, to admit the replicas waiting to join.
  std::optional<int64_t> fresh_epoch;
  if (inner_rank_ == 0) {
    std::lock_guard<std::mutex> lock(guard_->mu);
    if (guard_->seen_epoch >= epoch() &&
        (!guard_->joiners_waiting || last_.dp_rank != 0)) {
      fresh_epoch = guard_->seen_epoch;
    }
  }
  absl::Status lost_status = heartbeat_ ? heartbeat_->lost() : absl::OkStatus();
  std::optional<absl::StatusOr<ControlPlane::Reading>> read;
  if (!lost_status.ok()) {
    // A late renewal (this process was stopped, or the store blinked) is
    // not a lost control plane if the store answers now: the record then
    // says whether the others went on without this replica (evicted).
    read = control_->Read();
    if (read->ok()) lost_status = absl::OkStatus();
  }
  if (!lost_status.ok()) lost = 1;
  if (inner_rank_ == 0 && lost == 0 && fresh_epoch.has_value() &&
      !read.has_value()) {
    seen = *fresh_epoch;
  } else if (inner_rank_ == 0 && lost == 0) {
    absl::StatusOr<ControlPlane::Reading> now =
        read.has_value() ? *std::move(read) : control_->Read();
    // A blip is not a loss: Redis restarted (empty, no persistence) refuses
    // connections for the ~100 ms it takes to listen again; Read retries an
    // unreachable store with backoff for up to the lease TTL
    // (ControlPlane::set_retry_for, set by the mesh).
    if (now.ok() && now->record.epoch < epoch() && known_->epoch == epoch()) {
      // The store lost the record (Redis restarted empty, or an older
      // snapshot): the members write theirs back; a newcomer waits for that.
      auto t = control_->Transition(*now, *known_);
      if (t.ok() && t->record.epoch >= epoch()) now = *std::move(t);
    }
    if (now.ok() && now->record.epoch < epoch()) {
      now = absl::UnavailableError(
          absl::StrCat("it lost its record (epoch ", now->record.epoch, " < ",
                       epoch(), "; was Redis restarted without persistence?)"));
    }
    if (!now.ok()) {
      lost = 1;
      lost_status = now.status();
    } else {
      seen = now->record.epoch;
      // DP rank 0's leader admits the replicas waiting to join, here at a
      // step boundary, by making the next epoch.
      const MembershipRecord& rec = now->record;
      if (rec.epoch == epoch() && !rec.pending.empty() && last_.dp_rank == 0) {
        auto joiners = control_->AliveOf(rec, rec.pending);
        if (joiners.ok() && !joiners->empty()) {
          const MembershipRecord next =
              NextEpoch(rec, rec.members, *joiners, {});
          auto t = control_->Transition(*now, next);
          if (t.ok()) seen = t->record.epoch;
        }
      }
    }
  }
  int64_t agreed[4] = {failed, seen, lost, error_code};
  // The step's own operations over the DP group are its agreement over DP:
  // each succeeded only with every replica in it, and a replica that fails
  // or leaves retires its groups, so that the others' next DP operation
  // fails at once (a step later at most: recover()'s resume_step settles
  // it). Only a step that ran none over the host DP group agrees here, as
  // does a cuda mesh (an NCCL peer's retirement does not end its partners'
  // operation; its Gloo twin's all_reduce does at once).
  const bool rode = verdict_rides_on_step() && epoch_device_groups_.empty() &&
                    dp_ != nullptr && dp_.get() == step_mark_.first &&
                    dp_->started() > step_mark_.second;
  if (failed == 0 && dp_ != nullptr && !rode) {
    ++dp_agreements_;
    int64_t dp_view[2] = {seen, lost};
    absl::Status s =
        dp_->all_reduce(dp_view, dp_view, 2, DataType::kInt64, ReduceOp::kMax);
    if (s.ok()) {
      agreed[1] = dp_view[0];
      agreed[2] = dp_view[1];
    } else {
      agreed[0] = 1;
      RetireEpoch();
      AbortEpochPeers(failed_epoch);
    }
  }
  if (absl::Status s = ReplicaMax(absl::MakeSpan(agreed, 4)); !s.ok()) {
    return s;
  }
  if (agreed[2] != 0) {
    return absl::UnavailableError(
        absl::StrCat("the elastic control plane '", store_name_, "' is lost: ",
                     lost_status.ok() ? "another rank could not reach it"
                                      : std::string(lost_status.message())));
  }
  StepVerdict v;
  v.committed = agreed[0] == 0;
  v.recover = agreed[0] != 0 || agreed[1] > epoch();
  if (v.committed) {
    step_errors_ = 0;
    step_error_code_ = 0;
    step_error_replica_ = -1;
  } else if (agreed[3] != 0) {
    // This replica saw a step fail for a reason that is not a lost
    // member: counted (Establish agrees on the count across replicas).
    ++step_errors_;
    step_error_code_ = agreed[3];
    step_error_replica_ = options_.replica;
  }
  if (v.recover) {
    step_status_ =
        !step_status.ok() ? step_status
        : agreed[3] != 0
            ? absl::Status(static_cast<absl::StatusCode>(agreed[3]),
                           absl::StrCat("another rank of replica ",
                                        options_.replica, "'s step failed"))
        : agreed[0] != 0 ? absl::AbortedError("another replica's step failed")
                         : absl::AbortedError(absl::StrCat(
                               "a newer epoch (", agreed[1], ") was formed"));
  }
  // Every N committed steps of an epoch (the same count on every
  // member): the replicas' states must still agree.
  if (v.committed && !v.recover && options_.fingerprint_every > 0 &&
      !state_.empty() && dp_ != nullptr &&
      ++steps_since_fingerprint_ >= options_.fingerprint_every) {
    absl::Status s = CarryState(absl::StrCat("after ", steps_since_fingerprint_,
                                             " steps of epoch ", epoch()));
    if (absl::IsDataLoss(s) || (!s.ok() && !IsRetryable(s))) return s;
    if (!s.ok()) v.recover = true;
  }
  const absl::Time now = absl::Now();
  if (v.recover) detect_time_ = now - step_began_;
  MarkStep();
  return v;
}

void ElasticMesh::MarkStep() {
  step_began_ = absl::Now();
  step_mark_ = {dp_.get(), dp_ != nullptr ? dp_->started() : 0};
}

void ElasticMesh::AbortEpochPeers(int64_t e) {
  // One-rank replicas have no mates to hang: nobody to tell.
  if (!options_.data_plane_detection || inner_size_ == 1 ||
      known_->epoch != e) {
    return;
  }
  {
    std::lock_guard<std::mutex> lock(guard_->mu);
    // Told by a peer, or told them already.
    if (guard_->told_epoch == e) return;
    guard_->told_epoch = e;
  }
  for (int id : known_->members) {
    const uint64_t inc = known_->incarnation_of(id);
    const std::string text = absl::StrCat("abort ", absl::Hex(inc), " ", e);
    // Read once per incarnation (ControlPlane's cache), not per failure.
    auto where = control_->ProbeAddresses(id, inc);
    if (!where.ok()) continue;  // the store is down: their timeouts decide
    for (int r = 0; r < inner_size_; ++r) {
      if (id == options_.replica && r == inner_rank_) continue;
      // Not advertised: its timeout decides.
      if ((*where)[r].empty()) continue;
      (void)SendToListener((*where)[r], text, kProbeTimeout);
    }
  }
}

absl::Status ElasticMesh::register_state_dict_fn(
    const std::string& name, ReplicaState::StateDictFn state_dict,
    ReplicaState::LoadStateDictFn load_state_dict) {
  return state_.Register(name, std::move(state_dict),
                         std::move(load_state_dict));
}

absl::Status ElasticMesh::register_state_bytes(const std::string& name,
                                               ReplicaState::BytesFn bytes) {
  return state_.RegisterBytes(name, std::move(bytes));
}

absl::Status ElasticMesh::CarryState(absl::string_view where) {
  absl::Status s;
  if (dp_ == nullptr) {
    s = absl::FailedPreconditionError(
        absl::StrCat("epoch ", epoch(), " was retired: call recover() first"));
  }
  if (s.ok() && transfer_pending_) {
    s = state_.Transfer(*dp_, state_root_, receive_pending_);
  }
  std::pair<int, int> named = {-1, -1};
  if (s.ok()) {
    s = state_.CompareFingerprints(*dp_, last_.replicas, where, &named);
  }
  // The replica agrees: one rank's failure (its own shard coordinate) is
  // the whole replica's, and its other ranks name the replicas it named.
  int64_t agreed[3] = {s.ok()                ? 0
                       : absl::IsDataLoss(s) ? 2
                                             : 1,
                       named.first, named.second};
  if (absl::Status r = ReplicaMax(absl::MakeSpan(agreed, 3)); !r.ok()) {
    return r;
  }
  const int64_t code = agreed[0];
  if (code == 0) {
    transfer_pending_ = false;
    receive_pending_ = false;
    steps_since_fingerprint_ = 0;
    return absl::OkStatus();
  }
  if (s.ok()) {
    s = code == 2
            ? absl::DataLossError(absl::StrCat(
                  "the replicas' states differ ", where,
                  " at another shard coordinate of replica ", options_.replica,
                  ": replica ", agreed[1], " differs from replica ", agreed[2],
                  " (the ranks there name the fingerprints)"))
            : absl::AbortedError(
                  absl::StrCat("another rank of replica ", options_.replica,
                               " failed its state transfer ", where));
  }
  if (code == 1) {
    // This rank stays without state; the epoch is to be rebuilt.
    if (receive_pending_) has_state_ = false;
    const int64_t failed_epoch = epoch();
    RetireEpoch();
    AbortEpochPeers(failed_epoch);
    if (!IsRetryable(s)) s = absl::AbortedError(s.message());
  }
  return s;
}

absl::Status ElasticMesh::sync_state() {
  if (last_.evicted) {
    return absl::FailedPreconditionError(
        absl::StrCat("replica ", options_.replica, " was evicted in epoch ",
                     last_.epoch, ": launch it again to rejoin"));
  }
  if (state_.empty()) {
    return absl::FailedPreconditionError(
        "sync_state: no state registered (register_state_dict_fn first)");
  }
  const absl::Time start = absl::Now();
  absl::Status s = CarryState(absl::StrCat("at the start of epoch ", epoch()));
  last_.state_time += absl::Now() - start;
  MarkStep();
  return s;
}

absl::StatusOr<Recovery> ElasticMesh::recover(int64_t committed_steps) {
  if (last_.evicted) {
    return absl::FailedPreconditionError(
        absl::StrCat("replica ", options_.replica, " was evicted in epoch ",
                     last_.epoch, ": launch it again to rejoin"));
  }
  const int64_t failed = epoch();
  RetireEpoch();
  auto r = Rebuild(failed, std::nullopt, committed_steps);
  detect_time_ = absl::ZeroDuration();
  MarkStep();
  return r;
}

}  // namespace vemesh
