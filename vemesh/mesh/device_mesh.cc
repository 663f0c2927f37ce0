#include "vemesh/mesh/device_mesh.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/bootstrap/agreement.h"
#include "vemesh/bootstrap/bootstrap_over.h"
#include "vemesh/bootstrap/launch.h"
#include "vemesh/comm/nccl/nccl_communicator.h"
#include "vemesh/base/log.h"
#include "vemesh/mesh/internal/mesh_backends.h"
#include "vemesh/base/status_macros.h"

namespace vemesh {

// What a mesh and all its children share: the layout the mesh was created
// with (the "root"), this process's place in the world, and the
// communicators. Dimension communicators are indexed by root dimension;
// flattened ones are keyed by the root dimensions they span, in order.
// The dimensions of every view of one root (DeviceMesh::view), by name:
// the groups each enumerates and this rank's communicator, so that a view
// sharing a name shares the communicator, and a view whose groups differ
// for a known name is refused.
struct ViewFamily {
  struct Dim {
    std::vector<std::vector<int64_t>> groups;  // sorted
    std::shared_ptr<Communicator> mine;        // null outside the mesh
  };
  std::mutex mu;
  absl::flat_hash_map<std::string, Dim> dims;
};

struct DeviceMesh::Shared {
  Shared(DeviceType type, MeshLayout layout, int64_t rank)
      : device_type(type), root(std::move(layout)), global_rank(rank) {}
  // A new root over the same ranks (unflatten, view): this rank's place,
  // the bootstrap, the backends and their worlds carried over; no groups.
  std::shared_ptr<Shared> Sibling(MeshLayout layout) const {
    auto next = std::make_shared<Shared>(device_type, std::move(layout),
                                         global_rank);
    next->host_local_rank = host_local_rank;
    next->host_size = host_size;
    next->world_hosts = world_hosts;
    next->timeout = timeout;
    next->bootstrap = bootstrap;
    next->backends = backends;
    next->device_world = device_world;
    return next;
  }

  const DeviceType device_type;
  const MeshLayout root;
  const int64_t global_rank;
  int host_local_rank = 0;
  int host_size = 1;
  // The host identity of every world rank, gathered at creation; null for
  // a meta mesh or one made from groups.
  std::shared_ptr<const std::vector<std::string>> world_hosts;
  absl::Duration timeout = absl::Seconds(60);
  // How the ranks found each other; null for a meta mesh. Flatten's
  // agreement check goes through it.
  std::shared_ptr<Bootstrap> bootstrap;
  // The backends' worlds, and each root dimension's backend. Shared with
  // the meshes `unflatten` derives (they split the same worlds).
  std::shared_ptr<MeshBackends> backends;
  // For each root dimension, the dimension of `backends`' plan it takes its
  // backend from: the identity for a created mesh; an unflattened dimension's
  // parts all map to the dimension they split.
  std::vector<int64_t> backend_dim;
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
  // Every name given to flatten: the root dimensions it spans (one for a
  // one-dimension flatten: that dimension's group), and the dimensions it
  // was flattened from, as given (root names or earlier flatten names), so
  // that any mesh holding them can derive the flattened dimension.
  struct FlatName {
    std::vector<int64_t> key;
    std::vector<std::string> dims;
  };
  absl::flat_hash_map<std::string, FlatName> flat_names;
  // The views of this root and of the root it is a view of; made by the
  // first view(). Under `mu`.
  std::shared_ptr<ViewFamily> family;

  // `layout` with every name of `names` that it lacks but that names a
  // flattening of dimensions it holds (recursively) flattened in, so that
  // each of `names` is a dimension of the result. A name that is neither
  // stays missing (the caller's layout call reports it). Takes `mu`.
  absl::StatusOr<MeshLayout> Resolve(MeshLayout layout,
                                     absl::Span<const std::string> names,
                                     int depth = 0);
};

absl::StatusOr<MeshLayout> DeviceMesh::Shared::Resolve(
    MeshLayout layout, absl::Span<const std::string> names, int depth) {
  for (const std::string& name : names) {
    if (layout.find_dim(name).has_value()) continue;
    std::vector<std::string> parts;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = flat_names.find(name);
      if (it == flat_names.end()) continue;
      parts = it->second.dims;
    }
    // Each flattening names only earlier ones: the depth is bounded by
    // their number; the bound guards a corrupted map.
    if (depth > static_cast<int>(MeshLayout::kMaxDims) * 2) {
      return absl::InternalError(
          absl::StrCat("flatten name '", name, "' nests too deeply"));
    }
    VEMESH_ASSIGN_OR_RETURN(layout,
                            Resolve(std::move(layout), parts, depth + 1));
    for (const std::string& part : parts) {
      if (!layout.find_dim(part).has_value()) {
        return absl::NotFoundError(absl::StrCat(
            "mesh dimension '", name, "' is the flattening of [",
            absl::StrJoin(parts, ", "), "], and ", layout.ToString(),
            " lacks '", part, "': expected a mesh that holds all of them"));
      }
    }
    VEMESH_ASSIGN_OR_RETURN(layout, layout.flatten(parts, name));
  }
  return layout;
}

