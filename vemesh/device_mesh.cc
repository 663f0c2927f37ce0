#include "vemesh/device_mesh.h"

#include <mutex>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/bootstrap/agreement.h"
#include "vemesh/bootstrap/launch.h"
#include "vemesh/comm/nccl/nccl_communicator.h"
#include "vemesh/mesh_backends.h"
#include "vemesh/status_macros.h"

namespace vemesh {

// What a mesh and all its children share: the layout the mesh was created
// with (the "root"), this process's place in the world, and the
// communicators. Dimension communicators are indexed by root dimension;
// flattened ones are keyed by the root dimensions they span, in order.
struct DeviceMesh::Shared {
  Shared(DeviceType type, MeshLayout layout, int64_t rank)
      : device_type(type), root(std::move(layout)), global_rank(rank) {}

  const DeviceType device_type;
  const MeshLayout root;
  const int64_t global_rank;
  int host_local_rank = 0;
  int host_size = 1;
  absl::Duration timeout = absl::Seconds(60);
  // How the ranks found each other; null for a meta mesh. Flatten's
  // agreement check goes through it.
  std::shared_ptr<Bootstrap> bootstrap;
  // The backends' worlds, and each root dimension's backend.
  std::unique_ptr<MeshBackends> backends;
  // The world on the mesh's default backend (flatten splits it).
  std::shared_ptr<Communicator> device_world;
  // One per root dimension; null on ranks outside the mesh.
  std::vector<std::shared_ptr<Communicator>> dims;

  // Serialises flattens, collective and as slow as the slowest rank. Held
  // across the collective; `mu` never is, so get_group does not wait on a
  // peer. Taken before `mu`.
  std::mutex flatten_mu;
  // Guards the two maps below, for look-ups and inserts only.
  std::mutex mu;
  // Null values are cached too: ranks outside the mesh took part in the
  // split, and must not take part again.
  absl::flat_hash_map<std::vector<int64_t>, std::shared_ptr<Communicator>>
      flattened;
  // Every name given to flatten, and the root dimensions it spans (one for
  // a one-dimension flatten: that dimension's group).
  absl::flat_hash_map<std::string, std::vector<int64_t>> flat_names;
};

namespace {

std::string ShapeText(absl::Span<const int64_t> shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

std::string RankListText(const MeshLayout& layout) {
  if (!layout.has_rank_table()) return "arange";
  return absl::StrCat("[", absl::StrJoin(layout.ranks(), ", "), "]");
}

absl::Status NotMember(const MeshLayout& layout, int64_t rank,
                       absl::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat("rank ", rank, " is not a member of ", layout.ToString(),
                   ": it has no ", what));
}

}  // namespace

struct DeviceMesh::View {
  std::shared_ptr<Shared> shared;
  MeshLayout layout;
  bool has_self;
};

DeviceMesh::DeviceMesh(std::shared_ptr<Shared> shared, MeshLayout layout) {
  const bool has_self = layout.contains(shared->global_rank);
  view_ = std::make_shared<const View>(
      View{std::move(shared), std::move(layout), has_self});
}

DeviceMesh DeviceMesh::Meta(MeshLayout layout, int64_t global_rank) {
  auto shared =
      std::make_shared<Shared>(DeviceType::kMeta, layout, global_rank);
  return DeviceMesh(std::move(shared), std::move(layout));
}

absl::StatusOr<DeviceMesh> DeviceMesh::FromGroups(
    DeviceType device_type, MeshLayout layout, int64_t global_rank,
    std::vector<std::shared_ptr<Communicator>> groups, int host_local_rank,
    int host_size) {
  if (device_type == DeviceType::kMeta) {
    return absl::InvalidArgumentError(
        "DeviceMesh::FromGroups: a meta mesh has no communicators to adopt");
  }
  if (static_cast<int64_t>(groups.size()) != layout.ndim()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DeviceMesh::FromGroups: ", groups.size(), " groups for ",
        layout.ToString(), ": expected one per dimension (", layout.ndim(),
        ")"));
  }
  if (host_size < 1 || host_local_rank < 0 || host_local_rank >= host_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DeviceMesh::FromGroups: host-local rank ", host_local_rank,
        " of a host of ", host_size, ": expected 0 <= rank < size"));
  }
  VEMESH_ASSIGN_OR_RETURN(auto coord, layout.coordinate_of(global_rank));
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    const std::string& name = layout.dim_name(d);
    const Communicator* g = groups[d].get();
    if (g == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DeviceMesh::FromGroups: no group for dimension '", name, "'"));
    }
    const int64_t size = layout.dim_size(d).value_or(-1);
    if (g->size() != size || g->rank() != coord[d]) {
      return absl::InvalidArgumentError(
          absl::StrCat("DeviceMesh::FromGroups: the group of '", name,
                       "' has rank ", g->rank(), " of ", g->size(),
                       ": expected rank ", coord[d], " of ", size));
    }
    Coordinate at = coord;
    for (int64_t i = 0; i < size; ++i) {
      at[d] = i;
      VEMESH_ASSIGN_OR_RETURN(auto expected, layout.rank_at(at));
      if (g->ranks()[i] != expected) {
        return absl::InvalidArgumentError(absl::StrCat(
            "DeviceMesh::FromGroups: the group of '", name, "' holds rank ",
            g->ranks()[i], " at index ", i, ": expected ", expected));
      }
    }
  }
  auto shared = std::make_shared<Shared>(device_type, layout, global_rank);
  shared->host_local_rank = host_local_rank;
  shared->host_size = host_size;
  shared->dims = std::move(groups);
  return DeviceMesh(std::move(shared), std::move(layout));
}

