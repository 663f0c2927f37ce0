// Reshaping a DeviceMesh, collectively: flatten (several dimensions as one
// group), unflatten (one dimension as several) and view (the same ranks in
// another shape). Each checks that every rank asks the same, then splits
// only what is new; the communicators of dimensions that stay are reused.

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/bootstrap/agreement.h"
#include "vemesh/mesh/device_mesh.h"
#include "vemesh/mesh/internal/mesh_shared.h"

namespace vemesh {

absl::StatusOr<std::shared_ptr<Communicator>> DeviceMesh::flatten(
    absl::Span<const std::string> dims, absl::string_view name) const {
  const std::string flat_name =
      name.empty() ? absl::StrJoin(dims, "_") : std::string(name);
  Shared& shared = *view_->shared;
  // Validates the names (known, distinct, non-empty) the layout's way;
  // earlier flatten names count as dimensions (nested flattening).
  VEMESH_ASSIGN_OR_RETURN(MeshLayout resolved,
                          shared.Resolve(view_->layout, dims));
  VEMESH_ASSIGN_OR_RETURN(MeshLayout flat, resolved.flatten(dims, flat_name));
  if (shared.device_type == DeviceType::kMeta) {
    return absl::FailedPreconditionError(
        absl::StrCat("a meta mesh has no communicators: cannot flatten [",
                     absl::StrJoin(dims, ", "), "]"));
  }
  if (shared.aborted.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot flatten [", absl::StrJoin(dims, ", "),
        "]: the mesh was aborted (DeviceMesh::abort); shrink it or make a "
        "new one"));
  }
  // The root dimensions spanned, in the order the flattened index runs.
  VEMESH_ASSIGN_OR_RETURN(int64_t flat_dim, flat.dim_index(flat_name));
  const std::vector<int64_t> key = flat.root_dims(flat_dim);
  // One root dimension is its own group: nothing to split, but a new name
  // is registered so that get_group finds it (its own name needs nothing).
  const bool one_dim = key.size() == 1;
  const bool own_name = one_dim && shared.root.dim_name(key[0]) == flat_name;
  const std::vector<std::string> parts(dims.begin(), dims.end());

  // Flattens wait for each other, never get_group: see Shared::flatten_mu.
  std::lock_guard<std::mutex> flatten_lock(shared.flatten_mu);
  std::optional<std::shared_ptr<Communicator>> known;
  {
    std::lock_guard<std::mutex> lock(shared.mu);
    auto bound = shared.flat_names.find(flat_name);
    if ((bound != shared.flat_names.end() && bound->second.key != key) ||
        (!own_name && shared.root.find_dim(flat_name).has_value())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "flatten name '", flat_name,
          "' already names another dimension or flattened group of ",
          shared.root.ToString(), ": expected a new name for [",
          absl::StrJoin(dims, ", "), "]"));
    }
    if (one_dim) {
      if (!own_name)
        shared.flat_names.emplace(flat_name, Shared::FlatName{key, parts});
    } else if (auto cached = shared.flattened.find(key);
               cached != shared.flattened.end()) {
      known = cached->second;
    }
  }
  if (one_dim) return get_group(flat_name);

  if (!known.has_value() && shared.bootstrap == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot flatten [", absl::StrJoin(dims, ", "),
        "]: this mesh adopted its groups (DeviceMesh::FromGroups) and has no "
        "world to split"));
  }
  if (!known.has_value()) {
    // The group cache: a view of the same ranks (DeviceMesh::view) may
    // already hold these groups under other names. Every rank's cache
    // holds the same keys, so all skip the split alike.
    VEMESH_ASSIGN_OR_RETURN(MeshLayout root, shared.Resolve(shared.root, dims));
    bool found = false;
    std::shared_ptr<Communicator> cached =
        shared.CachedGroup(root, dims, &found);
    if (found) known = std::move(cached);
  }
  if (!known.has_value()) {
    // Collective over the world: check, then one split. No `mu` held. The
    // split runs over the root layout with the same names resolved, so
    // every group (not only this child's) is made.
    const std::vector<AgreementField> fields = {
        {"dims", absl::StrCat("[", absl::StrJoin(dims, ", "), "]")},
        {"name", flat_name}};
    VEMESH_RETURN_IF_ERROR(CheckAgreement(*shared.bootstrap,
                                          "DeviceMesh::flatten", fields,
                                          absl::Now() + shared.timeout));
    int color = -1;
    int split_key = 0;
    if (shared.root.contains(shared.global_rank)) {
      VEMESH_ASSIGN_OR_RETURN(MeshLayout root,
                              shared.Resolve(shared.root, dims));
      VEMESH_ASSIGN_OR_RETURN(auto pos,
                              root.group_position(dims, shared.global_rank));
      color = static_cast<int>(pos.group);
      split_key = static_cast<int>(pos.index);
    }
    // split_many of one: the same split, named for NCCL's logs.
    const SplitRequest request{color, split_key, flat_name};
    VEMESH_ASSIGN_OR_RETURN(auto device_world, shared.DeviceWorld());
    VEMESH_ASSIGN_OR_RETURN(
        auto groups, device_world->split_many(absl::MakeConstSpan(&request, 1),
                                              absl::Now() + shared.timeout));
    known = std::move(groups[0]);
    VEMESH_ASSIGN_OR_RETURN(MeshLayout root, shared.Resolve(shared.root, dims));
    shared.CacheGroup(root, dims, *known);
  }
  {
    std::lock_guard<std::mutex> lock(shared.mu);
    shared.flattened.emplace(key, *known);
    shared.flat_names.emplace(flat_name, Shared::FlatName{key, parts});
  }
  if (*known == nullptr) {
    return NotMember(view_->layout, shared.global_rank,
                     absl::StrCat("flattened group '", flat_name,
                                  "' (it took part in the split)"));
  }
  return *known;
}