namespace {

std::string ShapeText(absl::Span<const int64_t> shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

std::string RankListText(const MeshLayout& layout) {
  if (!layout.has_rank_table()) return "arange";
  return absl::StrCat("[", absl::StrJoin(layout.ranks(), ", "), "]");
}

// This rank's request to split out the groups along dimension `name` of
// `layout`: its group and place in it, or no group (color -1) when the rank
// is not in the layout (it still takes part in the collective split).
absl::StatusOr<SplitRequest> DimSplitRequest(const MeshLayout& layout,
                                             const std::string& name,
                                             int64_t rank, bool member) {
  SplitRequest request;
  request.name = name;
  if (member) {
    VEMESH_ASSIGN_OR_RETURN(auto pos, layout.group_position({name}, rank));
    request.color = static_cast<int>(pos.group);
    request.key = static_cast<int>(pos.index);
  }
  return request;
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
    VEMESH_ASSIGN_OR_RETURN(auto made, MakeBootstrapOver(*options.world, deadline));
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

  // (2) Agreement, host identities and the bootstrap's host world in one
  // step (under MPI: one all-gather, closed by the world's MPI_Comm_idup).
  const std::vector<AgreementField> fields = {
      {"device type", std::string(DeviceTypeName(device_type))},
      {"shape", ShapeText(layout.shape())},
      {"dim names",
       absl::StrCat("[", absl::StrJoin(layout.dim_names(), ", "), "]")},
      {"ranks", RankListText(layout)},
      {"backends", absl::StrJoin(plan.dims, ", ")},
  };
  VEMESH_ASSIGN_OR_RETURN(
      AgreedWorld agreed,
      AgreeAndMakeWorld(*bootstrap, "DeviceMesh::Create", fields,
                        HostIdentity(), deadline, options.timeout));
  const std::vector<std::string>& hosts = agreed.payloads;

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
  const std::string& mine = hosts[world_rank];
  for (int r = 0; r < world_size; ++r) {
    if (hosts[r] != mine) continue;
    if (r < world_rank) ++shared->host_local_rank;
  }
  shared->host_size =
      static_cast<int>(std::count(hosts.begin(), hosts.end(), mine));
  shared->world_hosts = std::make_shared<const std::vector<std::string>>(hosts);
  const LauncherLocal launcher = LauncherLocalRank();
  if (options.world == nullptr && launcher.rank >= 0 &&
      launcher.rank != shared->host_local_rank) {
    LogWarning(absl::StrCat("rank ", world_rank, ": ", launcher.variable, "=",
                            launcher.rank, " says local rank ", launcher.rank,
                            " but the host identities say ",
                            shared->host_local_rank, "; using ",
                            shared->host_local_rank));
  }

  // (5) The backends' worlds.
  auto backends = MeshBackends::Create(
      *bootstrap, std::move(plan), std::move(agreed.world),
      CudaDeviceRequest{options.cuda_device, shared->host_local_rank,
                        shared->host_size},
      shared->host_size == world_size, deadline, options.timeout,
      options.nccl);
  if (!backends.ok()) return backends.status();
  shared->backends = *std::move(backends);
  shared->device_world = shared->backends->default_world();
  for (int64_t d = 0; d < layout.ndim(); ++d) shared->backend_dim.push_back(d);

  // (6) The dimensions' groups: one split_many per backend world, worlds in
  // the order of their first dimension (the same calls in the same order on
  // every rank). NCCL builds all its dimensions' communicators in one group.
  const bool member = layout.contains(world_rank);
  const int64_t ndim = layout.ndim();
  std::vector<SplitRequest> requests(static_cast<size_t>(ndim));
  for (int64_t d = 0; d < ndim; ++d) {
    VEMESH_ASSIGN_OR_RETURN(
        requests[d],
        DimSplitRequest(layout, layout.dim_name(d), world_rank, member));
  }
  shared->dims.resize(static_cast<size_t>(ndim));
  std::vector<bool> made(static_cast<size_t>(ndim), false);
  for (int64_t d = 0; d < ndim; ++d) {
    if (made[d]) continue;
    const std::shared_ptr<Communicator>& world =
        shared->backends->world_of_dim(d);
    std::vector<int64_t> dims;
    std::vector<SplitRequest> batch;
    for (int64_t e = d; e < ndim; ++e) {
      if (shared->backends->world_of_dim(e) != world) continue;
      dims.push_back(e);
      batch.push_back(requests[e]);
      made[e] = true;
    }
    VEMESH_ASSIGN_OR_RETURN(auto groups, world->split_many(batch, deadline));
    for (size_t i = 0; i < dims.size(); ++i) {
      shared->dims[dims[i]] = std::move(groups[i]);
    }
  }
  // (7) Placement warnings, once per job: from global rank 0, after every
  // rank made its groups (so the mesh works whatever is said).
  if (world_rank == 0 && !options.latency_sensitive_dims.empty()) {
    auto placement = ComputePlacement(layout, *shared->world_hosts);
    if (placement.ok()) {
      for (const std::string& warning : PlacementWarnings(
               *placement, layout, options.latency_sensitive_dims)) {
        LogWarning(warning);
      }
    }
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
  if (auto d = view_->layout.find_dim(dim)) return view_->layout.dim_size(*d);
  const std::string name(dim);
  VEMESH_ASSIGN_OR_RETURN(
      MeshLayout resolved,
      view_->shared->Resolve(view_->layout, absl::MakeConstSpan(&name, 1)));
  return resolved.dim_size(dim);
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
  if (auto d = view_->layout.find_dim(dim)) return get_local_rank(*d);
  // A flattened name: this rank's index along it.
  const std::string name(dim);
  VEMESH_ASSIGN_OR_RETURN(
      MeshLayout resolved,
      view_->shared->Resolve(view_->layout, absl::MakeConstSpan(&name, 1)));
  VEMESH_ASSIGN_OR_RETURN(int64_t d, resolved.dim_index(dim));
  if (!has_self()) return get_coordinate().status();
  VEMESH_ASSIGN_OR_RETURN(Coordinate coord,
                          resolved.coordinate_of(view_->shared->global_rank));
  return coord[d];
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
  Shared& shared = *view_->shared;
  // A dimension of this mesh, or a name given to `flatten` when this mesh
  // holds the dimensions it flattened. Resolve takes `mu` only for look-ups:
  // a flatten in progress holds only `flatten_mu` while it communicates.
  std::vector<int64_t> key;
  if (auto own = view_->layout.find_dim(dim)) {
    // The common case: a dimension of this mesh, no layout copied.
    key = view_->layout.root_dims(*own);
  } else {
    const std::string name(dim);
    VEMESH_ASSIGN_OR_RETURN(
        MeshLayout resolved,
        shared.Resolve(view_->layout, absl::MakeConstSpan(&name, 1)));
    VEMESH_ASSIGN_OR_RETURN(int64_t d, resolved.dim_index(dim));
    key = resolved.root_dims(d);
  }
  if (!has_self()) {
    return NotMember(view_->layout, shared.global_rank,
                     absl::StrCat("group along '", dim, "'"));
  }
  if (key.size() == 1) return shared.dims[key[0]];
  std::lock_guard<std::mutex> lock(shared.mu);
  auto flat = shared.flattened.find(key);
  if (flat == shared.flattened.end() || flat->second == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dimension '", dim, "' of ", view_->layout.ToString(),
        " spans several dimensions of the root mesh but has no communicator: "
        "call flatten on every rank first"));
  }
  return flat->second;
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

absl::StatusOr<DeviceMesh> DeviceMesh::operator[](
    std::initializer_list<absl::string_view> dims) const {
  std::vector<std::string> names(dims.begin(), dims.end());
  return slice(names);
}

absl::StatusOr<DeviceMesh> DeviceMesh::slice(
    absl::Span<const std::string> dims) const {
  if (!has_self()) {
    return NotMember(view_->layout, view_->shared->global_rank,
                     "sub-mesh to slice");
  }
  return submesh_at(dims, view_->shared->global_rank);
}

absl::StatusOr<DeviceMesh> DeviceMesh::submesh_at(
    absl::Span<const std::string> dims, int64_t global_rank) const {
  // Local: the child is a view of the layout (flattened names derived from
  // the dimensions they flatten). Its communicators are found through the
  // shared state when this process is a member, and refused otherwise.
  bool all_present = true;
  for (const std::string& d : dims) {
    all_present = all_present && view_->layout.find_dim(d).has_value();
  }
  if (all_present) {  // the common case: no layout copied
    VEMESH_ASSIGN_OR_RETURN(auto sub, view_->layout.submesh(dims, global_rank));
    return DeviceMesh(view_->shared, std::move(sub));
  }
  VEMESH_ASSIGN_OR_RETURN(MeshLayout resolved,
                          view_->shared->Resolve(view_->layout, dims));
  VEMESH_ASSIGN_OR_RETURN(auto sub, resolved.submesh(dims, global_rank));
  return DeviceMesh(view_->shared, std::move(sub));
}

DeviceMesh DeviceMesh::root_mesh() const {
  return DeviceMesh(view_->shared, view_->shared->root);
}

absl::StatusOr<std::shared_ptr<Communicator>> DeviceMesh::get_group() const {
  if (ndim() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "get_group() without a dimension needs a 1-D mesh, and ",
        view_->layout.ToString(), " has ", ndim(), " dimensions: name one of [",
        absl::StrJoin(view_->layout.dim_names(), ", "), "]"));
  }
  return get_group(int64_t{0});
}

