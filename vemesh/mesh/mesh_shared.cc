#include "vemesh/mesh/internal/mesh_shared.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/base/status_macros.h"

namespace vemesh {

absl::StatusOr<MeshLayout> DeviceMesh::Shared::Resolve(
    MeshLayout layout, absl::Span<const std::string> names, int depth) {
  for (const std::string& name : names) {
    if (layout.find_dim(name).has_value()) continue;
    std::vector<std::string> parts;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = flat_names.find(name);
      if (it == flat_names.end()) continue;
      parts = it->second.dims;
    }
    // Each flattening names only earlier ones: the depth is bounded by
    // their number; the bound guards a corrupted map.
    if (depth > static_cast<int>(MeshLayout::kMaxDims) * 2) {
      return absl::InternalError(
          absl::StrCat("flatten name '", name, "' nests too deeply"));
    }
    VEMESH_ASSIGN_OR_RETURN(layout,
                            Resolve(std::move(layout), parts, depth + 1));
    for (const std::string& part : parts) {
      if (!layout.find_dim(part).has_value()) {
        return absl::NotFoundError(absl::StrCat(
            "mesh dimension '", name, "' is the flattening of [",
            absl::StrJoin(parts, ", "), "], and ", layout.ToString(),
            " lacks '", part, "': expected a mesh that holds all of them"));
      }
    }
    VEMESH_ASSIGN_OR_RETURN(layout, layout.flatten(parts, name));
  }
  return layout;
}

absl::StatusOr<SplitRequest> DimSplitRequest(const MeshLayout& layout,
                                             const std::string& name,
                                             int64_t rank, bool member) {
  SplitRequest request;
  request.name = name;
  // A dimension of the layout (every rank answers alike): the group's
  // members go with the request (world ranks, which are the backend
  // worlds' ranks; O(group size)), so MPI makes it over its members only.
  const absl::StatusOr<int64_t> dim = layout.dim_index(name);
  request.group_local = dim.ok();
  if (member && dim.ok()) {
    // group_position and group_members for one dimension, from one
    // coordinate (issue 32: no name lookups or per-member decoding).
    VEMESH_ASSIGN_OR_RETURN(Coordinate at, layout.coordinate_of(rank));
    int64_t group = 0;
    for (int64_t d = 0; d < layout.ndim(); ++d) {
      if (d != *dim) group = group * layout.dim_size(d).value_or(1) + at[d];
    }
    request.color = static_cast<int>(group);
    request.key = static_cast<int>(at[*dim]);
    const int64_t size = layout.dim_size(*dim).value_or(0);
    request.members.reserve(static_cast<size_t>(size));
    for (int64_t k = 0; k < size; ++k) {
      at[*dim] = k;
      request.members.push_back(
          static_cast<int>(layout.rank_at(at).value_or(-1)));
    }
  } else if (member) {
    VEMESH_ASSIGN_OR_RETURN(auto pos, layout.group_position({name}, rank));
    request.color = static_cast<int>(pos.group);
    request.key = static_cast<int>(pos.index);
    if (dim.ok()) {
      for (int64_t m : layout.group_members(*dim, pos.group)) {
        request.members.push_back(static_cast<int>(m));
      }
    }
  }
  return request;
}

absl::Status NotMember(const MeshLayout& layout, int64_t rank,
                       absl::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat("rank ", rank, " is not a member of ", layout.ToString(),
                   ": it has no ", what));
}

}  // namespace vemesh
