#include "vemesh/placement/host_locality.h"

#include <algorithm>
#include <numeric>

namespace vemesh {
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
    case Locality::kIntraHost:
      return "intra-host";
    case Locality::kMixed:
      return "mixed";
    case Locality::kCrossHost:
      return "cross-host";
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

namespace {

// Block placement: a group is base + k*stride, k < n: increasing ranks, so
// it stays in one host iff its first and last member do. Bases are
// o*block + i for o < outer, i < stride; base and last = base + span share a
// host iff (base mod h) + span < h.
int64_t CrossingUnderBlock(int64_t n, int64_t stride, int64_t world,
                           int64_t ranks_per_host) {
  const int64_t h = std::min(ranks_per_host, world);
  const int64_t span = (n - 1) * stride;
  const int64_t group_count = world / n;
  if (span == 0) return 0;
  if (span >= h) return group_count;
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
    const uint64_t repeats =
        static_cast<uint64_t>((outer - 1 - o) / period + 1);
    crossing += per_block * repeats;
    residue = (residue + step) % h;
  }
  return static_cast<int64_t>(crossing);
}

// Slots (block fill over uneven hosts): the group at base b crosses iff a
// host starts at some s with b < s <= b + span, i.e. b in [s - span, s - 1].
// Merge those intervals over every host start and count the bases in them:
// bases are the x with x mod (n * stride) < stride.
int64_t CrossingUnderSlots(int64_t n, int64_t stride,
                           const std::vector<int64_t>& starts) {
  const int64_t span = (n - 1) * stride;
  if (span == 0) return 0;
  const int64_t block = n * stride;
  // Bases in [0, x).
  auto bases_below = [&](int64_t x) {
    return (x / block) * stride + std::min(x % block, stride);
  };
  int64_t crossing = 0;
  int64_t lo = -1, hi = -2;  // the interval being merged
  // starts = {0, s1, ..., world}: the inner ones are host boundaries.
  for (size_t i = 1; i + 1 < starts.size(); ++i) {
    const int64_t a = std::max<int64_t>(0, starts[i] - span);
    const int64_t b = starts[i] - 1;
    if (a > hi + 1) {
      if (hi >= lo) crossing += bases_below(hi + 1) - bases_below(lo);
      lo = a;
    }
    hi = b;
  }
  if (hi >= lo) crossing += bases_below(hi + 1) - bases_below(lo);
  return crossing;
}

}  // namespace

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
  const int64_t stride = RowMajorStrides(layout)[dim];
  switch (hosts.policy()) {
    case PlacementPolicy::kBlock:
      out.crossing_groups =
          CrossingUnderBlock(n, stride, world, hosts.ranks_per_host());
      break;
    case PlacementPolicy::kCyclic:
      // Members base + k*stride share host (rank mod H) iff stride is a
      // multiple of H: then every group stays, else every group crosses.
      out.crossing_groups =
          (n > 1 && stride % hosts.host_count() != 0) ? out.group_count : 0;
      break;
    case PlacementPolicy::kHostfile:
      out.crossing_groups = CrossingUnderSlots(n, stride, hosts.starts());
      break;
  }
  out.locality = Classify(out.crossing_groups, out.group_count);
  return out;
}

DimLocality AnalyzeDimLocalityByScan(const MeshLayout& layout, int64_t dim,
                                     const HostMap& hosts) {
  return ScanDimLocality(layout, layout.ranks(), dim, [&hosts](int64_t rank) {
    return hosts.host_of(rank);
  });
}

DimLocality ScanDimLocality(const MeshLayout& layout,
                            absl::Span<const int64_t> ranks, int64_t dim,
                            absl::FunctionRef<int64_t(int64_t)> host_of) {
  DimLocality out;
  const int64_t size = layout.size();
  const int64_t n = layout.shape()[dim];
  out.group_size = n;
  out.group_count = size / n;
  // Along dimension `dim`, the row-major index i = (outer, k, inner) belongs
  // to group outer * stride + inner (numbered as MeshLayout::groups()): one
  // pass, remembering each group's first host.
  const int64_t stride = RowMajorStrides(layout)[dim];
  std::vector<int64_t> first(static_cast<size_t>(out.group_count), -1);
  std::vector<char> crosses(static_cast<size_t>(out.group_count), 0);
  for (int64_t i = 0; i < size; ++i) {
    const int64_t group = (i / (stride * n)) * stride + i % stride;
    const int64_t host = host_of(ranks[i]);
    if (first[group] < 0) {
      first[group] = host;
    } else if (first[group] != host) {
      crosses[group] = 1;
    }
  }
  out.crossing_groups = std::count(crosses.begin(), crosses.end(), 1);
  out.locality = Classify(out.crossing_groups, out.group_count);
  return out;
}

}  // namespace vemesh
