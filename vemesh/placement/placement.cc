#include "vemesh/placement/placement.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "vemesh/placement/host_locality.h"

namespace vemesh {

const DimPlacement* Placement::dim(absl::string_view name) const {
  for (const DimPlacement& d : dims) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

absl::StatusOr<Placement> ComputePlacement(
    const MeshLayout& layout, absl::Span<const std::string> world_hosts) {
  Placement p;
  p.world_size = static_cast<int64_t>(world_hosts.size());
  p.dim_names = layout.dim_names();
  p.shape = layout.shape();
  // Hosts numbered in the order of their lowest rank.
  absl::flat_hash_map<absl::string_view, int32_t> index;
  p.rank_hosts.reserve(world_hosts.size());
  for (const std::string& host : world_hosts) {
    auto [it, added] =
        index.try_emplace(host, static_cast<int32_t>(p.hosts.size()));
    if (added) p.hosts.push_back(host);
    p.rank_hosts.push_back(it->second);
  }
  const std::vector<int64_t> ranks = layout.ranks();
  for (int64_t r : ranks) {
    if (r < 0 || r >= p.world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("placement of ", layout.ToString(), ": rank ", r,
                       " is outside the world of ", p.world_size, " ranks"));
    }
  }
  // One pass over the ranks per dimension (host_locality.h).
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    const DimLocality loc = ScanDimLocality(
        layout, ranks, d, [&p](int64_t r) { return p.rank_hosts[r]; });
    p.dims.push_back(DimPlacement{layout.dim_name(d), loc.group_count,
                                  loc.group_size, loc.crossing_groups});
  }
  return p;
}

std::vector<std::string> PlacementWarnings(
    const Placement& placement, const MeshLayout& layout,
    absl::Span<const std::string> roles) {
  std::vector<std::string> warnings;
  // Each host's share of the mesh's ranks.
  std::vector<int64_t> share(placement.hosts.size(), 0);
  const std::vector<int64_t> ranks = layout.ranks();
  for (int64_t r : ranks) ++share[placement.host_of(r)];
  std::vector<bool> warned(static_cast<size_t>(layout.ndim()), false);
  for (const std::string& role : roles) {
    // Roles the mesh lacks, or that two dimensions match (the registry
    // refuses those), are skipped.
    const absl::StatusOr<int64_t> d = layout.find_role(role);
    if (!d.ok() || warned[*d]) continue;
    const DimPlacement& dim = placement.dims[*d];
    if (dim.crossing_groups == 0 || dim.group_size < 2) continue;
    bool fits = true;
    int64_t smallest = 0;
    for (int64_t s : share) {
      if (s == 0) continue;
      fits = fits && s % dim.group_size == 0;
      smallest = smallest == 0 ? s : std::min(smallest, s);
    }
    if (!fits) continue;
    warned[*d] = true;
    const bool innermost = *d == layout.ndim() - 1;
    warnings.push_back(absl::StrCat(
        dim.name, " is latency-sensitive but ", dim.crossing_groups, " of its ",
        dim.group_count,
        " groups cross hosts, although every host holds a "
        "multiple of ",
        dim.group_size,
        " of the mesh's ranks (the smallest "
        "share is ",
        smallest, "): ",
        innermost ? ""
                  : absl::StrCat("make ", dim.name,
                                 " the innermost (last) dimension and "),
        "place ranks in blocks, host by host (mpirun --map-by slot, srun "
        "--distribution=block, torchrun's node ranks), and every ",
        dim.name,
        " group stays inside one host. get_placement() shows where each rank "
        "ran"));
  }
  return warnings;
}

}  // namespace vemesh
