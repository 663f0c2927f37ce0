// vemesh/checkpoint/internal/collective.h
//
// The two collective steps Save and Load are built from: every rank's
// string to every rank, and one status that every rank agrees on.
//
//   VEMESH_ASSIGN_OR_RETURN(std::vector<std::string> all,
//                           AllGatherStrings(world, mine));
//   absl::Status same_everywhere = AgreeStatus(world, local_status);

#ifndef VEMESH_CHECKPOINT_INTERNAL_COLLECTIVE_H_
#define VEMESH_CHECKPOINT_INTERNAL_COLLECTIVE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "vemesh/comm/communicator.h"

namespace vemesh::checkpoint::internal {

// Collective: entry r is rank r's `mine` (two all_gathers: lengths, bytes).
absl::StatusOr<std::vector<std::string>> AllGatherStrings(
    Communicator& comm, const std::string& mine);

// Collective: OK when every rank passed OK; otherwise the first failed
// rank's status (by rank), its message prefixed "rank R: ", on every rank.
// A failure of the communication itself is returned as is.
absl::Status AgreeStatus(Communicator& comm, const absl::Status& local);

}  // namespace vemesh::checkpoint::internal

#endif  // VEMESH_CHECKPOINT_INTERNAL_COLLECTIVE_H_
