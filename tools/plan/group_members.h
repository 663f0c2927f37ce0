// tools/plan/group_members.h
//
// One group along one dimension, by index, without listing the world.
// MeshLayout::groups() returns every group (O(world)); the planner only shows
// a few of them for big meshes, so it builds each shown group on its own:
//
//   GroupMember(layout, dim, /*group=*/3, /*k=*/0);   // first rank of group 3
//   GroupMembers(layout, dim, 3);                     // all of group 3
//
// Groups are numbered as MeshLayout::groups() and group_position() number
// them: row-major over the other dimensions.

#ifndef VEMESH_TOOLS_PLAN_GROUP_MEMBERS_H_
#define VEMESH_TOOLS_PLAN_GROUP_MEMBERS_H_

#include <cstdint>
#include <vector>

#include "vemesh/layout/mesh_layout.h"

namespace vemesh::plan {

// The k-th member of group `group` along dimension `dim`. O(ndim).
// Arguments are assumed in range (the planner derives them from the layout).
int64_t GroupMember(const MeshLayout& layout, int64_t dim, int64_t group,
                    int64_t k);

// Every member of that group, in order along `dim`. O(group size * ndim).
std::vector<int64_t> GroupMembers(const MeshLayout& layout, int64_t dim,
                                  int64_t group);

// Indices 0..total-1 when total <= head + tail, otherwise the first `head`
// and the last `tail`: what a summary shows.
std::vector<int64_t> SampleIndices(int64_t total, int64_t head, int64_t tail);

}  // namespace vemesh::plan

#endif  // VEMESH_TOOLS_PLAN_GROUP_MEMBERS_H_
