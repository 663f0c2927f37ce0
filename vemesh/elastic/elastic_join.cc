// ElasticMesh::Join: a replica's leader waits until the membership record
// lists it, and shares the record with the rest of its replica.

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "vemesh/elastic/elastic_mesh.h"
#include "vemesh/elastic/internal/elastic_mesh_internal.h"

namespace vemesh {

using elastic_internal::kPollPeriod;
using elastic_internal::NextEpoch;
using elastic_internal::Without;

absl::StatusOr<MembershipRecord> ElasticMesh::ShareRecord(
    absl::StatusOr<MembershipRecord> mine) {
  if (inner_size_ == 1) return mine;
  // [status code, text length], then the text (a record or an error).
  std::string text;
  int64_t head[2] = {0, 0};
  if (inner_rank_ == 0) {
    head[0] = static_cast<int64_t>(mine.status().code());
    text = mine.ok() ? EncodeMembership(*mine)
                     : std::string(mine.status().message());
    head[1] = static_cast<int64_t>(text.size());
  }
  if (absl::Status s = replica_comm_->broadcast(head, 2, DataType::kInt64, 0);
      !s.ok()) {
    return s;
  }
  if (head[1] < 0 || head[1] > int64_t{1} << 20) {
    return absl::InternalError(
        absl::StrCat("replica leader sent a record of ", head[1], " bytes"));
  }
  std::vector<int64_t> words((head[1] + 7) / 8, 0);
  if (inner_rank_ == 0 && !text.empty()) {
    std::memcpy(words.data(), text.data(), text.size());
  }
  if (!words.empty()) {
    absl::Status s = replica_comm_->broadcast(words.data(), words.size(),
                                              DataType::kInt64, 0);
    if (!s.ok()) return s;
  }
  if (inner_rank_ == 0) return mine;
  text.assign(reinterpret_cast<const char*>(words.data()),
              static_cast<size_t>(head[1]));
  if (head[0] != 0) {
    return absl::Status(static_cast<absl::StatusCode>(head[0]),
                        absl::StrCat("(from this replica's rank 0) ", text));
  }
  return ParseMembership(text);
}

absl::StatusOr<MembershipRecord> ElasticMesh::Join() {
  const int me = options_.replica;
  const int64_t starting = requested_.dim_size(replica_dim_).value_or(1);
  const absl::Time start = absl::Now();
  const absl::Time form_deadline = start + options_.form_timeout;
  const absl::Time deadline =
      start + options_.form_timeout + options_.recovery_timeout;
  // A missing record may be one the store lost while replicas still train
  // (Redis restarted empty): their heartbeat threads write it back within a
  // renewal period, so a newcomer waits two TTLs before it founds a job.
  const absl::Duration patience = options_.heartbeat_ttl * 2;
  std::optional<absl::Time> absent_since;
  std::optional<absl::Time> all_dead_since;
  absl::Time next_dead_check = absl::InfinitePast();
  bool checked = false;
  while (absl::Now() < deadline) {
    auto now = control_->Read();
    if (!now.ok()) return now.status();
    const MembershipRecord& rec = now->record;
    if (now->text.empty()) {
      if (!absent_since.has_value()) absent_since = absl::Now();
      if (absl::Now() - *absent_since < patience) {
        absl::SleepFor(kPollPeriod * 4);
        continue;
      }
    } else {
      absent_since.reset();
    }
    // A job whose members are all dead (it ended: PASS, failure, or below
    // min_replicas) is over: this launch starts a fresh one under the same
    // name, its epochs numbered on from the old ones (their keys stay).
    // (Checked every TTL/4, not at every poll: a joiner of a live job must
    // not load the store while it waits for its step boundary.)
    if (!rec.members.empty() && !rec.admits(me, incarnation_) &&
        absl::Now() >= next_dead_check) {
      next_dead_check = absl::Now() + options_.heartbeat_ttl / 4;
      auto alive = control_->AliveOf(rec, rec.members);
      if (!alive.ok()) return alive.status();
      if (!alive->empty()) {
        all_dead_since.reset();
      } else if (!all_dead_since.has_value()) {
        all_dead_since = absl::Now();
      } else if (absl::Now() - *all_dead_since >= patience) {
        MembershipRecord fresh;
        fresh.epoch = rec.epoch;
        fresh.pending = Without(rec.pending, {me});
        fresh.pending.push_back(me);
        for (int id : fresh.pending) {
          if (uint64_t inc = rec.incarnation_of(id); inc != 0) {
            fresh.incarnations[id] = inc;
          }
        }
        fresh.incarnations[me] = incarnation_;
        if (absl::Status s = control_->SetDescriptor(descriptor_); !s.ok()) {
          return s;
        }
        if (auto t = control_->Transition(*now, fresh); !t.ok()) {
          return t.status();
        }
        all_dead_since.reset();
        checked = false;
        continue;
      }
    }
    // Admission: this launch must train the job's mesh, model and batch.
    if (!checked) {
      if (absl::Status s = control_->CheckDescriptor(descriptor_, me);
          !s.ok()) {
        return s;
      }
      checked = true;
    }
    if (rec.members.empty()) {
      joined_unformed_ = true;
      formed_from_ = rec.epoch;
    }
    if (rec.admits(me, incarnation_)) return rec;
    if (rec.has_member(me)) {
      // An earlier launch of this replica is still listed: the members drop
      // it at their next recovery (its leases are not this launch's).
      absl::SleepFor(kPollPeriod);
      continue;
    }
    if (!rec.has_pending(me) || rec.incarnation_of(me) != incarnation_) {
      MembershipRecord next = rec;
      if (!rec.has_pending(me)) next.pending.push_back(me);
      next.incarnations[me] = incarnation_;
      if (auto t = control_->Transition(*now, next); !t.ok()) {
        return t.status();
      }
      continue;
    }
    if (rec.members.empty()) {
      auto alive = control_->AliveOf(rec, rec.pending);
      if (!alive.ok()) return alive.status();
      const int64_t starters = std::count_if(
          alive->begin(), alive->end(), [&](int id) { return id < starting; });
      if (starters == starting ||
          (absl::Now() >= form_deadline &&
           static_cast<int>(alive->size()) >= options_.min_replicas)) {
        std::vector<int> starters_sorted = *alive;
        std::sort(starters_sorted.begin(), starters_sorted.end());
        const MembershipRecord first = NextEpoch(rec, {}, starters_sorted, {});
        if (auto t = control_->Transition(*now, first); !t.ok()) {
          return t.status();
        }
        continue;
      }
    }
    absl::SleepFor(kPollPeriod);
  }
  auto last = control_->Read();
  return absl::DeadlineExceededError(absl::StrCat(
      "replica ", me, " was not admitted within ",
      absl::FormatDuration(deadline - start), "; the record is ",
      last.ok() ? MembershipText(last->record) : last.status().ToString(),
      " (a running job admits a replica at its next step boundary; a new "
      "job forms once all ",
      starting, " starting replicas are alive, or ", options_.min_replicas,
      " after form_timeout)"));
}

}  // namespace vemesh
