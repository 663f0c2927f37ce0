// DeviceMesh::abort (every communicator of the root in one call) and
// DeviceMesh::shrink (the mesh without some coordinates of one dimension,
// built from the survivors' groups). See device_mesh.h.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/mesh/device_mesh.h"
#include "vemesh/mesh/internal/mesh_shared.h"

namespace vemesh {

absl::Status DeviceMesh::abort() const {
  Shared& shared = *view_->shared;
  shared.aborted.store(true, std::memory_order_release);
  std::vector<std::shared_ptr<Communicator>> comms = shared.dims;
  std::shared_ptr<ViewFamily> family;
  {
    std::lock_guard<std::mutex> lock(shared.mu);
    for (const auto& [key, comm] : shared.flattened) comms.push_back(comm);
    family = shared.family;
  }
  if (family != nullptr) {
    std::lock_guard<std::mutex> lock(family->mu);
    for (const auto& [name, dim] : family->dims) comms.push_back(dim.mine);
  }
  // Duplicates (a one-dimension flatten is its dimension's group) and
  // nulls (non-members, cached null flattenings) are skipped there.
  AbortCommunicators(comms, "DeviceMesh::abort() was called");
  return absl::OkStatus();
}

absl::StatusOr<DeviceMesh> DeviceMesh::shrink(
    absl::string_view dim, absl::Span<const int64_t> exclude,
    const ShrinkOptions& options) const {
  const MeshLayout& layout = view_->layout;
  Shared& shared = *view_->shared;
  auto index = layout.dim_index(dim);
  if (!index.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shrink: no dimension '", dim, "' in ", ToString(), " (",
                     index.status().message(), ")"));
  }
  const int64_t d = *index;
  const std::vector<int64_t> shape = layout.shape();
  const int64_t extent = shape[d];
  std::vector<int64_t> sorted(exclude.begin(), exclude.end());
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= extent) {
      return absl::InvalidArgumentError(
          absl::StrCat("shrink: coordinate ", sorted[i], " of '", dim,
                       "' is out of range: expected 0 <= c < ", extent));
    }
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shrink: coordinate ", sorted[i], " of '", dim, "' is given twice"));
    }
  }
  if (static_cast<int64_t>(sorted.size()) >= extent) {
    return absl::InvalidArgumentError(absl::StrCat("shrink: excluding all ",
                                                   extent, " coordinates of '",
                                                   dim, "' leaves no mesh"));
  }
  const bool member = view_->has_self;
  if (member && shared.device_type != DeviceType::kMeta) {
    VEMESH_ASSIGN_OR_RETURN(int64_t mine, get_local_rank(d));
    if (std::binary_search(sorted.begin(), sorted.end(), mine)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shrink: this rank (global rank ", shared.global_rank, ") is at '",
          dim, "' coordinate ", mine,
          ", which exclude names; only the ranks that stay call shrink"));
    }
  }

  // The layout without the excluded coordinates: the same ranks in the
  // same row-major order, with the same names.
  int64_t stride = 1;
  for (int64_t e = d + 1; e < static_cast<int64_t>(shape.size()); ++e) {
    stride *= shape[e];
  }
  std::vector<int64_t> kept;
  const std::vector<int64_t> ranks = layout.ranks();
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int64_t at = (static_cast<int64_t>(i) / stride) % extent;
    if (!std::binary_search(sorted.begin(), sorted.end(), at)) {
      kept.push_back(ranks[i]);
    }
  }
  std::vector<int64_t> new_shape = shape;
  new_shape[d] = extent - static_cast<int64_t>(sorted.size());
  const std::vector<std::string> names = layout.dim_names();
  VEMESH_ASSIGN_OR_RETURN(MeshLayout smaller,
                          MeshLayout::Create(new_shape, names, kept));
  if (shared.device_type == DeviceType::kMeta) {
    return Meta(std::move(smaller), shared.global_rank);
  }
  if (!member) {
    return NotMember(layout, shared.global_rank, "shrink");
  }

  // The groups: `dim`'s shrunk (group rank = coordinate along it), the
  // others kept, or rebuilt among the same members after an abort. Every
  // survivor goes through the dimensions in the same order.
  const bool rebuild = shared.aborted.load(std::memory_order_acquire);
  std::vector<int> excluded(sorted.begin(), sorted.end());
  std::vector<std::shared_ptr<Communicator>> groups;
  for (int64_t e = 0; e < layout.ndim(); ++e) {
    VEMESH_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> group, get_group(e));
    const std::string& name = layout.dim_name(e);
    if (e != d && !rebuild) {
      if (group->aborted()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "shrink: the group of '", name, "' was aborted on this rank (",
            group->AbortedError("shrink").message(),
            "); call abort() on the mesh on every survivor, then shrink "
            "(every dimension is then rebuilt)"));
      }
      groups.push_back(std::move(group));
      continue;
    }
    auto made = group->shrink(
        e == d ? absl::MakeConstSpan(excluded) : absl::Span<const int>(),
        options);
    if (!made.ok()) {
      return absl::Status(
          made.status().code(),
          absl::StrCat("shrink of '", name, "': ", made.status().message()));
    }
    (*made)->set_timeout(group->timeout());
    groups.push_back(*std::move(made));
  }
  return FromGroups(shared.device_type, std::move(smaller), shared.global_rank,
                    std::move(groups), shared.host_local_rank,
                    shared.host_size);
}

}  // namespace vemesh
