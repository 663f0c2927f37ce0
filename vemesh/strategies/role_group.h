// vemesh/strategies/role_group.h
//
// The communicator of one parallel role (PP, DP or TP) exactly as the
// registry has it now, with the "role absent" case made explicit.
//
//   absl::StatusOr<RoleGroup> tp =
//       RoleGroupFrom(VESCALE_DEVICE_MESH.get_tensor_parallel_dim_groups(),
//                     "TP");
//   if (tp->size == 1) { /* no communication needed */ }
//   tp->comm->all_reduce(...);          // comm is set whenever size > 1
//
// Strategies call this on every operation instead of caching a communicator,
// so that after a re-init of VESCALE_DEVICE_MESH they use the new groups. A
// mesh without the role (e.g. `--mesh DP=8` has no TP) is a group of one:
// the registry answers NotFound for the communicator and size 1 for the role,
// and this turns that into {size 1, rank 0, no communicator}.

#ifndef VEMESH_STRATEGIES_ROLE_GROUP_H_
#define VEMESH_STRATEGIES_ROLE_GROUP_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "vemesh/comm/communicator.h"

namespace vemesh::strategies {

struct RoleGroup {
  int size = 1;
  // This rank's index in the group; the registry's rank for the role.
  int rank = 0;
  // Null only when the mesh has no dimension for the role.
  std::shared_ptr<Communicator> comm;
};

// `comm` is the answer of one of the registry's *_dim_groups getters for
// `role`. Cross-checks the group against the registry's rank for the role
// (the group's ranks must be ordered by the role's coordinate), so a
// backend that ordered a group differently is an Internal error, not a
// silent wrong answer.
absl::StatusOr<RoleGroup> RoleGroupFrom(
    absl::StatusOr<std::shared_ptr<Communicator>> comm, absl::string_view role);

// The registry's data-parallel group ("DP") as a RoleGroup: what DDP and the
// distributed optimizer reduce over.
absl::StatusOr<RoleGroup> CurrentDataParallelGroup();

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_ROLE_GROUP_H_
