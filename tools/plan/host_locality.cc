#include "tools/plan/host_locality.h"

#include <algorithm>
#include <numeric>

#include "tools/plan/group_members.h"

namespace vemesh::plan {
namespace {

Locality Classify(int64_t crossing, int64_t groups) {
  if (crossing == 0) return Locality::kIntraHost;
  if (crossing == groups) return Locality::kCrossHost;
  return Locality::kMixed;
}

// #{y in [0, x) : y mod h >= t}, for 0 < t <= h. Unsigned: x may reach
// 2 * world, which stays below 2^64.
uint64_t CountAtOrAbove(uint64_t x, uint64_t h, uint64_t t) {
  const uint64_t rest = x % h;
  return (x / h) * (h - t) + (rest > t ? rest - t : 0);
}

}  // namespace

absl::string_view LocalityName(Locality locality) {
  switch (locality) {
    case Locality::kIntraHost: return "intra-host";
    case Locality::kMixed: return "mixed";
    case Locality::kCrossHost: return "cross-host";
  }
  return "intra-host";
}

std::vector<int64_t> RowMajorStrides(const MeshLayout& layout) {
  const std::vector<int64_t> shape = layout.shape();
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * shape[d + 1];
  }
  return strides;
}

bool IsDefaultLayout(const MeshLayout& layout) { return layout.is_arange(); }

DimLocality AnalyzeDimLocality(const MeshLayout& layout, int64_t dim,
                               const HostMap& hosts) {
  if (!IsDefaultLayout(layout)) {
    return AnalyzeDimLocalityByScan(layout, dim, hosts);
  }
  DimLocality out;
  const int64_t n = layout.shape()[dim];
  const int64_t world = layout.size();
  out.group_size = n;
  out.group_count = world / n;
  // A group is base + k*stride, k < n: increasing ranks, so it stays in one
  // host iff its first and last member do. Bases are o*block + i for
  // o < outer, i < stride; base and last = base + span share a host iff
  // (base mod h) + span < h.
  const int64_t h = std::min(hosts.ranks_per_host, world);
  const int64_t stride = RowMajorStrides(layout)[dim];
  const int64_t span = (n - 1) * stride;
  if (span == 0) {
    out.crossing_groups = 0;
  } else if (span >= h) {
    out.crossing_groups = out.group_count;
  } else {
    // Crosses iff base mod h >= t.
    const uint64_t t = static_cast<uint64_t>(h - span);
    const int64_t block = n * stride;
    const int64_t outer = world / block;
    // (o * block) mod h repeats with period h / gcd(block, h).
    const int64_t period = h / std::gcd(block, h);
    const int64_t step = block % h;
    uint64_t crossing = 0;
    int64_t residue = 0;
    for (int64_t o = 0; o < std::min(outer, period); ++o) {
      const uint64_t r = static_cast<uint64_t>(residue);
      const uint64_t s = static_cast<uint64_t>(stride);
      const uint64_t hu = static_cast<uint64_t>(h);
      const uint64_t per_block =
          CountAtOrAbove(r + s, hu, t) - CountAtOrAbove(r, hu, t);
      // Outer indices o, o + period, ... all share this residue.
      const uint64_t repeats = static_cast<uint64_t>((outer - 1 - o) / period + 1);
      crossing += per_block * repeats;
      residue = (residue + step) % h;
    }
    out.crossing_groups = static_cast<int64_t>(crossing);
  }
  out.locality = Classify(out.crossing_groups, out.group_count);
  return out;
}

DimLocality AnalyzeDimLocalityByScan(const MeshLayout& layout, int64_t dim,
                                     const HostMap& hosts) {
  DimLocality out;
  const int64_t n = layout.shape()[dim];
  out.group_size = n;
  out.group_count = layout.size() / n;
  for (int64_t g = 0; g < out.group_count; ++g) {
    const int64_t host = hosts.host_of(GroupMember(layout, dim, g, 0));
    for (int64_t k = 1; k < n; ++k) {
      if (hosts.host_of(GroupMember(layout, dim, g, k)) != host) {
        ++out.crossing_groups;
        break;
      }
    }
  }
  out.locality = Classify(out.crossing_groups, out.group_count);
  return out;
}

}  // namespace vemesh::plan