absl::StatusOr<DeviceMesh> DeviceMesh::flatten_mesh(
    absl::Span<const std::string> dims, absl::string_view name) const {
  const std::string flat_name =
      name.empty() ? absl::StrJoin(dims, "_") : std::string(name);
  VEMESH_RETURN_IF_ERROR(flatten(dims, flat_name));
  return (*this)[flat_name];
}

absl::StatusOr<DeviceMesh> DeviceMesh::unflatten(
    int64_t dim, absl::Span<const int64_t> sizes,
    absl::Span<const std::string> names) const {
  VEMESH_RETURN_IF_ERROR(view_->layout.dim_size(dim));
  return unflatten(view_->layout.dim_name(dim), sizes, names);
}

absl::StatusOr<DeviceMesh> DeviceMesh::unflatten(
    absl::string_view dim, absl::Span<const int64_t> sizes,
    absl::Span<const std::string> names) const {
  Shared& shared = *view_->shared;
  const MeshLayout& layout = view_->layout;
  VEMESH_ASSIGN_OR_RETURN(const int64_t d, layout.dim_index(dim));
  const std::vector<int64_t> spanned = layout.root_dims(d);
  if (spanned.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unflatten('", dim, "'): '", dim, "' is a flattening of ",
        spanned.size(),
        " dimensions of the root mesh: expected a dimension of the root mesh "
        "(unflatten the mesh it was flattened from instead)"));
  }
  const int64_t r = spanned[0];
  const int64_t dim_size = layout.dim_size(d).value_or(0);
  if (sizes.empty() || names.size() != sizes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unflatten('", dim, "'): ", sizes.size(), " sizes [",
                     absl::StrJoin(sizes, ", "), "] and ", names.size(),
                     " names [", absl::StrJoin(names, ", "),
                     "]: expected one name per size, at least one"));
  }
  int64_t product = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 1 || __builtin_mul_overflow(product, sizes[i], &product)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unflatten('", dim, "'): size ", sizes[i], " of '", names[i],
          "': expected sizes >= 1 whose product is ", dim_size));
    }
  }
  if (product != dim_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("unflatten('", dim, "'): sizes [",
                     absl::StrJoin(sizes, ", "), "] multiply to ", product,
                     ": expected ", dim_size, ", the size of '", dim, "'"));
  }
  {
    std::lock_guard<std::mutex> lock(shared.mu);
    for (size_t i = 0; i < names.size(); ++i) {
      if (shared.root.find_dim(names[i]).has_value() ||
          shared.flat_names.contains(names[i]) ||
          std::find(names.begin(), names.begin() + i, names[i]) !=
              names.begin() + i) {
        return absl::InvalidArgumentError(absl::StrCat(
            "unflatten('", dim, "'): name '", names[i],
            "' already names a dimension, a flattening or another part of ",
            shared.root.ToString(), ": expected new, distinct names"));
      }
    }
  }
  // The new root: root dimension r replaced by `sizes`, the same ranks in
  // the same row-major places (so every other dimension's groups are the
  // same, and their communicators are reused).
  const int64_t k = static_cast<int64_t>(sizes.size());
  std::vector<int64_t> shape;
  std::vector<std::string> root_names;
  std::vector<int64_t> backend_dim;
  for (int64_t i = 0; i < shared.root.ndim(); ++i) {
    if (i == r) {
      shape.insert(shape.end(), sizes.begin(), sizes.end());
      root_names.insert(root_names.end(), names.begin(), names.end());
    } else {
      shape.push_back(shared.root.dim_size(i).value_or(1));
      root_names.push_back(shared.root.dim_name(i));
    }
    const int64_t b = shared.backend_dim.empty() ? i : shared.backend_dim[i];
    backend_dim.insert(backend_dim.end(), i == r ? k : 1, b);
  }
  if (shape.size() > MeshLayout::kMaxDims) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unflatten('", dim, "') would give the root ", shape.size(),
        " dimensions: expected at most ", MeshLayout::kMaxDims));
  }
  std::vector<int64_t> table;
  if (shared.root.has_rank_table()) table = shared.root.ranks();
  VEMESH_ASSIGN_OR_RETURN(MeshLayout root,
                          MeshLayout::Create(shape, root_names, table));
  auto next = shared.Sibling(root);
  next->backend_dim = backend_dim;
  // Old root index -> new root indices.
  auto remap = [&](const std::vector<int64_t>& key) {
    std::vector<int64_t> out;
    for (int64_t old : key) {
      if (old == r) {
        for (int64_t j = 0; j < k; ++j) out.push_back(r + j);
      } else {
        out.push_back(old < r ? old : old + k - 1);
      }
    }
    return out;
  };
  std::vector<int64_t> parts(k);
  for (int64_t j = 0; j < k; ++j) parts[j] = r + j;

  if (shared.device_type != DeviceType::kMeta) {
    if (shared.bootstrap == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot unflatten '", dim,
          "': this mesh adopted its groups (DeviceMesh::FromGroups) and has "
          "no world to split"));
    }
    // Collective over the world: check, then one split per new dimension
    // on the backend of the dimension split. Nothing per sub-group.
    std::lock_guard<std::mutex> flatten_lock(shared.flatten_mu);
    const std::vector<AgreementField> fields = {
        {"dim", std::string(dim)},
        {"sizes", absl::StrCat("[", absl::StrJoin(sizes, ", "), "]")},
        {"names", absl::StrCat("[", absl::StrJoin(names, ", "), "]")}};
    VEMESH_RETURN_IF_ERROR(CheckAgreement(*shared.bootstrap,
                                          "DeviceMesh::unflatten", fields,
                                          absl::Now() + shared.timeout));
    const bool member = root.contains(shared.global_rank);
    const int64_t b = shared.backend_dim.empty() ? r : shared.backend_dim[r];
    // The new dimensions in one split_many (one NCCL group).
    std::vector<SplitRequest> requests(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j) {
      VEMESH_ASSIGN_OR_RETURN(
          requests[j],
          DimSplitRequest(root, names[j], shared.global_rank, member));
    }
    VEMESH_ASSIGN_OR_RETURN(auto world, shared.backends->world_of_dim(b));
    VEMESH_ASSIGN_OR_RETURN(
        std::vector<std::shared_ptr<Communicator>> made,
        world->split_many(requests, absl::Now() + shared.timeout));
    for (int64_t i = 0; i < shared.root.ndim(); ++i) {
      if (i == r) {
        next->dims.insert(next->dims.end(), made.begin(), made.end());
      } else {
        next->dims.push_back(shared.dims[i]);
      }
    }
  }
  {
    // Flattenings carry over (remapped), and the dimension that was split
    // stays a name: the flattening of its parts, with its communicator.
    std::lock_guard<std::mutex> lock(shared.mu);
    for (const auto& [key, comm] : shared.flattened) {
      next->flattened.emplace(remap(key), comm);
    }
    for (const auto& [name, flat] : shared.flat_names) {
      next->flat_names.emplace(name,
                               Shared::FlatName{remap(flat.key), flat.dims});
    }
  }
  next->flat_names.emplace(
      std::string(dim),
      Shared::FlatName{parts,
                       std::vector<std::string>(names.begin(), names.end())});
  if (shared.device_type != DeviceType::kMeta) {
    next->flattened.emplace(parts, shared.dims[r]);
  }
  const DeviceMesh new_root(next, root);
  // The same view of the new root as this mesh is of the old one: its
  // dimensions in its order, `dim` replaced by its parts.
  if (layout == shared.root) return new_root;
  if (!has_self()) {
    return NotMember(layout, shared.global_rank,
                     absl::StrCat("unflattened mesh along '", dim,
                                  "' (it took part in the splits)"));
  }
  std::vector<std::string> view_names;
  for (int64_t i = 0; i < layout.ndim(); ++i) {
    if (i == d) {
      view_names.insert(view_names.end(), names.begin(), names.end());
    } else {
      view_names.push_back(layout.dim_name(i));
    }
  }
  return new_root.submesh_at(view_names, shared.global_rank);
}