absl::StatusOr<DeviceMesh> DeviceMesh::Create(DeviceType device_type,
                                              MeshLayout layout,
                                              const MeshOptions& options) {
  if (device_type == DeviceType::kMeta) {
    return Meta(std::move(layout), LauncherRank());
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MeshOptions.timeout is ", absl::FormatDuration(options.timeout),
        ": expected a positive duration"));
  }
  const absl::Time deadline = absl::Now() + options.timeout;

  // (1) The bootstrap.
  std::shared_ptr<Bootstrap> bootstrap = options.bootstrap;
  if (bootstrap == nullptr && options.world != nullptr) {
    VEMESH_ASSIGN_OR_RETURN(auto made, options.world->make_bootstrap(deadline));
    bootstrap = std::move(made);
  }
  if (bootstrap == nullptr) {
    VEMESH_ASSIGN_OR_RETURN(auto launched, LaunchBootstrap(deadline));
    bootstrap = std::move(launched);
  }
  const int world_rank = bootstrap->rank();
  const int world_size = bootstrap->size();

  // Each dimension's backend, decided locally and checked in the agreement.
  VEMESH_ASSIGN_OR_RETURN(
      auto plan, PlanBackends(device_type, layout, *bootstrap, options));

  // (2) Agreement and host identities in one step.
  const std::vector<AgreementField> fields = {
      {"device type", std::string(DeviceTypeName(device_type))},
      {"shape", ShapeText(layout.shape())},
      {"dim names",
       absl::StrCat("[", absl::StrJoin(layout.dim_names(), ", "), "]")},
      {"ranks", RankListText(layout)},
      {"backends", absl::StrJoin(plan.dims, ", ")},
  };
  VEMESH_ASSIGN_OR_RETURN(auto hosts,
                          AgreeAndGather(*bootstrap, "DeviceMesh::Create",
                                         fields, HostIdentity(), deadline));

  // (3) The mesh fits the world (the same answer on every rank now).
  if (layout.size() > world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mesh ", layout.ToString(), " has ", layout.size(),
        " ranks but the world has only ", world_size));
  }
  if (layout.has_rank_table()) {
    for (int64_t r : layout.ranks()) {
      if (r >= world_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("mesh ", layout.ToString(), " holds rank ", r,
                         " but the world has ranks 0..", world_size - 1));
      }
    }
  }

  auto shared = std::make_shared<Shared>(device_type, layout, world_rank);
  shared->timeout = options.timeout;
  shared->bootstrap = bootstrap;

  // (4) Where this rank sits on its host (the GPU it binds for cuda).
  const std::string &mine = hosts[world_rank];
  for (int r = 0; r < world_size; ++r) {
    if (hosts[r] != mine)
      continue;
    if (r < world_rank) ++shared->host_local_rank;
  }
  shared->host_size =
      static_cast<int>(std::count(hosts.begin(), hosts.end(), mine));
  const int launcher = LauncherLocalRank();
  if (options.world == nullptr && launcher >= 0 &&
      launcher != shared->host_local_rank) {
    std::fprintf(stderr,
                 "vemesh: warning: rank %d: the launcher says local rank %d "
                 "but the host identities say %d; using %d\n",
                 world_rank, launcher, shared->host_local_rank,
                 shared->host_local_rank);
  }

  // (5) The backends' worlds.
  auto backends = MeshBackends::Create(
      *bootstrap, std::move(plan), shared->host_local_rank,
      shared->host_size == world_size, deadline, options.timeout);
  if (!backends.ok()) return backends.status();
  shared->backends = *std::move(backends);
  shared->device_world = shared->backends->default_world();

  // (6) One split per dimension, in dimension order on every rank.
  const bool member = layout.contains(world_rank);
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    int color = -1;
    int key = 0;
    if (member) {
      VEMESH_ASSIGN_OR_RETURN(
          auto pos, layout.group_position({layout.dim_name(d)}, world_rank));
      color = static_cast<int>(pos.group);
      key = static_cast<int>(pos.index);
    }
    VEMESH_ASSIGN_OR_RETURN(
        auto group, shared->backends->world_of_dim(d)->split(color, key));
    shared->dims.push_back(std::move(group));
  }
  return DeviceMesh(std::move(shared), std::move(layout));
}

