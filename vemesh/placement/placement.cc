#include "vemesh/placement/placement.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vemesh {
namespace {

// A JSON string: quotes, backslashes and control characters escaped (host
// names come from the machines and are not trusted to be plain).
void AppendJsonString(std::string* out, absl::string_view text) {
  out->push_back('"');
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (u < 0x20) {
      absl::StrAppend(out, "\\u00", absl::Hex(u, absl::kZeroPad2));
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

template <typename T>
std::string JsonIntArray(const std::vector<T>& values) {
  return absl::StrCat("[", absl::StrJoin(values, ", "), "]");
}

// The dimension of `layout` whose name is `role` ignoring case; nullopt when
// none or more than one matches (the registry refuses the ambiguous case).
std::optional<int64_t> FindRole(const MeshLayout& layout, absl::string_view role) {
  if (auto exact = layout.find_dim(role)) return exact;
  std::optional<int64_t> found;
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    if (!absl::EqualsIgnoreCase(layout.dim_name(d), role)) continue;
    if (found.has_value()) return std::nullopt;
    found = d;
  }
  return found;
}

}  // namespace

const DimPlacement* Placement::dim(absl::string_view name) const {
  for (const DimPlacement& d : dims) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

std::string Placement::ToJson() const {
  std::string out = absl::StrCat("{\"vemesh_placement\": 1, \"world_size\": ",
                                 world_size, ", \"mesh\": {\"dim_names\": [");
  for (size_t i = 0; i < dim_names.size(); ++i) {
    if (i > 0) out += ", ";
    AppendJsonString(&out, dim_names[i]);
  }
  absl::StrAppend(&out, "], \"shape\": ", JsonIntArray(shape), "}, \"hosts\": [");
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (i > 0) out += ", ";
    AppendJsonString(&out, hosts[i]);
  }
  absl::StrAppend(&out, "], \"rank_hosts\": ", JsonIntArray(rank_hosts),
                  ", \"dims\": [");
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) out += ", ";
    out += "{\"name\": ";
    AppendJsonString(&out, dims[i].name);
    absl::StrAppend(&out, ", \"group_count\": ", dims[i].group_count,
                    ", \"group_size\": ", dims[i].group_size,
                    ", \"crossing_groups\": ", dims[i].crossing_groups, "}");
  }
  out += "]}";
  return out;
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
      return absl::InvalidArgumentError(absl::StrCat(
          "placement of ", layout.ToString(), ": rank ", r,
          " is outside the world of ", p.world_size, " ranks"));
    }
  }
  // Along dimension d, the flat index i = (outer, k, inner) belongs to the
  // group (outer, inner): one pass over the ranks per dimension.
  const int64_t size = layout.size();
  int64_t stride = size;
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    const int64_t n = p.shape[d];
    stride /= n;  // product of the sizes after d
    DimPlacement dim{layout.dim_name(d), size / n, n, 0};
    std::vector<int32_t> first(static_cast<size_t>(dim.group_count), -1);
    std::vector<char> crosses(static_cast<size_t>(dim.group_count), 0);
    for (int64_t i = 0; i < size; ++i) {
      const int64_t group = (i / (stride * n)) * stride + i % stride;
      const int32_t host = p.rank_hosts[ranks[i]];
      if (first[group] < 0) {
        first[group] = host;
      } else if (first[group] != host) {
        crosses[group] = 1;
      }
    }
    dim.crossing_groups = std::count(crosses.begin(), crosses.end(), 1);
    p.dims.push_back(std::move(dim));
  }
  return p;
}

std::vector<std::string> PlacementWarnings(const Placement& placement,
                                           const MeshLayout& layout,
                                           absl::Span<const std::string> roles) {
  std::vector<std::string> warnings;
  // Each host's share of the mesh's ranks.
  std::vector<int64_t> share(placement.hosts.size(), 0);
  const std::vector<int64_t> ranks = layout.ranks();
  for (int64_t r : ranks) ++share[placement.host_of(r)];
  std::vector<bool> warned(static_cast<size_t>(layout.ndim()), false);
  for (const std::string& role : roles) {
    const std::optional<int64_t> d = FindRole(layout, role);
    if (!d.has_value() || warned[*d]) continue;
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
        dim.group_count, " groups cross hosts, although every host holds a "
        "multiple of ", dim.group_size, " of the mesh's ranks (the smallest "
        "share is ", smallest, "): ",
        innermost ? "" : absl::StrCat("make ", dim.name,
                                      " the innermost (last) dimension and "),
        "place ranks in blocks, host by host (mpirun --map-by slot, srun "
        "--distribution=block, torchrun's node ranks), and every ", dim.name,
        " group stays inside one host. get_placement() shows where each rank "
        "ran"));
  }
  return warnings;
}

}  // namespace vemesh