absl::StatusOr<DeviceMesh> DeviceMesh::view(
    absl::Span<const int64_t> shape,
    absl::Span<const std::string> names) const {
  return view(shape, names, ViewOptions{});
}

absl::StatusOr<std::shared_ptr<ViewFamily>> DeviceMesh::Shared::Family() {
  Shared& shared = *this;
  {
    std::lock_guard<std::mutex> lock(shared.mu);
    if (shared.family != nullptr) return shared.family;
  }
  const MeshLayout& from = shared.root;
  auto family = std::make_shared<ViewFamily>();
  for (int64_t d = 0; d < from.ndim(); ++d) {
    VEMESH_ASSIGN_OR_RETURN(auto groups, from.groups({from.dim_name(d)}));
    std::sort(groups.begin(), groups.end());
    std::shared_ptr<Communicator> mine =
        d < static_cast<int64_t>(shared.dims.size()) ? shared.dims[d] : nullptr;
    family->by_groups.emplace(groups, mine);
    family->dims.emplace(from.dim_name(d),
                         ViewFamily::Dim{std::move(groups), std::move(mine)});
  }
  std::lock_guard<std::mutex> lock(shared.mu);
  // The root's flattenings so far (later ones register in flatten).
  for (const auto& [key, comm] : shared.flattened) {
    std::vector<std::string> parts;
    for (int64_t d : key) parts.push_back(from.dim_name(d));
    absl::StatusOr<ViewFamily::Groups> groups = from.groups(parts);
    if (!groups.ok()) continue;
    std::sort(groups->begin(), groups->end());
    family->by_groups.emplace(*std::move(groups), comm);
  }
  if (shared.family == nullptr) shared.family = family;
  return shared.family;
}

