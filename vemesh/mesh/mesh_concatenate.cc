// DeviceMesh::concatenate: PyTorch's DeviceMesh._concatenate. The
// dimensions of several sub-meshes of one root joined into one mesh, a
// slice of that root: no communication, no new communicator.

#include <algorithm>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/mesh/device_mesh.h"

namespace vemesh {

absl::StatusOr<DeviceMesh> DeviceMesh::concatenate(
    absl::Span<const DeviceMesh> meshes) {
  if (meshes.empty()) {
    return absl::InvalidArgumentError(
        "DeviceMesh::concatenate of no meshes: expected at least one");
  }
  const DeviceMesh& first = meshes.front();
  std::vector<std::string> names;
  // Each root dimension spanned, and the name that spans it: a root
  // dimension spanned twice overlaps.
  absl::flat_hash_map<int64_t, std::string> spanned;
  for (const DeviceMesh& m : meshes) {
    if (!m.same_root(first)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DeviceMesh::concatenate: ", m.ToString(), " and ", first.ToString(),
          " are derived from different device meshes (roots ",
          m.root_mesh().layout().ToString(), " and ",
          first.root_mesh().layout().ToString(),
          "): expected sub-meshes of one root"));
    }
    const MeshLayout& layout = m.layout();
    for (int64_t d = 0; d < layout.ndim(); ++d) {
      for (int64_t root_dim : layout.root_dims(d)) {
        auto [at, fresh] = spanned.emplace(root_dim, layout.dim_name(d));
        if (!fresh) {
          return absl::InvalidArgumentError(absl::StrCat(
              "DeviceMesh::concatenate: cannot concatenate overlapping "
              "meshes: '",
              layout.dim_name(d), "' and '", at->second,
              "' both span root dimension '",
              first.root_mesh().layout().dim_name(root_dim),
              "': expected each root dimension in one mesh only"));
        }
      }
      names.push_back(layout.dim_name(d));
    }
  }
  const std::vector<int64_t> anchor_ranks = first.mesh();
  VEMESH_ASSIGN_OR_RETURN(DeviceMesh joined, first.root_mesh().submesh_at(
                                                 names, anchor_ranks.front()));
  std::vector<int64_t> members = joined.mesh();
  std::sort(members.begin(), members.end());
  for (const DeviceMesh& m : meshes) {
    for (int64_t r : m.mesh()) {
      if (!std::binary_search(members.begin(), members.end(), r)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "DeviceMesh::concatenate: ", m.ToString(), " holds rank ", r,
            ", outside ", joined.ToString(),
            ", the concatenation holding the first mesh: expected sub-meshes "
            "of one block of the root (those holding the same rank)"));
      }
    }
  }
  return joined;
}

}  // namespace vemesh
