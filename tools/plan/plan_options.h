// tools/plan/plan_options.h
//
// The command line of `vemesh plan`, parsed into a value. Parsing is pure (no
// globals, no exit), so tests can feed it argument lists directly:
//
//   std::vector<std::string> args = {"--mesh", "PP=2,DP=2,TP=2", "--rank=5"};
//   absl::StatusOr<PlanOptions> opts = ParsePlanArgs(args);
//   opts->mesh;    // "PP=2,DP=2,TP=2"
//   opts->rank;    // 5
//
// Both `--flag value` and `--flag=value` are accepted. Errors are
// InvalidArgument and name the flag, the bad value and what was expected.
// Checks that need the mesh (rank in range, --color-by a known dimension)
// happen later, in BuildPlan. --flatten and --view may be repeated.

#ifndef VEMESH_TOOLS_PLAN_PLAN_OPTIONS_H_
#define VEMESH_TOOLS_PLAN_PLAN_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "vemesh/placement/host_map.h"

namespace vemesh::plan {

enum class OutputFormat { kTable, kJson, kSvg };

// "table", "json" or "svg"; InvalidArgument naming the value otherwise.
absl::StatusOr<OutputFormat> ParseOutputFormat(absl::string_view text);
absl::string_view OutputFormatName(OutputFormat format);

// Hosts of 8 devices are the common GPU node; the default follows it.
inline constexpr int64_t kDefaultRanksPerHost = 8;
// The largest --ranks-per-host: far above any real host, and it bounds the
// host-locality arithmetic (O(ranks per host) per dimension and candidate
// order), so a plan stays well under a second for any mesh.
inline constexpr int64_t kMaxRanksPerHost = int64_t{1} << 12;

// A group over several dimensions of the mesh, adjacent or not:
//   --flatten EP=DP,TP   DeviceMesh::flatten({"DP", "TP"}, "EP")
//   --view DP,TP         mesh[{"DP", "TP"}] (a 2-D sub-mesh; its groups are
//                        the same rank sets as the flattened name's)
struct GroupSpec {
  bool flattened = false;  // --flatten (true) or --view
  std::string name;        // flatten: its NAME; view: "DP,TP"
  std::vector<std::string> dims;
};

// "EP=DP,TP" (flatten) or "DP,TP" (view) into a GroupSpec; InvalidArgument
// naming the flag and the text otherwise.
absl::StatusOr<GroupSpec> ParseGroupSpec(bool flattened,
                                         absl::string_view text);

struct PlanOptions {
  std::string mesh;             // --mesh, e.g. "PP=2,DP=2,TP=2"
  std::optional<int64_t> rank;  // --rank: show this rank's view
  // --ranks-per-host; unset: kDefaultRanksPerHost, or from --hosts.
  std::optional<int64_t> ranks_per_host;
  // --placement block|cyclic|hostfile:FILE (FILE kept in `hostfile`).
  PlacementPolicy placement = PlacementPolicy::kBlock;
  std::string hostfile;
  std::optional<int64_t> hosts;  // --hosts N
  // --latency-sensitive TP,EP,CP; unset: TP (when the mesh has it).
  std::optional<std::vector<std::string>> latency_sensitive;
  std::optional<std::string> check;  // --check FILE: a job's placement JSON
  OutputFormat format = OutputFormat::kTable;  // --format
  std::optional<std::string> color_by;  // --color-by (default: TP, else last)
  std::vector<GroupSpec> groups;        // --flatten and --view, in order
  // --also-mesh NAME:SPEC, in order: other meshes over the same ranks.
  std::vector<std::pair<std::string, std::string>> also_meshes;
  std::optional<std::string> output;  // --output FILE (default: stdout)
  bool help = false;                  // --help / -h
};

// Parses the arguments that follow `plan`. --mesh is required unless --help
// is given.
absl::StatusOr<PlanOptions> ParsePlanArgs(absl::Span<const std::string> args);

// The text that `vemesh plan --help` prints.
std::string PlanUsage();

}  // namespace vemesh::plan

#endif  // VEMESH_TOOLS_PLAN_PLAN_OPTIONS_H_