std::shared_ptr<Communicator> DeviceMesh::Shared::CachedGroup(
    const MeshLayout& layout, absl::Span<const std::string> names,
    bool* found) {
  *found = false;
  std::shared_ptr<ViewFamily> fam;
  {
    std::lock_guard<std::mutex> lock(mu);
    fam = family;
  }
  if (fam == nullptr) return nullptr;
  absl::StatusOr<ViewFamily::Groups> groups = layout.groups(names);
  if (!groups.ok()) return nullptr;
  std::sort(groups->begin(), groups->end());
  std::lock_guard<std::mutex> lock(fam->mu);
  auto it = fam->by_groups.find(*groups);
  if (it == fam->by_groups.end()) return nullptr;
  *found = true;
  return it->second;
}

void DeviceMesh::Shared::CacheGroup(const MeshLayout& layout,
                                    absl::Span<const std::string> names,
                                    std::shared_ptr<Communicator> comm) {
  std::shared_ptr<ViewFamily> fam;
  {
    std::lock_guard<std::mutex> lock(mu);
    fam = family;
  }
  if (fam == nullptr) return;
  absl::StatusOr<ViewFamily::Groups> groups = layout.groups(names);
  if (!groups.ok()) return;
  std::sort(groups->begin(), groups->end());
  std::lock_guard<std::mutex> lock(fam->mu);
  fam->by_groups.emplace(*std::move(groups), std::move(comm));
}

