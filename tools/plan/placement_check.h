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
//   absl::StatusOr<Placement> job = LoadJobPlacement("placement.json");
//   PlacementCheck c = CheckPlacement(*plan, *job);
//   c.matches;       // false
//   c.differences;   // {"TP: plan 0 crossing groups, job 4", ...}
//   c.hint;          // "the job's placement is cyclic over 2 hosts; ..."
//
// Host names may differ between plan and job (a plan numbers its hosts):
// what is compared is which ranks share a host, the mesh, the world size and
// every dimension's crossing-group count. The file is read by
// Placement::FromJson (vemesh/placement/placement.h), beside the writer:
// malformed files are InvalidArgument naming the field; sizes are bounded
// (kMaxPlacementJsonBytes, kMaxPlacementJsonRanks) before anything is
// allocated for them.

#ifndef VEMESH_TOOLS_PLAN_PLACEMENT_CHECK_H_
#define VEMESH_TOOLS_PLAN_PLACEMENT_CHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tools/plan/plan.h"
#include "vemesh/placement/placement.h"

namespace vemesh::plan {

// Ranks that differ, named one by one before "... and N more".
inline constexpr int64_t kMaxNamedRanks = 3;

// Reads at most kMaxPlacementJsonBytes of `path`, then Placement::FromJson.
absl::StatusOr<Placement> LoadJobPlacement(const std::string& path);

struct PlacementCheck {
  bool matches = true;
  std::vector<std::string> differences;  // one line each
  // What the job's placement looks like and how to launch as planned; empty
  // when it matches or cannot be told.
  std::string hint;
};

// The plan's world must be at most kMaxPlacementJsonRanks (InvalidArgument
// otherwise): every rank's host is compared.
absl::StatusOr<PlacementCheck> CheckPlacement(const Plan& plan,
                                              const Placement& job);

// The check as text: "plan matches the job's placement: ..." or the
// differences and the hint.
std::string RenderCheck(const Plan& plan, const Placement& job,
                        const PlacementCheck& check);
// {"matches": bool, "differences": [...], "hint": "..." or null}.
std::string RenderCheckJson(const PlacementCheck& check);

}  // namespace vemesh::plan

#endif  // VEMESH_TOOLS_PLAN_PLACEMENT_CHECK_H_
