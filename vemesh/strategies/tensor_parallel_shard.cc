#include "vemesh/strategies/tensor_parallel_shard.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace vemesh::strategies {
namespace {

absl::StatusOr<RoleGroup> RegistryTpGroup() {
  return RoleGroupFrom(VESCALE_DEVICE_MESH.get_tensor_parallel_dim_groups(),
                       "TP");
}

}  // namespace

absl::StatusOr<TensorParallelShard> TensorParallelShard::Create(
    absl::string_view what, int64_t total) {
  VEMESH_ASSIGN_OR_RETURN(RoleGroup tp, RegistryTpGroup());
  if (total < 1 || total % tp.size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " (", total, ") cannot be split evenly across TP=", tp.size,
        ": expected a positive multiple of ", tp.size));
  }
  TensorParallelShard shard;
  shard.what_ = std::string(what);
  shard.total_ = total;
  shard.tp_size_ = tp.size;
  shard.tp_rank_ = tp.rank;
  shard.size_ = total / tp.size;
  shard.begin_ = shard.size_ * tp.rank;
  return shard;
}

absl::StatusOr<RoleGroup> TensorParallelShard::CurrentGroup() const {
  VEMESH_ASSIGN_OR_RETURN(RoleGroup tp, RegistryTpGroup());
  if (tp.size != tp_size_ || tp.rank != tp_rank_) {
    return absl::FailedPreconditionError(absl::StrCat(
        what_, " was split for TP=", tp_size_, " (rank ", tp_rank_,
        ") but the registry now has TP=", tp.size, " (rank ", tp.rank,
        "): rebuild the layer after re-initialising the mesh"));
  }
  return tp;
}

}  // namespace vemesh::strategies
