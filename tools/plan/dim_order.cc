#include "tools/plan/dim_order.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "vemesh/layout/mesh_spec.h"

namespace vemesh::plan {
namespace {

// Number of pairs whose relative order differs between two permutations of
// 0..n-1 (Kendall tau distance).
int64_t SwappedPairs(const std::vector<int>& perm) {
  int64_t swaps = 0;
  for (size_t i = 0; i < perm.size(); ++i) {
    for (size_t j = i + 1; j < perm.size(); ++j) swaps += perm[i] > perm[j];
  }
  return swaps;
}

// Whether dimension `target` keeps its groups inside a host in the layout
// that lists the dimensions in order `perm`.
bool KeepsInHost(const std::vector<int64_t>& shape,
                 const std::vector<std::string>& names,
                 const std::vector<int>& perm, int target,
                 const HostMap& hosts) {
  std::vector<int64_t> s;
  std::vector<std::string> n;
  int64_t target_pos = 0;
  for (size_t i = 0; i < perm.size(); ++i) {
    s.push_back(shape[perm[i]]);
    n.push_back(names[perm[i]]);
    if (perm[i] == target) target_pos = static_cast<int64_t>(i);
  }
  absl::StatusOr<MeshLayout> layout = MeshLayout::Create(s, n);
  if (!layout.ok()) return false;
  return AnalyzeDimLocality(*layout, target_pos, hosts).crossing_groups == 0;
}

// The given order with `target` moved to position `pos`.
std::vector<int> MovedTo(int ndim, int target, int pos) {
  std::vector<int> perm;
  for (int i = 0; i < ndim; ++i) {
    if (i != target) perm.push_back(i);
  }
  perm.insert(perm.begin() + pos, target);
  return perm;
}

}  // namespace

absl::StatusOr<OrderSuggestion> SuggestOrderKeepingInHost(
    const MeshLayout& layout, absl::string_view dim, const HostMap& hosts) {
  absl::StatusOr<int64_t> target_or = layout.dim_index(dim);
  if (!target_or.ok()) return target_or.status();
  const int target = static_cast<int>(*target_or);
  const std::vector<int64_t> shape = layout.shape();
  const std::vector<std::string> names = layout.dim_names();
  const int ndim = static_cast<int>(shape.size());

  OrderSuggestion out;
  const int64_t h = hosts.max_host_size();
  if (shape[target] > h) {
    out.reason = absl::StrCat(names[target], "=", shape[target],
                              " has more ranks than a host holds (", h,
                              "): no order keeps its groups in one host");
    return out;
  }

  // Candidates, best first: moved innermost, moved next to innermost, then
  // (for small meshes) every permutation by closeness to the given order.
  std::vector<std::vector<int>> candidates = {MovedTo(ndim, target, ndim - 1)};
  if (ndim >= 2) candidates.push_back(MovedTo(ndim, target, ndim - 2));
  if (static_cast<size_t>(ndim) <= kMaxSearchDims) {
    std::vector<int> perm(ndim);
    std::iota(perm.begin(), perm.end(), 0);
    std::vector<std::vector<int>> all;
    do {
      all.push_back(perm);
    } while (std::next_permutation(perm.begin(), perm.end()));
    std::stable_sort(all.begin(), all.end(),
                     [](const std::vector<int>& a, const std::vector<int>& b) {
                       return SwappedPairs(a) < SwappedPairs(b);
                     });
    candidates.insert(candidates.end(), all.begin(), all.end());
  }

  std::vector<int> identity(ndim);
  std::iota(identity.begin(), identity.end(), 0);
  for (const std::vector<int>& perm : candidates) {
    if (perm == identity) continue;  // the order we are asked to fix
    if (!KeepsInHost(shape, names, perm, target, hosts)) continue;
    out.found = true;
    MeshSpec spec;
    for (int i : perm) {
      out.order.push_back(names[i]);
      spec.shape.push_back(shape[i]);
      spec.names.push_back(names[i]);
    }
    out.mesh_spec = FormatMeshSpec(spec);
    return out;
  }
  out.reason = absl::StrCat(
      "no order of the dimensions keeps every ", names[target],
      " group in one host with ", hosts.Describe(),
      hosts.policy() == PlacementPolicy::kBlock
          ? absl::StrCat("; choose --ranks-per-host a multiple of ",
                         names[target], "=", shape[target])
          : "");
  return out;
}

}  // namespace vemesh::plan
