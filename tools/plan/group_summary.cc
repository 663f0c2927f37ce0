#include "tools/plan/group_summary.h"

#include <algorithm>

#include "tools/plan/group_members.h"

namespace vemesh::plan {

GroupSummary SummarizeGroup(const MeshLayout& layout, int64_t dim,
                            int64_t group, const HostMap& hosts,
                            int64_t max_listed) {
  GroupSummary out;
  out.index = group;
  out.size = layout.shape()[dim];
  const bool complete = out.size <= max_listed;
  std::vector<int64_t> host_list;
  host_list.reserve(out.size);
  for (int64_t k = 0; k < out.size; ++k) {
    const int64_t rank = GroupMember(layout, dim, group, k);
    host_list.push_back(hosts.host_of(rank));
    if (complete || k < kSummaryMembers) {
      out.ranks.push_back(rank);
    } else if (k >= out.size - kSummaryMembers) {
      out.tail.push_back(rank);
    }
  }
  std::sort(host_list.begin(), host_list.end());
  host_list.erase(std::unique(host_list.begin(), host_list.end()),
                  host_list.end());
  out.host_count = static_cast<int64_t>(host_list.size());
  if (complete) out.hosts = std::move(host_list);
  return out;
}

}  // namespace vemesh::plan
