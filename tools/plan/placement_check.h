// tools/plan/placement_check.h
//
// `vemesh plan --check FILE`: does a live job's placement match the plan?
// FILE is what DeviceMesh::get_placement().ToJson() wrote in the job:
//
//   {"vemesh_placement": 1, "world_size": 8,
//    "mesh": {"dim_names": ["PP","DP","TP"], "shape": [2,2,2]},
//    "hosts": ["node0", "node1"], "rank_hosts": [0,0,0,0,1,1,1,1],
//    "dims": [{"name": "PP", "group_count": 4, "group_size": 2,
//              "crossing_groups": 4}, ...]}
//
//   absl::StatusOr<JobPlacement> job = LoadJobPlacement("placement.json");
//   PlacementCheck c = CheckPlacement(*plan, *job);
//   c.matches;       // false
//   c.differences;   // {"TP: plan 0 crossing groups, job 4", ...}
//   c.hint;          // "the job's placement is cyclic over 2 hosts; ..."
//
// Host names may differ between plan and job (a plan numbers its hosts):
// what is compared is which ranks share a host, the mesh, the world size and
// every dimension's crossing-group count. Malformed files are
// InvalidArgument naming the field; sizes are bounded before anything is
// allocated for them.

#ifndef VEMESH_TOOLS_PLAN_PLACEMENT_CHECK_H_
#define VEMESH_TOOLS_PLAN_PLACEMENT_CHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tools/plan/plan.h"

namespace vemesh::plan {

// The largest placement file and world --check reads: a world of 2^22 ranks
// writes about 10 MB of rank_hosts.
inline constexpr int64_t kMaxPlacementFileBytes = int64_t{64} << 20;
inline constexpr int64_t kMaxCheckedRanks = int64_t{1} << 22;
// Ranks that differ, named one by one before "... and N more".
inline constexpr int64_t kMaxNamedRanks = 3;

struct JobPlacement {
  struct Dim {
    std::string name;
    int64_t group_count = 0;
    int64_t group_size = 0;
    int64_t crossing_groups = 0;
  };
  int64_t world_size = 0;
  std::vector<std::string> dim_names;
  std::vector<int64_t> shape;
  std::vector<std::string> hosts;
  std::vector<int64_t> rank_hosts;
  std::vector<Dim> dims;
};

// `source` names the file in messages.
absl::StatusOr<JobPlacement> ParseJobPlacement(absl::string_view text,
                                               absl::string_view source);
// Reads at most kMaxPlacementFileBytes of `path`, then parses it.
absl::StatusOr<JobPlacement> LoadJobPlacement(const std::string& path);

struct PlacementCheck {
  bool matches = true;
  std::vector<std::string> differences;  // one line each
  // What the job's placement looks like and how to launch as planned; empty
  // when it matches or cannot be told.
  std::string hint;
};

// The plan's world must be at most kMaxCheckedRanks (InvalidArgument
// otherwise): every rank's host is compared.
absl::StatusOr<PlacementCheck> CheckPlacement(const Plan& plan,
                                              const JobPlacement& job);

// The check as text: "plan matches the job's placement: ..." or the
// differences and the hint.
std::string RenderCheck(const Plan& plan, const JobPlacement& job,
                        const PlacementCheck& check);
// {"matches": bool, "differences": [...], "hint": "..." or null}.
std::string RenderCheckJson(const PlacementCheck& check);

}  // namespace vemesh::plan

#endif  // VEMESH_TOOLS_PLAN_PLACEMENT_CHECK_H_