DeviceType DeviceMesh::device_type() const { return view_->shared->device_type; }
const MeshLayout& DeviceMesh::layout() const { return view_->layout; }
int64_t DeviceMesh::global_rank() const { return view_->shared->global_rank; }
bool DeviceMesh::has_self() const { return view_->has_self; }

int64_t DeviceMesh::size() const { return view_->layout.size(); }
int64_t DeviceMesh::ndim() const { return view_->layout.ndim(); }
std::vector<int64_t> DeviceMesh::shape() const { return view_->layout.shape(); }
std::vector<std::string> DeviceMesh::mesh_dim_names() const {
  return view_->layout.dim_names();
}
absl::StatusOr<int64_t> DeviceMesh::size(absl::string_view dim) const {
  return view_->layout.dim_size(dim);
}
absl::StatusOr<int64_t> DeviceMesh::size(int64_t dim) const {
  return view_->layout.dim_size(dim);
}
std::vector<int64_t> DeviceMesh::mesh() const { return view_->layout.ranks(); }

absl::StatusOr<Coordinate> DeviceMesh::get_coordinate() const {
  if (!has_self()) {
    return absl::NotFoundError(
        absl::StrCat("rank ", view_->shared->global_rank, " is not a member of ",
                     view_->layout.ToString()));
  }
  return view_->layout.coordinate_of(view_->shared->global_rank);
}

absl::StatusOr<int64_t> DeviceMesh::get_local_rank(
    absl::string_view dim) const {
  VEMESH_ASSIGN_OR_RETURN(auto index, view_->layout.dim_index(dim));
  return get_local_rank(index);
}

absl::StatusOr<int64_t> DeviceMesh::get_local_rank(int64_t dim) const {
  if (dim < 0 || dim >= ndim()) {
    return absl::OutOfRangeError(absl::StrCat(
        "dimension ", dim, " is outside a ", ndim(), "-D mesh"));
  }
  VEMESH_ASSIGN_OR_RETURN(auto coord, get_coordinate());
  return coord[dim];
}

absl::StatusOr<std::shared_ptr<Communicator>> DeviceMesh::get_group(
    absl::string_view dim) const {
  if (view_->shared->device_type == DeviceType::kMeta) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a meta mesh has no communicators (asked for the group of '", dim,
        "'); create the mesh with device type 'cpu' or 'cuda'"));
  }
  if (view_->layout.find_dim(dim).has_value()) {
    if (!has_self()) {
      return NotMember(view_->layout, view_->shared->global_rank,
                       absl::StrCat("group along '", dim, "'"));
    }
    VEMESH_ASSIGN_OR_RETURN(auto root_dim, view_->shared->root.dim_index(dim));
    return view_->shared->dims[root_dim];
  }
  // A name given to `flatten` finds its group, when this mesh holds all of
  // the flattened dimensions. A short lock: a flatten in progress holds
  // only `flatten_mu` while it communicates.
  Shared& shared = *view_->shared;
  std::lock_guard<std::mutex> lock(shared.mu);
  auto named = shared.flat_names.find(dim);
  if (named != shared.flat_names.end()) {
    const std::vector<int64_t>& key = named->second;
    bool held = true;
    for (int64_t r : key) {
      held = held && view_->layout.find_dim(shared.root.dim_name(r)).has_value();
    }
    if (held) {
      if (!has_self()) {
        return NotMember(view_->layout, shared.global_rank,
                         absl::StrCat("group along '", dim, "'"));
      }
      if (key.size() == 1) return shared.dims[key[0]];
      return shared.flattened.at(key);
    }
  }
  return view_->layout.dim_index(dim).status();  // NotFound, listing the names
}

