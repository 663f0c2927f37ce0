// The mesh handle: what a DeviceMesh answers (its shape, this rank's place,
// its groups, sub-meshes). Creation is in mesh_creation.cc, flatten /
// unflatten / view in mesh_reshape.cc; the state they share in
// internal/mesh_shared.h.

#include "vemesh/mesh/device_mesh.h"

#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/mesh/internal/mesh_shared.h"

namespace vemesh {

DeviceMesh::DeviceMesh(std::shared_ptr<Shared> shared, MeshLayout layout) {
  const bool has_self = layout.contains(shared->global_rank);
  view_ = std::make_shared<const View>(
      View{std::move(shared), std::move(layout), has_self});
}

DeviceType DeviceMesh::device_type() const {
  return view_->shared->device_type;
}
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
    return absl::NotFoundError(absl::StrCat("rank ", view_->shared->global_rank,
                                            " is not a member of ",
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
    return absl::OutOfRangeError(
        absl::StrCat("dimension ", dim, " is outside a ", ndim(), "-D mesh"));
  }
  VEMESH_ASSIGN_OR_RETURN(auto coord, get_coordinate());
  return coord[dim];
}

absl::StatusOr<int64_t> DeviceMesh::get_local_rank() const {
  if (ndim() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "get_local_rank() without a dimension needs a 1-D mesh, and ",
        view_->layout.ToString(), " has ", ndim(), " dimensions: name one of [",
        absl::StrJoin(view_->layout.dim_names(), ", "), "]"));
  }
  return get_local_rank(int64_t{0});
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
    return absl::OutOfRangeError(
        absl::StrCat("dimension ", dim, " is outside a ", ndim(), "-D mesh"));
  }
  return get_group(view_->layout.dim_name(dim));
}

absl::StatusOr<DeviceMesh> DeviceMesh::operator[](absl::string_view dim) const {
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
  return absl::Hash<std::tuple<const void*, std::vector<std::string>,
                               std::vector<int64_t>, int64_t>>{}(
      std::make_tuple(static_cast<const void*>(view_->shared.get()),
                      layout.dim_names(), layout.shape(), first));
}

bool DeviceMesh::same_root(const DeviceMesh& other) const {
  return view_->shared == other.view_->shared;
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
    if (view_->shared->device_world == nullptr &&
        view_->shared->backends != nullptr) {
      return std::string(
          BackendName(view_->shared->backends->default_backend()));
    }
    return std::string(view_->shared->device_world->backend());
  }
  return std::string(
      BackendName(view_->shared->backends->dim_backend(plan_dim)));
}

int DeviceMesh::host_local_rank() const {
  return view_->shared->host_local_rank;
}
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
    absl::StrAppend(&out, ", ", view_->layout.dim_name(d), "=",
                    size.value_or(0));
  }
  absl::StrAppend(&out, ", rank=", global_rank());
  if (view_->shared->backends != nullptr) {
    absl::StrAppend(&out, ", ", view_->shared->backends->ToString());
  }
  absl::StrAppend(&out, has_self() ? ")" : " (not a member))");
  return out;
}

}  // namespace vemesh