absl::StatusOr<DeviceMesh> DeviceMesh::view(absl::Span<const int64_t> shape,
                                            absl::Span<const std::string> names,
                                            const ViewOptions& options) const {
  Shared& shared = *view_->shared;
  const MeshLayout& from = shared.root;
  // The view: the root's ranks, in the same row-major order, in `shape`.
  std::vector<int64_t> table;
  if (from.has_rank_table()) table = from.ranks();
  if (names.empty()) {
    return absl::InvalidArgumentError(
        "DeviceMesh::view needs a name per dimension: views share "
        "communicators by name");
  }
  VEMESH_ASSIGN_OR_RETURN(MeshLayout layout,
                          MeshLayout::Create(shape, names, table));
  if (layout.size() != from.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "view ", layout.ToString(), " holds ", layout.size(),
        " ranks: expected ", from.size(), ", the ranks of ", from.ToString()));
  }
  VEMESH_ASSIGN_OR_RETURN(std::shared_ptr<ViewFamily> family, shared.Family());
  // Which dimensions are shared (same name and groups, or same groups under
  // any name) and which new; a bound name with other groups is refused,
  // the same on every rank.
  std::vector<ViewFamily::Groups> groups(layout.ndim());
  std::vector<std::shared_ptr<Communicator>> known(layout.ndim());
  std::vector<bool> is_new(layout.ndim(), true);
  std::vector<bool> by_name(layout.ndim(), false);
  {
    std::lock_guard<std::mutex> lock(family->mu);
    for (int64_t d = 0; d < layout.ndim(); ++d) {
      const std::string& name = layout.dim_name(d);
      VEMESH_ASSIGN_OR_RETURN(groups[d], layout.groups({name}));
      std::sort(groups[d].begin(), groups[d].end());
      auto it =
          options.bind_names ? family->dims.find(name) : family->dims.end();
      if (it != family->dims.end() && it->second.groups != groups[d]) {
        size_t i = 0;
        while (i < groups[d].size() && i < it->second.groups.size() &&
               groups[d][i] == it->second.groups[i]) {
          ++i;
        }
        const auto text = [](const ViewFamily::Groups& g, size_t at) {
          return at < g.size()
                     ? absl::StrCat("[", absl::StrJoin(g[at], ", "), "]")
                     : std::string("none");
        };
        return absl::InvalidArgumentError(absl::StrCat(
            "view ", layout.ToString(), ": dimension '", name, "' has group ",
            text(groups[d], i), " where the views of ", from.ToString(),
            " have ", text(it->second.groups, i),
            ": expected the groups of a shared dimension to be the same (or "
            "another name)"));
      }
      if (it != family->dims.end()) {
        is_new[d] = false;
        by_name[d] = true;
        known[d] = it->second.mine;
        continue;
      }
      // The group cache: the same rank sets under another name.
      auto cached = family->by_groups.find(groups[d]);
      if (cached != family->by_groups.end()) {
        is_new[d] = false;
        known[d] = cached->second;
      }
    }
  }
  auto next = shared.Sibling(layout);
  next->family = family;
  if (shared.device_type != DeviceType::kMeta) {
    if (shared.bootstrap == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot make view ", layout.ToString(),
          ": this mesh adopted its groups (DeviceMesh::FromGroups) and has "
          "no world to split"));
    }
    // Collective: check, then one split per new dimension on the default
    // world; shared dimensions reuse their communicators.
    std::lock_guard<std::mutex> flatten_lock(shared.flatten_mu);
    const std::vector<AgreementField> fields = {
        {"shape", absl::StrCat("[", absl::StrJoin(shape, ", "), "]")},
        {"names", absl::StrCat("[", absl::StrJoin(names, ", "), "]")}};
    VEMESH_RETURN_IF_ERROR(CheckAgreement(*shared.bootstrap, "DeviceMesh::view",
                                          fields,
                                          absl::Now() + shared.timeout));
    const bool member = layout.contains(shared.global_rank);
    // The new dimensions in one split_many (one NCCL group).
    std::vector<SplitRequest> requests;
    for (int64_t d = 0; d < layout.ndim(); ++d) {
      if (!is_new[d]) continue;
      VEMESH_ASSIGN_OR_RETURN(SplitRequest request,
                              DimSplitRequest(layout, layout.dim_name(d),
                                              shared.global_rank, member));
      requests.push_back(std::move(request));
    }
    std::vector<std::shared_ptr<Communicator>> made;
    if (!requests.empty()) {
      VEMESH_ASSIGN_OR_RETURN(auto device_world, shared.DeviceWorld());
      VEMESH_ASSIGN_OR_RETURN(
          made,
          device_world->split_many(requests, absl::Now() + shared.timeout));
    }
    size_t next_new = 0;
    for (int64_t d = 0; d < layout.ndim(); ++d) {
      next->dims.push_back(is_new[d] ? std::move(made[next_new++]) : known[d]);
      next->backend_dim.push_back(-1);
    }
    // A dimension shared by name keeps the backend it was made on.
    for (int64_t d = 0; d < layout.ndim(); ++d) {
      if (!by_name[d]) continue;
      auto at = from.find_dim(layout.dim_name(d));
      if (at && !shared.backend_dim.empty()) {
        next->backend_dim[d] = shared.backend_dim[*at];
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(family->mu);
    for (int64_t d = 0; d < layout.ndim(); ++d) {
      if (by_name[d]) continue;
      std::shared_ptr<Communicator> mine =
          d < static_cast<int64_t>(next->dims.size()) ? next->dims[d] : nullptr;
      // A rank set met under a new name binds that name too (bound views).
      if (is_new[d]) family->by_groups.emplace(groups[d], mine);
      if (options.bind_names) {
        family->dims.emplace(
            layout.dim_name(d),
            ViewFamily::Dim{std::move(groups[d]), std::move(mine)});
      }
    }
  }
  return DeviceMesh(next, layout);
}

}  // namespace vemesh
