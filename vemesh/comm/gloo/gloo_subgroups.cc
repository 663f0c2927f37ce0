// GlooCommunicator's new groups from an existing one: a subgroup, many
// subgroups connected at once (gloo_pairs.h), split and shrink.

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/comm/gloo/internal/gloo_pairs.h"

namespace vemesh {

absl::StatusOr<std::shared_ptr<GlooCommunicator>> GlooCommunicator::subgroup(
    absl::string_view name, std::vector<int> members) {
  int new_rank = -1;
  std::vector<int> global;
  global.reserve(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    const int m = members[i];
    if (m < 0 || m >= size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("GlooCommunicator::subgroup '", name, "': member ", m,
                       " is outside this group of ", size_, " ranks"));
    }
    if (m == rank_) new_rank = static_cast<int>(i);
    global.push_back(ranks_[m]);
  }
  if (new_rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GlooCommunicator::subgroup '", name, "': this rank (", rank_,
        ") is not among the members [", absl::StrJoin(members, ", "), "]"));
  }
  return Connect(store_, absl::StrCat(prefix_, "/sub/", name), new_rank,
                 static_cast<int>(members.size()), std::move(global),
                 gloo_timeout_, hostname_, device_);
}

absl::StatusOr<std::vector<std::shared_ptr<GlooCommunicator>>>
GlooCommunicator::subgroups(absl::string_view batch,
                            std::vector<SubgroupSpec> specs) {
  const std::string what =
      absl::StrCat("GlooCommunicator::subgroups '", batch, "'");
  // Each group's rank of this process and global ranks, checked as
  // subgroup() checks them.
  std::vector<int> new_rank(specs.size(), -1);
  std::vector<std::vector<int>> global(specs.size());
  for (size_t g = 0; g < specs.size(); ++g) {
    for (size_t i = 0; i < specs[g].members.size(); ++i) {
      const int m = specs[g].members[i];
      if (m < 0 || m >= size_) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": group '", specs[g].name, "' member ", m,
                         " is outside this group of ", size_, " ranks"));
      }
      if (m == rank_) new_rank[g] = static_cast<int>(i);
      global[g].push_back(ranks_[m]);
    }
    if (new_rank[g] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": this rank (", rank_, ") is not among the members [",
          absl::StrJoin(specs[g].members, ", "), "] of group '", specs[g].name,
          "'"));
    }
  }
  const std::string key_prefix = absl::StrCat(prefix_, "/fold/", batch, "/");
  std::vector<gloo_internal::PairGroup> groups;
  groups.reserve(specs.size());
  for (size_t g = 0; g < specs.size(); ++g) {
    groups.push_back({specs[g].name, specs[g].members, new_rank[g]});
  }
  auto contexts = gloo_internal::ConnectPairGroups(
      *store_, key_prefix, rank_, device_, gloo_timeout_, groups, what);
  if (absl::IsDeadlineExceeded(contexts.status())) {
    // Name, per group, the members whose value never came.
    std::vector<std::string> lines;
    for (size_t g = 0; g < specs.size(); ++g) {
      std::vector<std::string> missing;
      for (size_t i = 0; i < specs[g].members.size(); ++i) {
        const int m = specs[g].members[i];
        if (m == rank_) continue;
        if (!store_->get(absl::StrCat(key_prefix, m)).ok()) {
          missing.push_back(absl::StrCat(i, " (global rank ", ranks_[m], ")"));
        }
      }
      if (missing.empty()) continue;
      lines.push_back(absl::StrCat("gloo group '", prefix_, "/sub/",
                                   specs[g].name, "': peer rank(s) ",
                                   absl::StrJoin(missing, ", ")));
    }
    if (!lines.empty()) {
      return absl::DeadlineExceededError(
          absl::StrCat(absl::StrJoin(lines, "; "), " never connected within ",
                       absl::FormatDuration(gloo_timeout_),
                       " (gone, or never made this call); rank ", rank_,
                       " gives up: ", contexts.status().message()));
    }
  }
  if (!contexts.ok()) return contexts.status();
  std::vector<std::shared_ptr<GlooCommunicator>> out;
  out.reserve(specs.size());
  for (size_t g = 0; g < specs.size(); ++g) {
    out.push_back(std::shared_ptr<GlooCommunicator>(new GlooCommunicator(
        store_, absl::StrCat(prefix_, "/sub/", specs[g].name), new_rank[g],
        static_cast<int>(specs[g].members.size()), std::move(global[g]),
        gloo_timeout_, hostname_, device_, std::move((*contexts)[g]))));
  }
  return out;
}

