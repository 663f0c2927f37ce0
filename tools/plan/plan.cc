#include "tools/plan/plan.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tools/plan/group_summary.h"
#include "vemesh/layout/mesh_spec.h"

namespace vemesh::plan {
namespace {

std::string SpecOf(const MeshLayout& layout) {
  return FormatMeshSpec(MeshSpec{layout.shape(), layout.dim_names()});
}

// Ceil(a / b) without the overflow of (a + b - 1) / b near 2^63.
int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0); }

absl::StatusOr<HostMap> MakeHostMap(const PlanSettings& s, int64_t world) {
  if (s.ranks_per_host.has_value() &&
      (*s.ranks_per_host < 1 || *s.ranks_per_host > kMaxRanksPerHost)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ranks-per-host expects an integer from 1 to ",
                     kMaxRanksPerHost, ", got ", *s.ranks_per_host));
  }
  if (s.hosts.has_value() && (*s.hosts < 1 || *s.hosts > world)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--hosts expects an integer from 1 to the mesh's ", world,
                     " ranks, got ", *s.hosts));
  }
  if (s.placement == PlacementPolicy::kHostfile) {
    if (s.ranks_per_host.has_value() || s.hosts.has_value()) {
      return absl::InvalidArgumentError(
          "--ranks-per-host and --hosts do not apply to --placement "
          "hostfile:FILE: the hosts and their slots come from the file");
    }
    if (!s.hostfile.has_value()) {
      return absl::InvalidArgumentError(
          "--placement hostfile needs a file: expected hostfile:FILE");
    }
    return HostMapFromHostfile(*s.hostfile, world);
  }
  // Both given: they must describe the same hosts.
  if (s.ranks_per_host.has_value() && s.hosts.has_value() &&
      CeilDiv(world, *s.ranks_per_host) != *s.hosts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--hosts ", *s.hosts, " and --ranks-per-host ", *s.ranks_per_host,
        " disagree: ", world, " ranks at ", *s.ranks_per_host,
        " per host fill ", CeilDiv(world, *s.ranks_per_host),
        " hosts; expected one of the two flags, or matching values"));
  }
  if (s.placement == PlacementPolicy::kCyclic) {
    const int64_t hosts = s.hosts.value_or(
        CeilDiv(world, s.ranks_per_host.value_or(kDefaultRanksPerHost)));
    return HostMap::Cyclic(hosts, world);
  }
  int64_t per_host = s.ranks_per_host.value_or(kDefaultRanksPerHost);
  if (!s.ranks_per_host.has_value() && s.hosts.has_value()) {
    per_host = CeilDiv(world, *s.hosts);
    if (per_host > kMaxRanksPerHost) {
      return absl::InvalidArgumentError(
          absl::StrCat("--hosts ", *s.hosts, " puts ", per_host, " of the ",
                       world, " ranks on a host: expected at most ",
                       kMaxRanksPerHost, " per host (pass more hosts)"));
    }
    if (CeilDiv(world, per_host) != *s.hosts) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--hosts ", *s.hosts, " cannot be filled in blocks: ", world,
          " ranks at ", per_host, " per host fill ", CeilDiv(world, per_host),
          " hosts; expected a host count that blocks of equal size fill"));
    }
  }
  return HostMap::Block(per_host, world);
}

// The launcher flags of a placement, for a warning: "`srun
// --distribution=block`, `mpirun --map-by slot`".
std::string PlacementFlags(PlacementPolicy policy) {
  return policy == PlacementPolicy::kCyclic
             ? "`srun --distribution=cyclic`, `mpirun --map-by node`"
             : "`srun --distribution=block`, `mpirun --map-by slot`";
}

