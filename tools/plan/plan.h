// tools/plan/plan.h
//
// Plan: everything `vemesh plan` shows, computed once from a layout and a
// placement (block, cyclic or a hostfile), then handed to a renderer (table,
// JSON, SVG). Building a plan
// does no communication and never lists a big world: for more than
// kListLimit ranks, only the first and last few ranks and groups are kept.
//
//   absl::StatusOr<MeshLayout> layout = MeshLayout::Create({2, 2, 2});
//   absl::StatusOr<Plan> plan =
//       BuildPlan(*layout, {.ranks_per_host = 4, .rank = 5});
//   plan->dims[2].locality.locality;   // TP: Locality::kIntraHost
//   plan->rank_view->host;             // 1
//   plan->warnings;                    // empty: TP stays inside hosts
//   plan->launch[1].command;  // "srun -N 2 -n 8 --ntasks-per-node=4
//                             //  --distribution=block"
//
// Placements: PlanSettings::placement with ranks_per_host and/or hosts
// (block, cyclic), or a parsed hostfile. Latency-sensitive dimensions
// (default TP) get a warning when their groups cross hosts, naming the order
// or placement that keeps them inside when there is one.
//
// BuildPlanFromOptions does the same from the command line's options,
// parsing --mesh first.

#ifndef VEMESH_TOOLS_PLAN_PLAN_H_
#define VEMESH_TOOLS_PLAN_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/plan/dim_order.h"
#include "tools/plan/group_summary.h"
#include "tools/plan/hostfile.h"
#include "tools/plan/launch_flags.h"
#include "tools/plan/mesh_sharing.h"
#include "tools/plan/plan_options.h"
#include "tools/plan/rank_view.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/placement/host_locality.h"

namespace vemesh::plan {

// Worlds larger than this are summarised in every format.
inline constexpr int64_t kListLimit = 256;
// A layout that is not the default arange (a rank table, a sub-mesh) has no
// arithmetic shortcut: its host locality is found by visiting every rank.
// BuildPlan refuses such layouts above this size instead of running for
// minutes. Default layouts have no limit: every step is O(ndim) or bounded by
// the ranks per host.
inline constexpr int64_t kMaxScannedRanks = int64_t{1} << 22;
// In a summary: ranks shown at each end, groups shown at each end.
inline constexpr int64_t kSummaryRanks = 8;
inline constexpr int64_t kSummaryGroups = 3;

// The dimension whose groups must stay inside a host: tensor parallelism.
// It is the default of --latency-sensitive.
inline constexpr char kTensorParallelDim[] = "TP";

struct RankRow {
  int64_t rank = 0;
  Coordinate coordinate;
  int64_t host = 0;
  int64_t local = 0;  // slot on the host
};

struct DimPlan {
  std::string name;
  int64_t size = 0;
  // Rank distance between neighbours along this dimension; 0 when the
  // layout has an explicit rank table (no constant stride).
  int64_t stride = 0;
  DimLocality locality;
  std::vector<GroupSummary> groups;  // all, or the first and last few
  // A --flatten or --view entry (Plan::derived): the mesh dimensions it
  // spans in the order given, and whether they stand side by side in the
  // mesh in that order (non-adjacent groups are strided). Empty for a
  // dimension of the mesh.
  std::vector<std::string> spans;
  bool flattened = false;  // --flatten NAME=...; false for --view
  bool adjacent = true;
};

struct PlanWarning {
  std::string code;  // "<dim in lower case>-crosses-hosts": "tp-crosses-hosts"
  std::string dim;
  std::string message;
  OrderSuggestion suggestion;
  // Another placement over the same hosts that keeps the groups inside.
  std::optional<PlacementPolicy> placement_fix;
};

struct PlanSettings {
  // Block: unset means kDefaultRanksPerHost, or world / hosts when `hosts`
  // is set. Cyclic: the host count is `hosts`, else what blocks of
  // ranks_per_host would need. Hostfile: both must be unset.
  std::optional<int64_t> ranks_per_host;
  std::optional<int64_t> rank;
  // Dimension whose groups the SVG colours; empty: TP, else the last one.
  std::string color_by;
  PlacementPolicy placement = PlacementPolicy::kBlock;
  std::optional<int64_t> hosts;
  std::optional<Hostfile> hostfile;  // required for kHostfile
  // Dimensions whose groups should stay inside a host. Unset: TP when the
  // mesh has it. Set: every name must be a dimension of the mesh.
  std::optional<std::vector<std::string>> latency_sensitive;
  // --flatten and --view: groups over several dimensions, shown after the
  // mesh's own (color_by may name one: its NAME, or a view's "DP,TP").
  std::vector<GroupSpec> groups;
};

struct Plan {
  explicit Plan(MeshLayout l) : layout(std::move(l)) {}

  MeshLayout layout;
  std::string mesh_spec;  // "PP=2,DP=2,TP=2"
  HostMap hosts;
  std::string hostfile_path;       // hostfile placement: the file read
  std::vector<LaunchLine> launch;  // the placement in launchers' flags
  bool summarized = false;
  int64_t color_dim = 0;  // the first of color_dims
  // The dimensions the SVG's colour groups span (several for a --flatten
  // or --view name) and the name the legend gives them.
  std::vector<std::string> color_dims;
  std::string color_name;
  std::vector<RankRow> ranks;  // all, or the first and last few
  std::vector<DimPlan> dims;
  std::vector<DimPlan> derived;  // --flatten and --view, in order
  std::vector<PlanWarning> warnings;
  std::optional<RankView> rank_view;
  // With --also-mesh: every mesh and the groups they share.
  std::optional<MeshSharing> sharing;
};

// Errors (InvalidArgument / OutOfRange, naming the value): ranks_per_host
// outside 1..kMaxRanksPerHost, hosts outside 1..world, ranks_per_host and
// hosts that disagree, a hostfile with fewer slots than ranks, a rank outside
// the mesh, an unknown color_by or latency-sensitive name, a layout that is
// not an arange with more than kMaxScannedRanks ranks, a --flatten or --view
// that names an unknown or repeated dimension (or a flattened name another
// dimension has).
absl::StatusOr<Plan> BuildPlan(const MeshLayout& layout,
                               const PlanSettings& settings);

// Parses options.mesh (errors name the text), reads the hostfile, and builds
// the plan.
absl::StatusOr<Plan> BuildPlanFromOptions(const PlanOptions& options);

}  // namespace vemesh::plan

#endif  // VEMESH_TOOLS_PLAN_PLAN_H_
