// vemesh/elastic/internal/elastic_mesh_internal.h
//
// What the files of ElasticMesh share (elastic_mesh.cc, elastic_join.cc,
// elastic_epoch_choice.cc, elastic_establish.cc, elastic_recovery.cc): the
// leader's timing and the arithmetic of membership records. Private: not
// installed.

#ifndef VEMESH_ELASTIC_INTERNAL_ELASTIC_MESH_INTERNAL_H_
#define VEMESH_ELASTIC_INTERNAL_ELASTIC_MESH_INTERNAL_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "vemesh/elastic/internal/control_plane.h"
#include "vemesh/elastic/internal/epoch_gate.h"
#include "vemesh/elastic/internal/liveness_probe.h"
#include "vemesh/elastic/internal/membership.h"

namespace vemesh::elastic_internal {

// How often a waiting leader reads the record again.
inline constexpr absl::Duration kPollPeriod = absl::Milliseconds(5);
// How long a quorum round waits for a silent member's port to answer.
inline constexpr absl::Duration kProbeTimeout = absl::Milliseconds(20);

// A failure a lost (or slow) member explains: a new epoch may cure it.
// Anything else is the step's own (a caller's bug) and is retried only
// ElasticOptions::max_step_retries times.
inline bool IsRetryable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) ||
         absl::IsAborted(s);
}

inline std::vector<int> Without(const std::vector<int>& from,
                                const std::vector<int>& drop) {
  std::vector<int> out;
  for (int id : from) {
    if (std::find(drop.begin(), drop.end(), id) == drop.end()) {
      out.push_back(id);
    }
  }
  return out;
}

// The record after `rec`: `kept` members (in their order) then `joiners`,
// their incarnations carried over; the rest of `rec.pending` stays pending
// unless it is in `dead`.
inline MembershipRecord NextEpoch(const MembershipRecord& rec,
                                  const std::vector<int>& kept,
                                  const std::vector<int>& joiners,
                                  const std::vector<int>& dead) {
  MembershipRecord next;
  next.epoch = rec.epoch + 1;
  next.members = kept;
  next.members.insert(next.members.end(), joiners.begin(), joiners.end());
  next.pending = Without(Without(rec.pending, joiners), dead);
  for (const std::vector<int>* list : {&next.members, &next.pending}) {
    for (int id : *list) {
      if (uint64_t inc = rec.incarnation_of(id); inc != 0) {
        next.incarnations[id] = inc;
      }
    }
  }
  return next;
}

}  // namespace vemesh::elastic_internal

#endif  // VEMESH_ELASTIC_INTERNAL_ELASTIC_MESH_INTERNAL_H_