absl::StatusOr<std::vector<std::shared_ptr<Communicator>>>
GlooCommunicator::split_many(absl::Span<const SplitRequest> requests,
                             absl::Time deadline) {
  // Numbered on every rank of this group (split_many is collective over
  // it), so the batches' keys agree without talking.
  const int64_t seq = next_split_many_++;
  const bool by_members =
      !connected() &&
      std::all_of(requests.begin(), requests.end(), [](const SplitRequest& r) {
        return r.color < 0 || (r.group_local && !r.members.empty());
      });
  if (!by_members) return Communicator::split_many(requests, deadline);
  // The groups this rank is in, among their members only.
  std::vector<SubgroupSpec> specs;
  std::vector<size_t> index;  // the request of each spec
  for (size_t i = 0; i < requests.size(); ++i) {
    const SplitRequest& r = requests[i];
    if (r.color < 0) continue;
    specs.push_back(
        {absl::StrCat("many", seq, "/", i, "/", r.members.front()), r.members});
    index.push_back(i);
  }
  std::vector<std::shared_ptr<Communicator>> out(requests.size());
  if (specs.empty()) return out;  // in none of the groups: no call
  VEMESH_ASSIGN_OR_RETURN(
      auto groups, subgroups(absl::StrCat("many", seq), std::move(specs)));
  for (size_t g = 0; g < groups.size(); ++g) {
    out[index[g]] = std::move(groups[g]);
  }
  return out;
}

StoreScope GlooCommunicator::store_scope() const { return {store_, prefix_}; }

absl::StatusOr<std::shared_ptr<Communicator>> GlooCommunicator::split(int color,
                                                                      int key) {
  // Splits are collective, so every rank numbers them alike and the new
  // groups' prefixes agree without talking.
  const int64_t seq = next_split_++;
  VEMESH_RETURN_IF_ERROR(EnsureConnected());
  const int64_t mine[2] = {color, key};
  std::vector<int64_t> all(2 * static_cast<size_t>(size_));
  VEMESH_RETURN_IF_ERROR(all_gather(mine, all.data(), 2, DataType::kInt64));
  if (color < 0) return std::shared_ptr<Communicator>();
  // Members of my color, ordered by (key, rank).
  std::vector<std::pair<int64_t, int>> members;
  for (int r = 0; r < size_; ++r) {
    if (all[2 * r] == color) members.emplace_back(all[2 * r + 1], r);
  }
  std::sort(members.begin(), members.end());
  int new_rank = 0;
  std::vector<int> global;
  global.reserve(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].second == rank_) new_rank = static_cast<int>(i);
    global.push_back(ranks_[members[i].second]);
  }
  VEMESH_ASSIGN_OR_RETURN(
      auto child,
      Connect(store_, absl::StrCat(prefix_, "/split/", seq, "/", color),
              new_rank, static_cast<int>(members.size()), std::move(global),
              gloo_timeout_, hostname_, device_));
  return std::shared_ptr<Communicator>(std::move(child));
}

absl::StatusOr<std::shared_ptr<Communicator>> GlooCommunicator::Shrink(
    absl::Span<const int> exclude, const ShrinkOptions& /*options*/) {
  const int64_t seq = next_shrink_++;
  int new_rank = 0;
  std::vector<int> global = Survivors(exclude, &new_rank);
  const int size = static_cast<int>(global.size());
  VEMESH_ASSIGN_OR_RETURN(
      auto child, Connect(store_,
                          absl::StrCat(prefix_, "/shrink/", seq, "/",
                                       absl::StrJoin(exclude, ",")),
                          new_rank, size, std::move(global), gloo_timeout_,
                          hostname_, device_));
  return std::shared_ptr<Communicator>(std::move(child));
}

}  // namespace vemesh