absl::StatusOr<std::shared_ptr<Communicator>> DeviceMesh::get_group(
    int64_t dim) const {
  if (dim < 0 || dim >= ndim()) {
    return absl::OutOfRangeError(absl::StrCat(
        "dimension ", dim, " is outside a ", ndim(), "-D mesh"));
  }
  return get_group(view_->layout.dim_name(dim));
}

absl::StatusOr<DeviceMesh> DeviceMesh::operator[](
    absl::string_view dim) const {
  const std::string name(dim);
  return slice(absl::MakeConstSpan(&name, 1));
}

absl::StatusOr<DeviceMesh> DeviceMesh::operator[](int64_t dim) const {
  VEMESH_RETURN_IF_ERROR(view_->layout.dim_size(dim));
  return (*this)[view_->layout.dim_name(dim)];
}

absl::StatusOr<DeviceMesh>
DeviceMesh::operator[](std::initializer_list<absl::string_view> dims) const {
  std::vector<std::string> names(dims.begin(), dims.end());
  return slice(names);
}

absl::StatusOr<DeviceMesh> DeviceMesh::slice(
    absl::Span<const std::string> dims) const {
  if (!has_self()) {
    return NotMember(view_->layout, view_->shared->global_rank, "sub-mesh to slice");
  }
  VEMESH_ASSIGN_OR_RETURN(
      auto sub, view_->layout.submesh(dims, view_->shared->global_rank));
  return DeviceMesh(view_->shared, std::move(sub));
}

absl::StatusOr<DeviceMesh> DeviceMesh::submesh_at(
    absl::Span<const std::string> dims, int64_t global_rank) const {
  // Local: the child is a view of the layout. Its communicators are found
  // through `shared_` when this process is a member, and refused otherwise.
  VEMESH_ASSIGN_OR_RETURN(auto sub, view_->layout.submesh(dims, global_rank));
  return DeviceMesh(view_->shared, std::move(sub));
}

bool DeviceMesh::same_root(const DeviceMesh& other) const {
  return view_->shared == other.view_->shared;
}