absl::StatusOr<std::vector<std::shared_ptr<Communicator>>>
DeviceMesh::get_all_groups() const {
  std::vector<std::shared_ptr<Communicator>> out;
  out.reserve(ndim());
  for (int64_t d = 0; d < ndim(); ++d) {
    VEMESH_ASSIGN_OR_RETURN(auto group, get_group(d));
    out.push_back(std::move(group));
  }
  return out;
}

bool operator==(const DeviceMesh& a, const DeviceMesh& b) {
  return a.view_ == b.view_ || (a.view_->shared == b.view_->shared &&
                                a.view_->layout == b.view_->layout);
}

size_t DeviceMesh::hash_value() const {
  // What operator== compares: the root, and the layout's names, shape and
  // ranks (its first rank stands for the rest: O(ndim), and equal layouts
  // have equal first ranks).
  const MeshLayout& layout = view_->layout;
  const Coordinate zero(layout.ndim(), 0);
  const int64_t first = layout.rank_at(zero).value_or(-1);
  return absl::Hash<std::tuple<const void *, std::vector<std::string>,
                               std::vector<int64_t>, int64_t>>{}(
      std::make_tuple(static_cast<const void *>(view_->shared.get()),
                      layout.dim_names(), layout.shape(), first));
}

bool DeviceMesh::same_root(const DeviceMesh& other) const {
  return view_->shared == other.view_->shared;
}

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
    return absl::FailedPreconditionError(absl::StrCat(
        "a meta mesh has no communicators: cannot flatten [",
        absl::StrJoin(dims, ", "), "]"));
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
    VEMESH_ASSIGN_OR_RETURN(
        auto groups,
        shared.device_world->split_many(absl::MakeConstSpan(&request, 1),
                                        absl::Now() + shared.timeout));
    known = std::move(groups[0]);
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
    VEMESH_ASSIGN_OR_RETURN(
        std::vector<std::shared_ptr<Communicator>> made,
        shared.backends->world_of_dim(b)->split_many(
            requests, absl::Now() + shared.timeout));
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
    for (const auto &[key, comm] : shared.flattened) {
      next->flattened.emplace(remap(key), comm);
    }
    for (const auto &[name, flat] : shared.flat_names) {
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
  const int64_t plan_dim = view_->shared->backend_dim[root_dim];
  if (plan_dim < 0) {
    return std::string(view_->shared->device_world->backend());
  }
  return view_->shared->backends->dim_backend(plan_dim);
}

