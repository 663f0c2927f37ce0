// tools/plan/dim_order.h
//
// A dimension order that keeps one dimension's groups inside a host.
//
// Tensor parallelism exchanges activations every layer, so its groups want the
// fast links inside one host. When `PP=2,TP=4,DP=2` on hosts of 4 puts each TP
// group across two hosts, reordering the mesh (same sizes, same names) fixes
// it:
//
//   absl::StatusOr<OrderSuggestion> s =
//       SuggestOrderKeepingInHost(layout, "TP", hosts);
//   s->found;        // true
//   s->order;        // {"PP", "DP", "TP"}
//   s->mesh_spec;    // "PP=2,DP=2,TP=4"
//
// Every candidate is checked with AnalyzeDimLocality on the reordered layout,
// so a suggestion is proven, not a rule of thumb. Candidates are tried in this
// order and the first that works wins: the dimension moved innermost (the
// usual fix, other dimensions keep their order), moved next to innermost, then
// every permutation, closest to the given order (fewest swapped pairs) first.
// Orders are searched exhaustively up to kMaxSearchDims dimensions; beyond
// that only "move it innermost" and "move it next to innermost" are tried.

#ifndef VEMESH_TOOLS_PLAN_DIM_ORDER_H_
#define VEMESH_TOOLS_PLAN_DIM_ORDER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/placement/host_locality.h"

namespace vemesh::plan {

inline constexpr size_t kMaxSearchDims = 6;

struct OrderSuggestion {
  bool found = false;
  std::vector<std::string> order;  // dimension names, outermost first
  std::string mesh_spec;           // the --mesh text of that order
  // Why nothing was found, when found is false (e.g. the group is larger
  // than a host).
  std::string reason;
};

// NotFound when `dim` is not a dimension of `layout`.
absl::StatusOr<OrderSuggestion> SuggestOrderKeepingInHost(
    const MeshLayout& layout, absl::string_view dim, const HostMap& hosts);

}  // namespace vemesh::plan

#endif  // VEMESH_TOOLS_PLAN_DIM_ORDER_H_