absl::StatusOr<std::shared_ptr<Communicator>> DeviceMesh::flatten(
    absl::Span<const std::string> dims, absl::string_view name) const {
  const std::string flat_name =
      name.empty() ? absl::StrJoin(dims, "_") : std::string(name);
  // Validates the names (known, distinct, non-empty) the layout's way.
  VEMESH_RETURN_IF_ERROR(view_->layout.flatten(dims, flat_name));
  if (view_->shared->device_type == DeviceType::kMeta) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a meta mesh has no communicators: cannot flatten [",
        absl::StrJoin(dims, ", "), "]"));
  }
  std::vector<int64_t> key;
  for (const std::string& d : dims) {
    VEMESH_ASSIGN_OR_RETURN(auto r, view_->shared->root.dim_index(d));
    key.push_back(r);
  }
  Shared& shared = *view_->shared;
  // One dimension is its own group: nothing to split, but a new name is
  // registered so that get_group finds it (its own name needs nothing).
  const bool one_dim = key.size() == 1;
  const bool own_name = one_dim && shared.root.dim_name(key[0]) == flat_name;

  // Flattens wait for each other, never get_group: see Shared::flatten_mu.
  std::lock_guard<std::mutex> flatten_lock(shared.flatten_mu);
  std::optional<std::shared_ptr<Communicator>> known;
  {
    std::lock_guard<std::mutex> lock(shared.mu);
    auto bound = shared.flat_names.find(flat_name);
    if ((bound != shared.flat_names.end() && bound->second != key) ||
        (!own_name && shared.root.find_dim(flat_name).has_value())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "flatten name '", flat_name,
          "' already names another dimension or flattened group of ",
          shared.root.ToString()));
    }
    if (one_dim) {
      if (!own_name) shared.flat_names.emplace(flat_name, key);
    } else if (auto cached = shared.flattened.find(key);
               cached != shared.flattened.end()) {
      known = cached->second;
    }
  }
  if (one_dim) return get_group(dims[0]);

  if (!known.has_value() && shared.bootstrap == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot flatten [", absl::StrJoin(dims, ", "),
        "]: this mesh adopted its groups (DeviceMesh::FromGroups) and has no "
        "world to split"));
  }
  if (!known.has_value()) {
    // Collective over the world: check, then one split. No `mu` held.
    const std::vector<AgreementField> fields = {
        {"dims", absl::StrCat("[", absl::StrJoin(dims, ", "), "]")},
        {"name", flat_name}};
    VEMESH_RETURN_IF_ERROR(CheckAgreement(*shared.bootstrap,
                                          "DeviceMesh::flatten", fields,
                                          absl::Now() + shared.timeout));
    int color = -1;
    int split_key = 0;
    if (shared.root.contains(shared.global_rank)) {
      VEMESH_ASSIGN_OR_RETURN(
          auto pos, shared.root.group_position(dims, shared.global_rank));
      color = static_cast<int>(pos.group);
      split_key = static_cast<int>(pos.index);
    }
    VEMESH_ASSIGN_OR_RETURN(auto group,
                            shared.device_world->split(color, split_key));
    known = std::move(group);
  }
  {
    std::lock_guard<std::mutex> lock(shared.mu);
    shared.flattened.emplace(key, *known);
    shared.flat_names.emplace(flat_name, key);
  }
  if (*known == nullptr) {
    return NotMember(view_->layout, shared.global_rank,
                     absl::StrCat("flattened group '", flat_name,
                                  "' (it took part in the split)"));
  }
  return *known;
}

absl::StatusOr<std::string> DeviceMesh::backend(absl::string_view dim) const {
  VEMESH_ASSIGN_OR_RETURN(auto root_dim, view_->shared->root.dim_index(dim));
  if (view_->shared->backends == nullptr) {
    // Adopted groups name their own backend; a meta mesh has none.
    const auto& dims = view_->shared->dims;
    if (static_cast<size_t>(root_dim) < dims.size() &&
        dims[root_dim] != nullptr) {
      return std::string(dims[root_dim]->backend());
    }
    return std::string();
  }
  return view_->shared->backends->dim_backend(root_dim);
}

int DeviceMesh::host_local_rank() const { return view_->shared->host_local_rank; }
int DeviceMesh::host_size() const { return view_->shared->host_size; }

std::string DeviceMesh::ToString() const {
  std::string out = absl::StrCat("DeviceMesh(", DeviceTypeName(device_type()));
  for (int64_t d = 0; d < ndim(); ++d) {
    auto size = view_->layout.dim_size(d);
    absl::StrAppend(&out, ", ", view_->layout.dim_name(d), "=", size.value_or(0));
  }
  absl::StrAppend(&out, ", rank=", global_rank());
  if (view_->shared->backends != nullptr) {
    absl::StrAppend(&out, ", ", view_->shared->backends->ToString());
  }
  absl::StrAppend(&out, has_self() ? ")" : " (not a member))");
  return out;
}

absl::StatusOr<DeviceMesh> init_device_mesh(
    absl::string_view device_type, absl::Span<const int64_t> mesh_shape,
    absl::Span<const std::string> mesh_dim_names, const MeshOptions& options) {
  VEMESH_ASSIGN_OR_RETURN(auto parsed, ParseDeviceType(device_type));
  if (!parsed.warning.empty()) {
    std::fprintf(stderr, "vemesh: warning: %s\n", parsed.warning.c_str());
  }
  VEMESH_ASSIGN_OR_RETURN(
      auto layout,
      MeshLayout::Create(mesh_shape, mesh_dim_names, options.ranks));
  return DeviceMesh::Create(parsed.type, std::move(layout), options);
}

}  // namespace vemesh
