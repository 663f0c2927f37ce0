#include "tools/plan/group_summary.h"

#include <algorithm>
#include <numeric>

#include "vemesh/placement/host_locality.h"

namespace vemesh::plan {
namespace {

// Distinct hosts of members[0..n) of a default layout's group: they are
// first + k * stride, increasing.
int64_t HostsOfStridedGroup(int64_t first, int64_t stride, int64_t n,
                            const HostMap& hosts) {
  if (n <= 1) return 1;
  const int64_t last = first + (n - 1) * stride;
  switch (hosts.policy()) {
    case PlacementPolicy::kBlock:
      // A step of at least a host's size lands on a new host every time; a
      // shorter step cannot jump over a host, so every host between the
      // first and the last member is touched.
      if (stride >= hosts.ranks_per_host()) return n;
      return hosts.host_of(last) - hosts.host_of(first) + 1;
    case PlacementPolicy::kCyclic: {
      // Hosts are rank mod H: the members visit H / gcd(stride, H) residues.
      const int64_t h = hosts.host_count();
      return std::min(n, h / std::gcd(stride % h == 0 ? h : stride % h, h));
    }
    case PlacementPolicy::kHostfile: {
      // Host j (ranks [a, b)) is touched iff some k < n has
      // a <= first + k*stride < b.
      int64_t count = 0;
      for (int64_t j = hosts.host_of(first); j <= hosts.host_of(last); ++j) {
        const int64_t a = hosts.starts()[j];
        const int64_t b = hosts.starts()[j + 1];
        const int64_t k_min =
            a <= first ? 0 : (a - first + stride - 1) / stride;
        const int64_t k_max = (b - 1 - first) / stride;
        if (k_min <= k_max && k_min < n) ++count;
      }
      return count;
    }
  }
  return 1;
}

}  // namespace

GroupSummary SummarizeGroup(const MeshLayout& layout, int64_t dim,
                            int64_t group, const HostMap& hosts,
                            int64_t max_listed) {
  GroupSummary out;
  out.index = group;
  out.size = layout.shape()[dim];
  const bool complete = out.size <= max_listed;
  // Only the members shown are built: never a list the size of the group.
  const std::vector<int64_t> shown =
      complete ? SampleIndices(out.size, out.size, 0)
               : SampleIndices(out.size, kSummaryMembers, kSummaryMembers);
  for (int64_t k : shown) {
    const int64_t rank = layout.group_member(dim, group, k);
    if (complete || k < kSummaryMembers) {
      out.ranks.push_back(rank);
    } else {
      out.tail.push_back(rank);
    }
  }
  if (complete) {
    std::vector<int64_t> host_list;
    for (int64_t rank : out.ranks) host_list.push_back(hosts.host_of(rank));
    std::sort(host_list.begin(), host_list.end());
    host_list.erase(std::unique(host_list.begin(), host_list.end()),
                    host_list.end());
    out.host_count = static_cast<int64_t>(host_list.size());
    out.hosts = std::move(host_list);
  } else if (IsDefaultLayout(layout)) {
    out.host_count = HostsOfStridedGroup(
        out.ranks.front(), RowMajorStrides(layout)[dim], out.size, hosts);
  } else {
    // No constant stride: visit every member, O(group size) (BuildPlan
    // refuses such layouts above kMaxScannedRanks).
    std::vector<int64_t> seen;
    for (int64_t k = 0; k < out.size; ++k) {
      seen.push_back(hosts.host_of(layout.group_member(dim, group, k)));
    }
    std::sort(seen.begin(), seen.end());
    out.host_count = std::unique(seen.begin(), seen.end()) - seen.begin();
  }
  return out;
}

std::vector<int64_t> SampleIndices(int64_t total, int64_t head, int64_t tail) {
  std::vector<int64_t> out;
  if (total <= head + tail) {
    for (int64_t i = 0; i < total; ++i) out.push_back(i);
    return out;
  }
  for (int64_t i = 0; i < head; ++i) out.push_back(i);
  for (int64_t i = total - tail; i < total; ++i) out.push_back(i);
  return out;
}

}  // namespace vemesh::plan
