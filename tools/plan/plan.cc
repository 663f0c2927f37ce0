#include "tools/plan/plan.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tools/plan/group_members.h"
#include "vemesh/mesh_spec.h"

namespace vemesh::plan {
namespace {

std::string SpecOf(const MeshLayout& layout) {
  return FormatMeshSpec(MeshSpec{layout.shape(), layout.dim_names()});
}

// Warns when the tensor-parallel groups leave a host, with an order that is
// verified to bring them back.
std::optional<PlanWarning> TensorParallelWarning(const Plan& plan) {
  std::optional<int64_t> tp = plan.layout.find_dim(kTensorParallelDim);
  if (!tp.has_value()) return std::nullopt;
  const DimLocality& loc = plan.dims[*tp].locality;
  if (loc.crossing_groups == 0) return std::nullopt;
  PlanWarning w;
  w.code = "tp-crosses-hosts";
  w.dim = kTensorParallelDim;
  w.suggestion =
      SuggestOrderKeepingInHost(plan.layout, kTensorParallelDim, plan.hosts)
          .value_or(OrderSuggestion{});
  w.message = absl::StrCat(
      loc.crossing_groups, " of ", loc.group_count, " ", kTensorParallelDim,
      " groups cross hosts (", plan.hosts.ranks_per_host,
      " ranks per host); tensor parallelism wants the fast links inside a "
      "host. ");
  if (w.suggestion.found) {
    absl::StrAppend(&w.message, "Suggested order: --mesh ",
                    w.suggestion.mesh_spec, " keeps every ",
                    kTensorParallelDim, " group inside one host.");
  } else {
    absl::StrAppend(&w.message, w.suggestion.reason, ".");
  }
  return w;
}

}  // namespace

absl::StatusOr<Plan> BuildPlan(const MeshLayout& layout,
                               const PlanSettings& settings) {
  if (settings.ranks_per_host < 1 ||
      settings.ranks_per_host > kMaxRanksPerHost) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--ranks-per-host expects an integer from 1 to ", kMaxRanksPerHost,
        ", got ", settings.ranks_per_host));
  }
  if (!IsDefaultLayout(layout) && layout.size() > kMaxScannedRanks) {
    return absl::InvalidArgumentError(absl::StrCat(
        SpecOf(layout), " has ", layout.size(),
        " ranks and is not the default row-major arange (a rank table or a "
        "sub-mesh), so planning it visits every rank: expected at most ",
        kMaxScannedRanks, " ranks for such a layout"));
  }
  Plan plan(layout);
  plan.mesh_spec = SpecOf(layout);
  plan.hosts = HostMap{settings.ranks_per_host, layout.size()};
  plan.summarized = layout.size() > kListLimit;

  if (settings.color_by.empty()) {
    plan.color_dim =
        layout.find_dim(kTensorParallelDim).value_or(layout.ndim() - 1);
  } else {
    std::optional<int64_t> d = layout.find_dim(settings.color_by);
    if (!d.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--color-by '", settings.color_by, "' is not a dimension of ",
          plan.mesh_spec, "; expected one of ",
          absl::StrJoin(layout.dim_names(), ", ")));
    }
    plan.color_dim = *d;
  }
  if (settings.rank.has_value()) {
    const int64_t r = *settings.rank;
    if (!layout.contains(r)) {
      return absl::OutOfRangeError(absl::StrCat(
          "--rank ", r, " is out of range: ", plan.mesh_spec, " has ranks 0..",
          layout.size() - 1));
    }
    plan.rank_view = BuildRankView(layout, plan.hosts, r);
  }

  // Rank rows: all, or both ends of the row-major listing.
  const int64_t rows_each_end = plan.summarized ? kSummaryRanks : kListLimit;
  const std::vector<int64_t> shape = layout.shape();
  for (int64_t i : SampleIndices(layout.size(), rows_each_end, rows_each_end)) {
    // The i-th member in row-major order.
    Coordinate coord(layout.ndim(), 0);
    int64_t rest = i;
    for (int64_t d = layout.ndim() - 1; d >= 0; --d) {
      coord[d] = rest % shape[d];
      rest /= shape[d];
    }
    const int64_t rank = layout.rank_at(coord).value_or(-1);
    plan.ranks.push_back(RankRow{.rank = rank,
                                 .coordinate = coord,
                                 .host = plan.hosts.host_of(rank),
                                 .local = plan.hosts.local_of(rank)});
  }

  const bool default_layout = IsDefaultLayout(layout);
  const std::vector<int64_t> strides = RowMajorStrides(layout);
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    DimPlan dim;
    dim.name = layout.dim_name(d);
    dim.size = layout.shape()[d];
    dim.stride = default_layout ? strides[d] : 0;
    dim.locality = AnalyzeDimLocality(layout, d, plan.hosts);
    const int64_t groups_each_end =
        plan.summarized ? kSummaryGroups : kListLimit;
    const int64_t max_listed =
        plan.summarized ? kMaxListedMembers : kListLimit;
    for (int64_t g : SampleIndices(dim.locality.group_count, groups_each_end,
                                   groups_each_end)) {
      dim.groups.push_back(
          SummarizeGroup(layout, d, g, plan.hosts, max_listed));
    }
    plan.dims.push_back(std::move(dim));
  }

  if (std::optional<PlanWarning> w = TensorParallelWarning(plan)) {
    plan.warnings.push_back(std::move(*w));
  }
  return plan;
}

absl::StatusOr<Plan> BuildPlanFromOptions(const PlanOptions& options) {
  absl::StatusOr<MeshSpec> spec = ParseMeshSpec(options.mesh);
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--mesh '", options.mesh, "' is malformed: ", spec.status().message()));
  }
  absl::StatusOr<MeshLayout> layout =
      MeshLayout::Create(spec->shape, spec->names);
  if (!layout.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--mesh '", options.mesh, "' is not a valid mesh: ",
        layout.status().message()));
  }
  return BuildPlan(*layout, PlanSettings{
                                .ranks_per_host = options.ranks_per_host,
                                .rank = options.rank,
                                .color_by = options.color_by.value_or(""),
                            });
}

}  // namespace vemesh::plan