// The same hosts under the other of block and cyclic, when that keeps the
// groups of `dim` inside one host. None for a hostfile, or for blocks larger
// than kMaxRanksPerHost.
std::optional<PlacementPolicy> OtherPlacementKeepingInHost(
    const MeshLayout& layout, int64_t dim, const HostMap& hosts) {
  const int64_t world = layout.size();
  const int64_t count = hosts.host_count();
  std::optional<HostMap> other;
  if (hosts.policy() == PlacementPolicy::kBlock && count > 1) {
    other = HostMap::Cyclic(count, world);
  } else if (hosts.policy() == PlacementPolicy::kCyclic &&
             CeilDiv(world, count) <= kMaxRanksPerHost &&
             CeilDiv(world, CeilDiv(world, count)) == count) {
    // Hosts above kMaxRanksPerHost are not offered: the block count is
    // O(ranks per host), and --ranks-per-host could not state them.
    other = HostMap::Block(CeilDiv(world, count), world);
  }
  if (!other.has_value()) return std::nullopt;
  if (AnalyzeDimLocality(layout, dim, *other).crossing_groups != 0) {
    return std::nullopt;
  }
  return other->policy();
}

// Warns when a latency-sensitive dimension's groups leave a host, with an
// order (verified) or a placement that brings them back.
std::optional<PlanWarning> CrossingWarning(const Plan& plan, int64_t d) {
  const DimLocality& loc = plan.dims[d].locality;
  if (loc.crossing_groups == 0) return std::nullopt;
  const std::string& name = plan.dims[d].name;
  PlanWarning w;
  w.code = absl::StrCat(absl::AsciiStrToLower(name), "-crosses-hosts");
  w.dim = name;
  w.suggestion = SuggestOrderKeepingInHost(plan.layout, name, plan.hosts)
                     .value_or(OrderSuggestion{});
  w.placement_fix = OtherPlacementKeepingInHost(plan.layout, d, plan.hosts);
  w.message = absl::StrCat(
      loc.crossing_groups, " of ", loc.group_count, " ", name,
      " groups cross hosts (", plan.hosts.Describe(), "); ",
      absl::EqualsIgnoreCase(name, kTensorParallelDim)
          ? "tensor parallelism wants"
          : absl::StrCat(name,
                         " is latency-sensitive (--latency-sensitive) "
                         "and wants"),
      " the fast links inside a host. ");
  if (w.suggestion.found) {
    absl::StrAppend(&w.message, "Suggested order: --mesh ",
                    w.suggestion.mesh_spec, " keeps every ", name,
                    " group inside one host.");
  } else {
    std::string reason = w.suggestion.reason;
    if (!reason.empty()) reason[0] = absl::ascii_toupper(reason[0]);
    absl::StrAppend(&w.message, reason, ".");
  }
  if (w.placement_fix.has_value()) {
    absl::StrAppend(&w.message, w.suggestion.found ? " Or launch" : " Launch",
                    " with ", PlacementPolicyName(*w.placement_fix),
                    " placement (", PlacementFlags(*w.placement_fix),
                    "): it keeps every ", name, " group inside one host.");
  }
  return w;
}

// The dimensions to warn about, in mesh order.
absl::StatusOr<std::vector<int64_t>> LatencySensitiveDims(
    const MeshLayout& layout, const PlanSettings& settings,
    absl::string_view spec) {
  std::vector<int64_t> dims;
  if (!settings.latency_sensitive.has_value()) {
    // Roles match names ignoring case (MeshLayout::find_role, as the
    // runtime's MeshOptions::latency_sensitive_dims do).
    if (absl::StatusOr<int64_t> tp = layout.find_role(kTensorParallelDim);
        tp.ok()) {
      dims.push_back(*tp);
    }
    return dims;
  }
  std::vector<std::string> unknown;
  for (const std::string& name : *settings.latency_sensitive) {
    absl::StatusOr<int64_t> d = layout.find_role(name);
    if (absl::IsNotFound(d.status())) {
      unknown.push_back(name);
    } else if (!d.ok()) {
      return d.status();  // two dimensions differ from `name` only by case
    } else if (std::find(dims.begin(), dims.end(), *d) == dims.end()) {
      dims.push_back(*d);
    }
  }
  if (!unknown.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--latency-sensitive names ", absl::StrJoin(unknown, ", "),
                     unknown.size() == 1 ? ", which is not a dimension"
                                         : ", which are not dimensions",
                     " of ", spec, "; expected names from ",
                     absl::StrJoin(layout.dim_names(), ", ")));
  }
  std::sort(dims.begin(), dims.end());
  return dims;
}

