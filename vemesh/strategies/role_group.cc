#include "vemesh/strategies/role_group.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace vemesh::strategies {

absl::StatusOr<RoleGroup> RoleGroupFrom(
    absl::StatusOr<std::shared_ptr<Communicator>> comm,
    absl::string_view role) {
  VEMESH_ASSIGN_OR_RETURN(int64_t role_rank,
                          VESCALE_DEVICE_MESH.get_role_rank(role));
  if (!comm.ok()) {
    if (!absl::IsNotFound(comm.status())) return comm.status();
    // The mesh lacks the role: a group of one, if the registry agrees.
    absl::StatusOr<int64_t> size = VESCALE_DEVICE_MESH.get_role_size(role);
    if (!size.ok()) return size.status();
    if (*size != 1) {
      return absl::InternalError(
          absl::StrCat("registry has no ", role, " communicator but gives ",
                       role, " size ", *size, ": ", comm.status().message()));
    }
    return RoleGroup{};
  }
  if (*comm == nullptr) {
    return absl::InternalError(
        absl::StrCat("registry returned a null ", role, " communicator"));
  }
  RoleGroup group;
  group.comm = *std::move(comm);
  group.size = group.comm->size();
  group.rank = group.comm->rank();
  if (group.rank != role_rank) {
    return absl::InternalError(absl::StrCat(
        role, " communicator gives this process group rank ", group.rank,
        " but the registry's ", role, " rank is ", role_rank,
        ": the group must be ordered by the ", role, " coordinate"));
  }
  return group;
}

absl::StatusOr<RoleGroup> CurrentDataParallelGroup() {
  return RoleGroupFrom(VESCALE_DEVICE_MESH.get_data_parallel_dim_groups(),
                       "DP");
}

}  // namespace vemesh::strategies