absl::StatusOr<DeviceMesh> DeviceMesh::view(
    absl::Span<const int64_t> shape,
    absl::Span<const std::string> names) const {
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
  std::shared_ptr<ViewFamily> family;
  {
    std::lock_guard<std::mutex> lock(shared.mu);
    family = shared.family;
  }
  if (family == nullptr) {
    family = std::make_shared<ViewFamily>();
    for (int64_t d = 0; d < from.ndim(); ++d) {
      VEMESH_ASSIGN_OR_RETURN(auto groups, from.groups({from.dim_name(d)}));
      std::sort(groups.begin(), groups.end());
      family->dims.emplace(
          from.dim_name(d),
          ViewFamily::Dim{std::move(groups),
                          d < static_cast<int64_t>(shared.dims.size())
                              ? shared.dims[d]
                              : nullptr});
    }
    std::lock_guard<std::mutex> lock(shared.mu);
    if (shared.family == nullptr) shared.family = family;
    family = shared.family;
  }
  // Which dimensions are shared (same name, same groups) and which new;
  // a shared name with other groups is refused, the same on every rank.
  std::vector<std::vector<std::vector<int64_t>>> groups(layout.ndim());
  std::vector<std::shared_ptr<Communicator>> known(layout.ndim());
  std::vector<bool> is_new(layout.ndim(), true);
  {
    std::lock_guard<std::mutex> lock(family->mu);
    for (int64_t d = 0; d < layout.ndim(); ++d) {
      const std::string& name = layout.dim_name(d);
      VEMESH_ASSIGN_OR_RETURN(groups[d], layout.groups({name}));
      std::sort(groups[d].begin(), groups[d].end());
      auto it = family->dims.find(name);
      if (it == family->dims.end()) continue;
      if (it->second.groups != groups[d]) {
        size_t i = 0;
        while (i < groups[d].size() && i < it->second.groups.size() &&
               groups[d][i] == it->second.groups[i]) {
          ++i;
        }
        const auto text = [](const std::vector<std::vector<int64_t>>& g,
                             size_t at) {
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
      is_new[d] = false;
      known[d] = it->second.mine;
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
      VEMESH_ASSIGN_OR_RETURN(
          SplitRequest request,
          DimSplitRequest(layout, layout.dim_name(d), shared.global_rank,
                          member));
      requests.push_back(std::move(request));
    }
    VEMESH_ASSIGN_OR_RETURN(
        auto made, shared.device_world->split_many(
                       requests, absl::Now() + shared.timeout));
    size_t next_new = 0;
    for (int64_t d = 0; d < layout.ndim(); ++d) {
      next->dims.push_back(is_new[d] ? std::move(made[next_new++]) : known[d]);
      next->backend_dim.push_back(-1);
    }
    // A shared dimension keeps the backend it was made on.
    for (int64_t d = 0; d < layout.ndim(); ++d) {
      if (is_new[d]) continue;
      auto at = from.find_dim(layout.dim_name(d));
      if (at && !shared.backend_dim.empty()) {
        next->backend_dim[d] = shared.backend_dim[*at];
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(family->mu);
    for (int64_t d = 0; d < layout.ndim(); ++d) {
      if (!is_new[d]) continue;
      family->dims.emplace(
          layout.dim_name(d),
          ViewFamily::Dim{std::move(groups[d]),
                          d < static_cast<int64_t>(next->dims.size())
                              ? next->dims[d]
                              : nullptr});
    }
  }
  return DeviceMesh(next, layout);
}

int DeviceMesh::host_local_rank() const { return view_->shared->host_local_rank; }
int DeviceMesh::host_size() const { return view_->shared->host_size; }

absl::StatusOr<Placement> DeviceMesh::get_placement() const {
  if (view_->shared->world_hosts == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "get_placement: ", view_->layout.ToString(), " has no placement: ",
        device_type() == DeviceType::kMeta
            ? "a meta mesh runs nowhere"
            : "a mesh made from existing groups gathered no host identities"));
  }
  return ComputePlacement(view_->layout, *view_->shared->world_hosts);
}

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
    LogWarning(parsed.warning);
  }
  VEMESH_ASSIGN_OR_RETURN(
      auto layout,
      MeshLayout::Create(mesh_shape, mesh_dim_names, options.ranks));
  if (parsed.index < 0) {
    return DeviceMesh::Create(parsed.type, std::move(layout), options);
  }
  MeshOptions with_device = options;  // "cuda:N": device N on this rank
  with_device.cuda_device = parsed.index;
  return DeviceMesh::Create(parsed.type, std::move(layout), with_device);
}

}  // namespace vemesh
