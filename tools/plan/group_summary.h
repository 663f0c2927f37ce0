// tools/plan/group_summary.h
//
// One group along one dimension, ready to show: its members (elided in the
// middle when there are more than kMaxListedMembers) and the hosts it touches.
//
//   GroupSummary g = SummarizeGroup(layout, layout.dim_index("DP").value(),
//                                   /*group=*/0, hosts);
//   g.ranks;        // [0, 2] for PP=2,DP=2,TP=2
//   g.host_count;   // 1 on hosts of 4
//
// Cost: O(ndim * max_listed) for a default (arange) layout, whatever the
// group and world size: only the members shown are built, and the hosts of an
// elided group are counted arithmetically. Other layouts: O(group size).

#ifndef VEMESH_TOOLS_PLAN_GROUP_SUMMARY_H_
#define VEMESH_TOOLS_PLAN_GROUP_SUMMARY_H_

#include <cstdint>
#include <vector>

#include "vemesh/layout/mesh_layout.h"
#include "vemesh/placement/host_map.h"

namespace vemesh::plan {

inline constexpr int64_t kMaxListedMembers = 32;
inline constexpr int64_t kSummaryMembers = 4;  // at each end, when elided

// One group along one dimension, its members possibly elided in the middle.
struct GroupSummary {
  int64_t index = 0;  // as MeshLayout::group_position numbers groups
  int64_t size = 0;
  // All members when complete; otherwise the first kSummaryMembers, with
  // the last kSummaryMembers in `tail`.
  std::vector<int64_t> ranks;
  std::vector<int64_t> tail;
  bool complete() const { return tail.empty(); }
  int64_t host_count = 0;      // distinct hosts its members touch
  std::vector<int64_t> hosts;  // those hosts, ascending, when complete
};

// Builds group `group` along `dim` (indices assumed valid), listing every
// member when there are at most `max_listed`.
GroupSummary SummarizeGroup(const MeshLayout& layout, int64_t dim,
                            int64_t group, const HostMap& hosts,
                            int64_t max_listed = kMaxListedMembers);

// Indices 0..total-1 when total <= head + tail, otherwise the first `head`
// and the last `tail`: what a summary shows.
std::vector<int64_t> SampleIndices(int64_t total, int64_t head, int64_t tail);

}  // namespace vemesh::plan

#endif  // VEMESH_TOOLS_PLAN_GROUP_SUMMARY_H_