// "--flatten EP=DP,TP" / "--view DP,TP", as the user wrote it.
std::string GroupFlag(const GroupSpec& spec) {
  return spec.flattened ? absl::StrCat("--flatten ", spec.name, "=",
                                       absl::StrJoin(spec.dims, ","))
                        : absl::StrCat("--view ", spec.name);
}

// The groups of a --flatten or --view entry: the layout with its dimensions
// merged into one (MeshLayout::flatten), planned as that one dimension.
absl::Status AddDerived(Plan& plan, const GroupSpec& spec) {
  const MeshLayout& layout = plan.layout;
  absl::StatusOr<MeshLayout> flat = layout.flatten(spec.dims, spec.name);
  if (!flat.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(GroupFlag(spec), " does not fit ", plan.mesh_spec, ": ",
                     flat.status().message()));
  }
  const bool default_flat = IsDefaultLayout(*flat);
  if (!default_flat && flat->size() > kMaxScannedRanks) {
    return absl::InvalidArgumentError(absl::StrCat(
        GroupFlag(spec), ": ", plan.mesh_spec, " has ", flat->size(),
        " ranks, and groups over dimensions that are not adjacent (in mesh "
        "order) are planned by visiting every rank: expected at most ",
        kMaxScannedRanks, " ranks for them"));
  }
  const int64_t d = flat->find_dim(spec.name).value_or(0);
  DimPlan dim;
  dim.name = spec.name;
  dim.size = flat->shape()[d];
  dim.stride = default_flat ? RowMajorStrides(*flat)[d] : 0;
  dim.spans = spec.dims;
  dim.flattened = spec.flattened;
  for (size_t i = 1; i < spec.dims.size(); ++i) {
    dim.adjacent =
        dim.adjacent && layout.find_dim(spec.dims[i]).value_or(-1) ==
                            layout.find_dim(spec.dims[i - 1]).value_or(-1) + 1;
  }
  dim.locality = AnalyzeDimLocality(*flat, d, plan.hosts);
  const int64_t groups_each_end = plan.summarized ? kSummaryGroups : kListLimit;
  const int64_t max_listed = plan.summarized ? kMaxListedMembers : kListLimit;
  for (int64_t g : SampleIndices(dim.locality.group_count, groups_each_end,
                                 groups_each_end)) {
    dim.groups.push_back(SummarizeGroup(*flat, d, g, plan.hosts, max_listed));
  }
  plan.derived.push_back(std::move(dim));
  if (plan.rank_view.has_value()) {
    RankView::DimView view =
        BuildRankView(*flat, plan.hosts, plan.rank_view->rank).dims[d];
    plan.rank_view->derived.push_back(std::move(view));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Plan> BuildPlan(const MeshLayout& layout,
                               const PlanSettings& settings) {
  if (!IsDefaultLayout(layout) && layout.size() > kMaxScannedRanks) {
    return absl::InvalidArgumentError(absl::StrCat(
        SpecOf(layout), " has ", layout.size(),
        " ranks and is not the default row-major arange (a rank table or a "
        "sub-mesh), so planning it visits every rank: expected at most ",
        kMaxScannedRanks, " ranks for such a layout"));
  }
  Plan plan(layout);
  plan.mesh_spec = SpecOf(layout);
  absl::StatusOr<HostMap> hosts = MakeHostMap(settings, layout.size());
  if (!hosts.ok()) return hosts.status();
  plan.hosts = *std::move(hosts);
  if (settings.placement == PlacementPolicy::kHostfile) {
    plan.hostfile_path = settings.hostfile->path;
  }
  plan.launch = LaunchFlags(plan.hosts, plan.hostfile_path);
  absl::StatusOr<std::vector<int64_t>> sensitive =
      LatencySensitiveDims(layout, settings, plan.mesh_spec);
  if (!sensitive.ok()) return sensitive.status();
  plan.summarized = layout.size() > kListLimit;

  const GroupSpec* color_group = nullptr;
  if (settings.color_by.empty()) {
    plan.color_dim =
        layout.find_dim(kTensorParallelDim).value_or(layout.ndim() - 1);
  } else if (std::optional<int64_t> d = layout.find_dim(settings.color_by)) {
    plan.color_dim = *d;
  } else {
    for (const GroupSpec& g : settings.groups) {
      if (g.name == settings.color_by) color_group = &g;
    }
    if (color_group == nullptr) {
      std::vector<std::string> names = layout.dim_names();
      for (const GroupSpec& g : settings.groups) names.push_back(g.name);
      return absl::InvalidArgumentError(absl::StrCat(
          "--color-by '", settings.color_by, "' is not a dimension of ",
          plan.mesh_spec,
          settings.groups.empty() ? "" : " nor a --flatten or --view name",
          "; expected one of ", absl::StrJoin(names, ", ")));
    }
  }
  if (color_group != nullptr) {
    plan.color_dims = color_group->dims;
    plan.color_name = color_group->name;
    // An unknown dimension in it is reported below, by its flag.
    plan.color_dim = layout.find_dim(color_group->dims[0]).value_or(0);
  } else {
    plan.color_name = layout.dim_name(plan.color_dim);
    plan.color_dims = {plan.color_name};
  }
  if (settings.rank.has_value()) {
    const int64_t r = *settings.rank;
    if (!layout.contains(r)) {
      return absl::OutOfRangeError(
          absl::StrCat("--rank ", r, " is out of range: ", plan.mesh_spec,
                       " has ranks 0..", layout.size() - 1));
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
    const int64_t max_listed = plan.summarized ? kMaxListedMembers : kListLimit;
    for (int64_t g : SampleIndices(dim.locality.group_count, groups_each_end,
                                   groups_each_end)) {
      dim.groups.push_back(
          SummarizeGroup(layout, d, g, plan.hosts, max_listed));
    }
    plan.dims.push_back(std::move(dim));
  }

  for (const GroupSpec& spec : settings.groups) {
    if (absl::Status s = AddDerived(plan, spec); !s.ok()) return s;
  }

  for (int64_t d : *sensitive) {
    if (std::optional<PlanWarning> w = CrossingWarning(plan, d)) {
      plan.warnings.push_back(std::move(*w));
    }
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
    return absl::InvalidArgumentError(
        absl::StrCat("--mesh '", options.mesh,
                     "' is not a valid mesh: ", layout.status().message()));
  }
  PlanSettings settings{
      .ranks_per_host = options.ranks_per_host,
      .rank = options.rank,
      .color_by = options.color_by.value_or(""),
      .placement = options.placement,
      .hosts = options.hosts,
      .hostfile = std::nullopt,
      .latency_sensitive = options.latency_sensitive,
      .groups = options.groups,
  };
  if (options.placement == PlacementPolicy::kHostfile) {
    absl::StatusOr<Hostfile> hostfile = LoadHostfile(options.hostfile);
    if (!hostfile.ok()) return hostfile.status();
    settings.hostfile = *std::move(hostfile);
  }
  absl::StatusOr<Plan> plan = BuildPlan(*layout, settings);
  if (!plan.ok() || options.also_meshes.empty()) return plan;
  std::vector<NamedLayout> meshes = {{"default", *layout, {}}};
  for (const GroupSpec& g : options.groups) {
    if (g.flattened) meshes[0].flattened.emplace_back(g.name, g.dims);
  }
  for (const auto& [name, text] : options.also_meshes) {
    absl::StatusOr<MeshSpec> also = ParseMeshSpec(text);
    if (!also.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--also-mesh '", name, ":", text,
                       "' is malformed: ", also.status().message()));
    }
    absl::StatusOr<MeshLayout> l = MeshLayout::Create(also->shape, also->names);
    if (!l.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--also-mesh '", name, ":", text,
                       "' is not a valid mesh: ", l.status().message()));
    }
    meshes.push_back({name, *std::move(l), {}});
  }
  absl::StatusOr<MeshSharing> sharing = ComputeMeshSharing(meshes);
  if (!sharing.ok()) return sharing.status();
  plan->sharing = *std::move(sharing);
  return plan;
}

}  // namespace vemesh::plan
