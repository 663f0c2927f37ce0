#include "tools/plan/rank_view.h"

namespace vemesh::plan {
namespace {

std::optional<int64_t> Step(const MeshLayout& layout, int64_t dim, int64_t rank,
                            int64_t shift) {
  absl::StatusOr<std::optional<int64_t>> n =
      layout.neighbor(layout.dim_name(dim), rank, shift, /*periodic=*/false);
  return n.ok() ? *n : std::nullopt;
}

}  // namespace

RankView BuildRankView(const MeshLayout& layout, const HostMap& hosts,
                       int64_t rank) {
  RankView view;
  view.rank = rank;
  if (absl::StatusOr<Coordinate> c = layout.coordinate_of(rank); c.ok()) {
    view.coordinate = *c;
  }
  view.host = hosts.host_of(rank);
  view.local = hosts.local_of(rank);
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    RankView::DimView dv;
    dv.name = layout.dim_name(d);
    const std::vector<std::string> dims = {dv.name};
    absl::StatusOr<MeshLayout::GroupPosition> pos =
        layout.group_position(dims, rank);
    if (pos.ok()) {
      dv.index_in_group = pos->index;
      dv.group = SummarizeGroup(layout, d, pos->group, hosts);
    }
    dv.prev = Step(layout, d, rank, -1);
    dv.next = Step(layout, d, rank, +1);
    if (dv.name == kPipelineDim) {
      view.pipeline = RankView::Pipeline{
          .dim = dv.name,
          .stage = dv.index_in_group,
          .stages = dv.group.size,
          .prev = dv.prev,
          .next = dv.next,
      };
    }
    view.dims.push_back(std::move(dv));
  }
  return view;
}

}  // namespace vemesh::plan
