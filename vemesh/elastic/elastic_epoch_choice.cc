// ElasticMesh::ChooseEpoch: a leader's choice of the epoch after a failed
// one, by a quorum round over the members still alive.

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/elastic/elastic_mesh.h"
#include "vemesh/elastic/internal/elastic_mesh_internal.h"
#include "vemesh/elastic/internal/quorum_round.h"

namespace vemesh {
namespace {

// How often a quorum round reads the posts (each read is one get per
// member): at first every millisecond, the normal period after
// kQuorumFastFor (a silent member then waits for its lease anyway).
constexpr absl::Duration kQuorumPollPeriod = absl::Milliseconds(1);
constexpr absl::Duration kQuorumFastFor = absl::Milliseconds(50);

}  // namespace

using elastic_internal::kPollPeriod;
using elastic_internal::kProbeTimeout;
using elastic_internal::NextEpoch;
using elastic_internal::Without;

absl::StatusOr<MembershipRecord> ElasticMesh::ChooseEpoch(int64_t failed,
                                                          absl::Time deadline) {
  // A killed replica's leases outlive it by up to one TTL: wait that long
  // (and a little) for the store to tell the dead from the living before
  // re-forming the same members.
  const absl::Time settle = absl::Now() + options_.heartbeat_ttl * 3 / 2;
  // The quorum round over the failed epoch's members (data_plane_detection).
  std::optional<QuorumRound> round;
  const absl::Time round_start = absl::Now();
  while (absl::Now() < deadline) {
    auto now = control_->Read();
    if (!now.ok()) return now.status();
    const MembershipRecord& rec = now->record;
    if (rec.epoch < failed && known_->epoch == failed) {
      // The store lost the record (Redis restarted empty, or an older
      // snapshot): the members' own copy is the job's, never a newcomer's.
      if (auto t = control_->Transition(*now, *known_); !t.ok()) {
        return t.status();
      }
      (void)control_->NoteStoreUp(options_.heartbeat_ttl);
      continue;
    }
    if (rec.epoch < failed) {
      return absl::UnavailableError(
          absl::StrCat("the elastic control plane '", store_name_,
                       "' lost its record: it "
                       "holds epoch ",
                       rec.epoch, " but this job reached epoch ", failed,
                       " (was Redis restarted without persistence?)"));
    }
    // The others went on without this launch: it is evicted, whoever is
    // alive now.
    // (Or the job ended and a fresh one is forming under its name.)
    if ((rec.epoch > failed || rec.members.empty()) &&
        !rec.admits(options_.replica, incarnation_)) {
      return rec;
    }
    if (options_.data_plane_detection && rec.epoch == failed &&
        rec.admits(options_.replica, incarnation_)) {
      if (!round.has_value()) {
        round.emplace(*control_, rec, options_.replica, incarnation_,
                      kProbeTimeout, reachable_->incarnations,
                      reachable_->hosts);
        if (absl::Status s = round->Post(); !s.ok()) return s;
      }
      auto posted = round->Poll();
      if (!posted.ok()) return posted.status();
      if (posted->has_value()) {
        // Every member posted or is gone: the next epoch is those that
        // posted, with the joiners that are alive.
        auto joiners = control_->AliveOf(rec, rec.pending);
        if (!joiners.ok()) return joiners.status();
        const MembershipRecord next =
            NextEpoch(rec, **posted, *joiners, Without(rec.pending, *joiners));
        if (static_cast<int>(next.members.size()) < options_.min_replicas) {
          return absl::UnavailableError(
              absl::StrCat("only ", next.members.size(), " replica(s) alive [",
                           absl::StrJoin(next.members, ", "), "] after ",
                           MembershipText(rec), ": min_replicas is ",
                           options_.min_replicas));
        }
        if (auto t = control_->Transition(*now, next); !t.ok()) {
          return t.status();
        }
        continue;  // read what won
      }
    }
    auto alive = control_->AliveOf(rec, rec.members);
    if (!alive.ok()) return alive.status();
    // This launch proposes: it counts itself alive even if a renewal of its
    // own lease is late (the members' order is kept).
    if (rec.has_member(options_.replica)) {
      std::vector<int> absent = Without(rec.members, *alive);
      *alive = Without(rec.members, Without(absent, {options_.replica}));
    }
    if (rec.epoch > failed && *alive == rec.members) return rec;
    // A lease absent because the store restarted empty is no death: within
    // a TTL of the restart every live member's renewal writes it back (the
    // quorum round, by the ports, still decides meanwhile). Also in a newer
    // epoch: the one a quorum round just made from the members' posts reads
    // their leases next, before their renewals are back.
    bool leases_lost = false;
    if (*alive != rec.members) {
      auto trusted = control_->LeasesTrusted();
      if (!trusted.ok()) return trusted.status();
      leases_lost = !*trusted;
    }
    if (!leases_lost && (rec.epoch > failed || *alive != rec.members ||
                         absl::Now() >= settle)) {
      auto joiners = control_->AliveOf(rec, rec.pending);
      if (!joiners.ok()) return joiners.status();
      const MembershipRecord next =
          NextEpoch(rec, *alive, *joiners, Without(rec.pending, *joiners));
      if (static_cast<int>(next.members.size()) < options_.min_replicas) {
        return absl::UnavailableError(absl::StrCat(
            "only ", next.members.size(), " replica(s) alive [",
            absl::StrJoin(next.members, ", "), "] after ", MembershipText(rec),
            ": min_replicas is ", options_.min_replicas));
      }
      if (auto t = control_->Transition(*now, next); !t.ok()) {
        return t.status();
      }
      continue;  // read what won
    }
    absl::SleepFor(round.has_value() &&
                           absl::Now() - round_start < kQuorumFastFor
                       ? kQuorumPollPeriod
                       : kPollPeriod);
  }
  return absl::DeadlineExceededError(
      absl::StrCat("no epoch after ", failed,
                   " could be agreed before the recovery "
                   "deadline (ElasticOptions.recovery_timeout ",
                   absl::FormatDuration(options_.recovery_timeout), ")"));
}

}  // namespace vemesh
