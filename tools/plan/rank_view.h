// tools/plan/rank_view.h
//
// One rank's view of the mesh, what `vemesh plan --rank R` prints: its
// coordinate and host, and for every dimension the group it belongs to, its
// place in it, its peers and its neighbours along that dimension. The
// pipeline neighbours are the previous and next stage along PP: the rank that
// holds the same position in the neighbouring stage (none at the edges; no
// wrap-around).
//
//   RankView v = BuildRankView(layout, hosts, 5);   // PP=2,DP=2,TP=2
//   v.coordinate;               // [1, 0, 1]
//   v.dims[2].group.ranks;      // TP group: [4, 5]
//   v.pipeline->prev;           // 1
//   v.pipeline->next;           // nullopt: last stage
//
// Groups are GroupSummary values, so a view stays small in any world.

#ifndef VEMESH_TOOLS_PLAN_RANK_VIEW_H_
#define VEMESH_TOOLS_PLAN_RANK_VIEW_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tools/plan/group_summary.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/placement/host_locality.h"

namespace vemesh::plan {

struct RankView {
  struct DimView {
    std::string name;
    int64_t index_in_group = 0;  // == the rank's coordinate along this dim
    GroupSummary group;
    std::optional<int64_t> prev;  // neighbour at -1 along this dim, no wrap
    std::optional<int64_t> next;  // neighbour at +1
  };
  struct Pipeline {
    std::string dim;  // "PP"
    int64_t stage = 0;
    int64_t stages = 0;
    std::optional<int64_t> prev;
    std::optional<int64_t> next;
  };

  int64_t rank = 0;
  Coordinate coordinate;
  int64_t host = 0;
  int64_t local = 0;
  std::vector<DimView> dims;
  // The --flatten / --view groups of this rank (Plan::derived's order);
  // index_in_group is its index along the flattened name.
  std::vector<DimView> derived;
  std::optional<Pipeline> pipeline;  // set when the mesh has a PP dimension
};

inline constexpr char kPipelineDim[] = "PP";

// `rank` must be a member of `layout` (the caller validates it).
RankView BuildRankView(const MeshLayout& layout, const HostMap& hosts,
                       int64_t rank);

}  // namespace vemesh::plan

#endif  // VEMESH_TOOLS_PLAN_RANK_VIEW_H_
