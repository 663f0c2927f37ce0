#include "tools/plan/group_members.h"

namespace vemesh::plan {

int64_t GroupMember(const MeshLayout& layout, int64_t dim, int64_t group,
                    int64_t k) {
  const std::vector<int64_t> shape = layout.shape();
  Coordinate coord(shape.size(), 0);
  // Decode `group` row-major over the other dimensions (last fastest).
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    if (d == dim) continue;
    coord[d] = group % shape[d];
    group /= shape[d];
  }
  coord[dim] = k;
  // In range by construction, so rank_at cannot fail.
  return layout.rank_at(coord).value_or(-1);
}

std::vector<int64_t> GroupMembers(const MeshLayout& layout, int64_t dim,
                                  int64_t group) {
  const int64_t n = layout.shape()[dim];
  std::vector<int64_t> members;
  members.reserve(n);
  for (int64_t k = 0; k < n; ++k) {
    members.push_back(GroupMember(layout, dim, group, k));
  }
  return members;
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
