#include "tools/plan/mesh_sharing.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "vemesh/layout/mesh_spec.h"

namespace vemesh::plan {

absl::StatusOr<MeshSharing> ComputeMeshSharing(
    const std::vector<NamedLayout>& meshes) {
  MeshSharing out;
  if (meshes.empty()) return out;
  const int64_t world = meshes.front().layout.size();
  if (world > kMaxSharingRanks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mesh sharing of ", world, " ranks: expected at most ",
        kMaxSharingRanks, " (the groups of every dimension are listed)"));
  }
  // Each rank-set partition (sorted groups, members in order) and the
  // first "mesh.dim" that spans it.
  std::map<std::vector<std::vector<int64_t>>, std::string> seen;
  for (const NamedLayout& m : meshes) {
    if (m.layout.size() != world) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mesh '", m.name, "' ", m.layout.ToString(), " has ", m.layout.size(),
          " ranks: expected ", world,
          ", the ranks of the default mesh (meshes of one job share them)"));
    }
    MeshEntry entry;
    entry.name = m.name;
    entry.spec =
        FormatMeshSpec(MeshSpec{m.layout.shape(), m.layout.dim_names()});
    auto add = [&](const std::string& name,
                   const std::vector<std::string>& dims,
                   bool flattened) -> absl::Status {
      absl::StatusOr<std::vector<std::vector<int64_t>>> groups =
          m.layout.groups(dims);
      if (!groups.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("mesh '", m.name, "': ", groups.status().message()));
      }
      SharedDim d;
      d.name = name;
      d.flattened = flattened;
      d.size =
          groups->empty() ? 0 : static_cast<int64_t>(groups->front().size());
      std::sort(groups->begin(), groups->end());
      auto [at, fresh] =
          seen.emplace(*std::move(groups), absl::StrCat(m.name, ".", name));
      if (!fresh) d.shared_with = at->second;
      entry.dims.push_back(std::move(d));
      return absl::OkStatus();
    };
    for (const std::string& dim : m.layout.dim_names()) {
      if (absl::Status s = add(dim, {dim}, false); !s.ok()) return s;
    }
    for (const auto& [name, dims] : m.flattened) {
      if (absl::Status s = add(name, dims, true); !s.ok()) return s;
    }
    out.total_dims += static_cast<int64_t>(entry.dims.size());
    out.meshes.push_back(std::move(entry));
  }
  out.distinct_groups = static_cast<int64_t>(seen.size());
  return out;
}

}  // namespace vemesh::plan
