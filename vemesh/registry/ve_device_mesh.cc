// VeDeviceMesh's queries: each reads one snapshot of the state that
// ve_device_mesh_init.cc publishes.

#include "vemesh/registry/ve_device_mesh.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/registry/internal/registry_state.h"

namespace vemesh {

namespace registry_internal {

absl::Status NotInitialized() {
  return absl::FailedPreconditionError(
      "the device mesh is not initialised: call "
      "VESCALE_DEVICE_MESH.init_device_mesh(device_type, mesh_shape, "
      "mesh_dim_names) first");
}

namespace {

bool IsKnownRole(absl::string_view name) {
  return absl::EqualsIgnoreCase(name, "PP") ||
         absl::EqualsIgnoreCase(name, "DP") ||
         absl::EqualsIgnoreCase(name, "TP") ||
         absl::EqualsIgnoreCase(name, "DP_REPLICATE") ||
         absl::EqualsIgnoreCase(name, "DP_SHARD");
}

}  // namespace

// torchtitan's data-parallel dimensions: DP_REPLICATE (HSDP's replicas) and
// DP_SHARD (FSDP's shards). On a mesh without DP, the data-parallel role is
// their flattening, replicate-major: the dimensions of the ones present, in
// that order.
absl::StatusOr<std::vector<int64_t>> DataParallelParts(
    const MeshLayout& layout) {
  std::vector<int64_t> parts;
  for (absl::string_view role : {"DP_REPLICATE", "DP_SHARD"}) {
    absl::StatusOr<int64_t> d = layout.find_role(role);
    if (d.ok()) {
      parts.push_back(*d);
    } else if (!absl::IsNotFound(d.status())) {
      return d.status();
    }
  }
  return parts;
}

// The dimension that plays `role` (MeshLayout::find_role: by name, whatever
// the case; two dimensions that differ from it only by case are
// InvalidArgument). A 1-D mesh named neither DP nor TP (in any case) serves
// as both (veScale's rule). -1 when the mesh lacks the role.
absl::StatusOr<int64_t> RoleDim(const MeshLayout& layout,
                                absl::string_view role) {
  absl::StatusOr<int64_t> found = layout.find_role(role);
  if (found.ok() || !absl::IsNotFound(found.status())) return found;
  if (absl::EqualsIgnoreCase(role, "DP")) {
    // One of DP_REPLICATE / DP_SHARD alone is DP; both: see dp_parts.
    VEMESH_ASSIGN_OR_RETURN(auto parts, DataParallelParts(layout));
    if (parts.size() == 1) return parts[0];
  }
  if (layout.ndim() == 1 &&
      (absl::EqualsIgnoreCase(role, "DP") ||
       absl::EqualsIgnoreCase(role, "TP")) &&
      !IsKnownRole(layout.dim_name(0))) {
    return 0;
  }
  return -1;
}

// The peer `shift` stages away, within one state.
absl::StatusOr<std::optional<int64_t>> StagePeer(const DeviceMesh& mesh,
                                                 int64_t pp_dim, int64_t shift,
                                                 bool wrap) {
  // Without a PP dimension there is one stage: its only neighbour is itself,
  // and only when wrapping (MPI_Cart_shift on a periodic dimension of 1).
  if (pp_dim < 0) {
    return wrap ? std::optional<int64_t>(mesh.global_rank()) : std::nullopt;
  }
  return mesh.layout().neighbor(mesh.layout().dim_name(pp_dim),
                                mesh.global_rank(), shift, wrap);
}

}  // namespace registry_internal

using registry_internal::DataParallelParts;
using registry_internal::RoleDim;
using registry_internal::StagePeer;

namespace {

// The most meshes one get_global_* list builds. Each is a DeviceMesh of a
// few hundred bytes; a longer list (a meta mesh of 2^40 ranks has 2^20 TP
// rows) is refused before anything is allocated.
constexpr int64_t kMaxGlobalMeshes = int64_t{1} << 16;

absl::Status TooManyMeshes(absl::string_view call, int64_t count,
                           const MeshLayout& layout) {
  return absl::ResourceExhaustedError(
      absl::StrCat(call, " would build ", count, " meshes of ",
                   layout.ToString(), ": expected at most ", kMaxGlobalMeshes,
                   "; ask for this rank's own (get_role_mesh, get_prev_stage / "
                   "get_next_stage) or compute members with get_global_rank"));
}

absl::Status NotMember(const DeviceMesh& mesh) {
  return absl::NotFoundError(
      absl::StrCat("global rank ", mesh.global_rank(), " is not a member of ",
                   mesh.ToString(), ": the mesh is smaller than the world"));
}

absl::StatusOr<DeviceMesh> StageMesh(const DeviceMesh& mesh, int64_t pp_dim,
                                     int64_t rank);

absl::Status MissingRole(const MeshLayout& layout, absl::string_view role) {
  return absl::NotFoundError(
      absl::StrCat("the device mesh ", layout.ToString(), " has no '", role,
                   "' dimension: expected one of [",
                   absl::StrJoin(layout.dim_names(), ", "), "]"));
}

// Whether `name` is a flattened name of the registry's mesh (given to
// flatten on it, or on any mesh of its root, after init): its size, or
// nullopt when the mesh does not know it (the caller answers as for a
// missing dimension). Exact names only: flatten names are not roles.
absl::StatusOr<std::optional<int64_t>> FlatSize(const DeviceMesh& mesh,
                                                absl::string_view name) {
  absl::StatusOr<int64_t> size = mesh.size(name);
  if (size.ok()) return std::optional<int64_t>(*size);
  if (absl::IsNotFound(size.status())) return std::optional<int64_t>();
  return size.status();
}

// Names of every dimension except `skip`.
std::vector<std::string> NamesExcept(const MeshLayout& layout, int64_t skip) {
  std::vector<std::string> out;
  for (int64_t i = 0; i < layout.ndim(); ++i) {
    if (i != skip) out.push_back(layout.dim_name(i));
  }
  return out;
}

}  // namespace
// -- Named meshes -------------------------------------------------------------

const std::atomic<const void*>* VeDeviceMesh::published_for(
    MeshName mesh) const {
  if (mesh.is_default()) return &published_;
  std::lock_guard<std::mutex> lock(named_mu_);
  auto it = named_.find(mesh.name);
  return it == named_.end() ? nullptr : &it->second->published;
}

std::vector<std::string> VeDeviceMesh::mesh_names() const {
  std::vector<std::string> out;
  std::lock_guard<std::mutex> lock(named_mu_);
  for (const auto& [name, slot] : named_) {
    if (slot->published.load() != nullptr) out.push_back(name);
  }
  return out;
}

absl::Status VeDeviceMesh::MissingMesh(MeshName mesh) const {
  std::vector<std::string> have;
  if (is_initialized()) have.push_back("default");
  for (std::string& name : mesh_names()) have.push_back(std::move(name));
  return absl::NotFoundError(absl::StrCat(
      "the registry has no mesh named '", mesh.name, "': expected one of [",
      absl::StrJoin(have, ", "),
      "] (make it with init_device_mesh and InitOptions::mesh_name = \"",
      mesh.name, "\")"));
}

absl::Status VeDeviceMesh::role_elsewhere(absl::string_view role,
                                          MeshName asked) const {
  // The other meshes: the default one (unless asked) and every named one.
  std::vector<std::pair<std::string, const std::atomic<const void*>*>> others;
  if (!asked.is_default()) others.emplace_back("default", &published_);
  {
    std::lock_guard<std::mutex> lock(named_mu_);
    for (const auto& [name, slot] : named_) {
      if (name != asked.name) others.emplace_back(name, &slot->published);
    }
  }
  std::vector<std::string> holders;
  for (const auto& [name, published] : others) {
    const SnapshotGuard guard(*published);
    const auto* s = static_cast<const State*>(guard.get());
    if (s == nullptr) continue;
    // Exact roles and names only: a 1-D mesh's "serves as DP and TP" rule
    // answers for its own mesh, never for another.
    bool has = s->layout().find_role(role).ok();
    if (!has) has = s->mesh.size(role).ok();  // a flattened name
    if (has) {
      holders.push_back(absl::StrCat(name == "default" && !asked.is_default()
                                         ? std::string("the default mesh")
                                         : absl::StrCat("mesh '", name, "'"),
                                     " ", s->layout().ToString()));
    }
  }
  if (holders.empty()) return absl::OkStatus();
  const std::string asked_name =
      asked.is_default() ? std::string("default") : std::string(asked.name);
  return absl::FailedPreconditionError(absl::StrCat(
      "'", role, "' is not a dimension or role of the ",
      asked.is_default() ? "default mesh"
                         : absl::StrCat("mesh '", asked_name, "'"),
      " but of ", absl::StrJoin(holders, " and of "),
      ": pass that mesh's name (MeshName(\"name\") in C++, mesh_name= in "
      "Python); the registry never answers one mesh's role from another"));
}

bool VeDeviceMesh::is_current(const DeviceMesh& mesh, MeshName name) const {
  const Snapshot snap(*this, name);
  const State* s = snap.get();
  return s != nullptr && s->mesh.same_root(mesh);
}

absl::Status VeDeviceMesh::check_current(const DeviceMesh& mesh,
                                         MeshName name) const {
  // One snapshot for both questions: current? initialised at all?
  const Snapshot snap(*this, name);
  const State* s = snap.get();
  if (s != nullptr && s->mesh.same_root(mesh)) return absl::OkStatus();
  if (s == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        mesh.ToString(),
        " is stale: the device mesh was reset and none is initialised; call "
        "VESCALE_DEVICE_MESH.init_device_mesh first"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      mesh.ToString(),
      " is stale: it comes from a device mesh that init_device_mesh or reset "
      "has since replaced; ask VESCALE_DEVICE_MESH again"));
}

// -- The mesh and its sub-meshes ---------------------------------------------

absl::StatusOr<DeviceMesh> VeDeviceMesh::get(MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  return s->mesh;
}

absl::StatusOr<DeviceMesh> VeDeviceMesh::operator[](
    absl::string_view dim) const {
  const Snapshot snap(*this);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  const State& st = *s;
  auto d = st.layout().find_dim(dim);
  if (!d) {
    VEMESH_ASSIGN_OR_RETURN(auto flat, FlatSize(st.mesh, dim));
    if (!flat) {
      VEMESH_RETURN_IF_ERROR(role_elsewhere(dim, MeshName()));
      return st.layout().dim_index(dim).status();
    }
    if (!st.coordinate) return NotMember(st.mesh);
    return st.mesh[dim];
  }
  if (!st.coordinate) return NotMember(st.mesh);
  return st.dim_meshes[*d];
}

absl::StatusOr<DeviceMesh> VeDeviceMesh::operator[](int64_t dim) const {
  const Snapshot snap(*this);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  VEMESH_RETURN_IF_ERROR(s->layout().dim_size(dim));
  if (!s->coordinate) return NotMember(s->mesh);
  return s->dim_meshes[dim];
}

absl::StatusOr<DeviceMesh> VeDeviceMesh::operator[](
    std::initializer_list<absl::string_view> dims) const {
  std::vector<std::string> names(dims.begin(), dims.end());
  return get_submesh(names);
}

absl::StatusOr<DeviceMesh> VeDeviceMesh::get_submesh(
    absl::Span<const std::string> dims, MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  return s->mesh.slice(dims);
}

// -- Shape and coordinates ---------------------------------------------------

absl::StatusOr<int64_t> VeDeviceMesh::get_strategy_size(absl::string_view dim,
                                                        MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  if (auto d = s->layout().find_dim(dim)) return s->shape[*d];
  VEMESH_ASSIGN_OR_RETURN(auto flat, FlatSize(s->mesh, dim));
  if (flat) return *flat;
  VEMESH_RETURN_IF_ERROR(role_elsewhere(dim, mesh));
  return s->layout().dim_index(dim).status();
}

absl::StatusOr<int64_t> VeDeviceMesh::get_strategy_size(int64_t dim,
                                                        MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  return s->layout().dim_size(dim);
}

absl::StatusOr<Coordinate> VeDeviceMesh::get_strategy_coordinate(
    MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  if (!s->coordinate) return NotMember(s->mesh);
  return *s->coordinate;
}

absl::StatusOr<Coordinate> VeDeviceMesh::get_strategy_coordinate(
    int64_t global_rank, MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  return s->layout().coordinate_of(global_rank);
}

absl::Status VeDeviceMesh::get_strategy_coordinate(int64_t global_rank,
                                                   absl::Span<int64_t> out,
                                                   MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  return s->layout().coordinate_of(global_rank, out);
}

absl::StatusOr<int64_t> VeDeviceMesh::lookup_rank(absl::string_view dim,
                                                  MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  auto d = s->layout().find_dim(dim);
  if (!d) {
    VEMESH_ASSIGN_OR_RETURN(auto flat, FlatSize(s->mesh, dim));
    if (!flat) {
      VEMESH_RETURN_IF_ERROR(role_elsewhere(dim, mesh));
      return s->layout().dim_index(dim).status();
    }
    if (!s->coordinate) return NotMember(s->mesh);
    return s->mesh.get_local_rank(dim);
  }
  if (!s->coordinate) return NotMember(s->mesh);
  return (*s->coordinate)[*d];
}

absl::StatusOr<int64_t> VeDeviceMesh::lookup_rank(int64_t dim,
                                                  MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  VEMESH_RETURN_IF_ERROR(s->layout().dim_size(dim));
  if (!s->coordinate) return NotMember(s->mesh);
  return (*s->coordinate)[dim];
}

absl::StatusOr<int64_t> VeDeviceMesh::get_global_rank(
    absl::Span<const int64_t> coordinate, MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  return s->layout().rank_at(coordinate);
}

absl::StatusOr<int64_t> VeDeviceMesh::get_rank(MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  return s->mesh.global_rank();
}

absl::StatusOr<int64_t> VeDeviceMesh::get_local_rank(MeshName mesh) const {
  return host_local_rank(mesh);
}

absl::StatusOr<int64_t> VeDeviceMesh::host_local_rank(MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  return s->mesh.host_local_rank();
}

absl::StatusOr<Placement> VeDeviceMesh::get_placement(MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  return s->mesh.get_placement();
}

absl::StatusOr<Coordinate> VeDeviceMesh::get_coordinate(MeshName mesh) const {
  return get_strategy_coordinate(mesh);
}

absl::StatusOr<int64_t> VeDeviceMesh::size(MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  return s->layout().size();
}

absl::StatusOr<int64_t> VeDeviceMesh::size(absl::string_view dim,
                                           MeshName mesh) const {
  return get_strategy_size(dim, mesh);
}

absl::StatusOr<int64_t> VeDeviceMesh::size(int64_t dim, MeshName mesh) const {
  return get_strategy_size(dim, mesh);
}

absl::StatusOr<int64_t> VeDeviceMesh::ndim(MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  return s->layout().ndim();
}

absl::StatusOr<std::vector<int64_t>> VeDeviceMesh::shape(MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  return s->layout().shape();
}

absl::StatusOr<std::vector<std::string>> VeDeviceMesh::mesh_dim_names(
    MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  return s->layout().dim_names();
}

absl::StatusOr<DeviceType> VeDeviceMesh::device_type(MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  return s->mesh.device_type();
}

// -- Roles
// ---------------------------------------------------------------------

// Whether `role` is DP answered by the flattening of DP_REPLICATE x DP_SHARD.
bool VeDeviceMesh::IsFlatDp(const State& s, absl::string_view role) {
  return !s.dp_parts.empty() && absl::EqualsIgnoreCase(role, "DP");
}

absl::Status VeDeviceMesh::NoFlatDp(const State& s) {
  if (s.dp_flat.has_value()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the data-parallel group of ", s.layout().ToString(), " (",
      s.layout().dim_name(s.dp_parts[0]), " x ",
      s.layout().dim_name(s.dp_parts[1]),
      ") exists only on a cpu or cuda mesh made by init_device_mesh, not on "
      "a meta or elastic one"));
}

absl::StatusOr<int64_t> VeDeviceMesh::get_role_size(absl::string_view role,
                                                    MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  if (IsFlatDp(*s, role)) {
    return s->shape[s->dp_parts[0]] * s->shape[s->dp_parts[1]];
  }
  VEMESH_ASSIGN_OR_RETURN(const int64_t d, RoleDim(s->layout(), role));
  if (d >= 0) return s->layout().dim_size(d);
  VEMESH_ASSIGN_OR_RETURN(auto flat, FlatSize(s->mesh, role));
  if (flat) return *flat;
  VEMESH_RETURN_IF_ERROR(role_elsewhere(role, mesh));
  return 1;
}

absl::StatusOr<int64_t> VeDeviceMesh::get_role_rank(absl::string_view role,
                                                    MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  if (!s->coordinate) return NotMember(s->mesh);
  if (IsFlatDp(*s, role)) {
    return (*s->coordinate)[s->dp_parts[0]] * s->shape[s->dp_parts[1]] +
           (*s->coordinate)[s->dp_parts[1]];
  }
  VEMESH_ASSIGN_OR_RETURN(const int64_t d, RoleDim(s->layout(), role));
  if (d >= 0) return (*s->coordinate)[d];
  VEMESH_ASSIGN_OR_RETURN(auto flat, FlatSize(s->mesh, role));
  if (!flat) {
    VEMESH_RETURN_IF_ERROR(role_elsewhere(role, mesh));
    return 0;
  }
  return s->mesh.get_local_rank(role);
}

absl::StatusOr<DeviceMesh> VeDeviceMesh::get_role_mesh(absl::string_view role,
                                                       MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  if (IsFlatDp(*s, role)) {
    if (!s->coordinate) return NotMember(s->mesh);
    VEMESH_RETURN_IF_ERROR(NoFlatDp(*s));
    return *s->dp_flat;
  }
  VEMESH_ASSIGN_OR_RETURN(const int64_t d, RoleDim(s->layout(), role));
  if (d < 0) {
    VEMESH_ASSIGN_OR_RETURN(auto flat, FlatSize(s->mesh, role));
    if (!flat) {
      VEMESH_RETURN_IF_ERROR(role_elsewhere(role, mesh));
      return MissingRole(s->layout(), role);
    }
    if (!s->coordinate) return NotMember(s->mesh);
    return s->mesh[role];
  }
  if (!s->coordinate) return NotMember(s->mesh);
  return s->dim_meshes[d];
}

absl::StatusOr<std::shared_ptr<Communicator>> VeDeviceMesh::get_role_dim_groups(
    absl::string_view role, MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  if (IsFlatDp(*s, role)) {
    if (!s->coordinate) return NotMember(s->mesh);
    VEMESH_RETURN_IF_ERROR(NoFlatDp(*s));
    return s->dp_flat->get_group();
  }
  VEMESH_ASSIGN_OR_RETURN(const int64_t d, RoleDim(s->layout(), role));
  if (d < 0) {
    VEMESH_ASSIGN_OR_RETURN(auto flat, FlatSize(s->mesh, role));
    if (!flat) {
      VEMESH_RETURN_IF_ERROR(role_elsewhere(role, mesh));
      return MissingRole(s->layout(), role);
    }
    return s->mesh.get_group(role);
  }
  return s->mesh.get_group(d);
}

absl::StatusOr<std::vector<DeviceMesh>> VeDeviceMesh::get_global_role_meshes(
    absl::string_view role, MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  const MeshLayout& layout = s->layout();
  if (IsFlatDp(*s, role)) {
    return absl::UnimplementedError(absl::StrCat(
        "get_global_role_meshes('", role, "'): DP is the flattening of ",
        layout.dim_name(s->dp_parts[0]), " x ", layout.dim_name(s->dp_parts[1]),
        " on ", layout.ToString(), "; ask for either of them"));
  }
  VEMESH_ASSIGN_OR_RETURN(const int64_t d, RoleDim(layout, role));
  // The dimensions the role spans: d, or those a flattened name flattens.
  std::vector<bool> spanned(layout.ndim(), false);
  int64_t group_size = 1;
  std::vector<std::string> dims;
  if (d >= 0) {
    spanned[d] = true;
    group_size = s->shape[d];
    dims = {layout.dim_name(d)};
  } else {
    VEMESH_ASSIGN_OR_RETURN(auto flat, FlatSize(s->mesh, role));
    if (!flat) {
      VEMESH_RETURN_IF_ERROR(role_elsewhere(role, mesh));
      return MissingRole(layout, role);
    }
    dims = {std::string(role)};
    // The group of the mesh's first rank: its members differ from that
    // rank exactly along the flattened dimensions (O(group size * ndim)).
    const Coordinate first(layout.ndim(), 0);
    VEMESH_ASSIGN_OR_RETURN(const int64_t first_rank, layout.rank_at(first));
    VEMESH_ASSIGN_OR_RETURN(auto group, s->mesh.submesh_at(dims, first_rank));
    for (int64_t member : group.mesh()) {
      VEMESH_ASSIGN_OR_RETURN(Coordinate at, layout.coordinate_of(member));
      for (int64_t i = 0; i < layout.ndim(); ++i) {
        if (at[i] != first[i]) spanned[i] = true;
      }
    }
    group_size = *flat;
  }
  const int64_t count = layout.size() / group_size;
  if (count > kMaxGlobalMeshes) {
    return TooManyMeshes(absl::StrCat("get_global_role_meshes('", role, "')"),
                         count, layout);
  }
  std::vector<DeviceMesh> out;
  out.reserve(count);
  // Group g holds coordinate g, row-major over the other dimensions, at
  // index 0 along the spanned ones: O(ndim) per group, no list of the world.
  Coordinate at(layout.ndim(), 0);
  for (int64_t g = 0; g < count; ++g) {
    int64_t rest = g;
    for (int64_t i = layout.ndim() - 1; i >= 0; --i) {
      if (spanned[i]) continue;
      at[i] = rest % s->shape[i];
      rest /= s->shape[i];
    }
    VEMESH_ASSIGN_OR_RETURN(auto rank, layout.rank_at(at));
    VEMESH_ASSIGN_OR_RETURN(auto sub, s->mesh.submesh_at(dims, rank));
    out.push_back(std::move(sub));
  }
  return out;
}

absl::StatusOr<int64_t> VeDeviceMesh::get_pipeline_parallel_rank(
    MeshName mesh) const {
  return get_role_rank("PP", mesh);
}
absl::StatusOr<int64_t> VeDeviceMesh::get_data_parallel_rank(
    MeshName mesh) const {
  return get_role_rank("DP", mesh);
}
absl::StatusOr<int64_t> VeDeviceMesh::get_tensor_parallel_rank(
    MeshName mesh) const {
  return get_role_rank("TP", mesh);
}
absl::StatusOr<DeviceMesh> VeDeviceMesh::get_pipeline_parallel_mesh(
    MeshName mesh) const {
  return get_role_mesh("PP", mesh);
}
absl::StatusOr<DeviceMesh> VeDeviceMesh::get_data_parallel_mesh(
    MeshName mesh) const {
  return get_role_mesh("DP", mesh);
}
absl::StatusOr<DeviceMesh> VeDeviceMesh::get_tensor_parallel_mesh(
    MeshName mesh) const {
  return get_role_mesh("TP", mesh);
}
absl::StatusOr<std::shared_ptr<Communicator>>
VeDeviceMesh::get_pipeline_parallel_dim_groups(MeshName mesh) const {
  return get_role_dim_groups("PP", mesh);
}
absl::StatusOr<std::shared_ptr<Communicator>>
VeDeviceMesh::get_data_parallel_dim_groups(MeshName mesh) const {
  return get_role_dim_groups("DP", mesh);
}
absl::StatusOr<std::shared_ptr<Communicator>>
VeDeviceMesh::get_tensor_parallel_dim_groups(MeshName mesh) const {
  return get_role_dim_groups("TP", mesh);
}
absl::StatusOr<std::vector<DeviceMesh>>
VeDeviceMesh::get_global_tensor_parallel_meshes(MeshName mesh) const {
  return get_global_role_meshes("TP", mesh);
}

absl::StatusOr<std::vector<DeviceMesh>>
VeDeviceMesh::get_global_pipeline_parallel_meshes(MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  const State& st = *s;
  if (st.pp_dim < 0) return std::vector<DeviceMesh>{st.mesh};
  const int64_t stages = st.shape[st.pp_dim];
  if (stages > kMaxGlobalMeshes) {
    return TooManyMeshes("get_global_pipeline_parallel_meshes()", stages,
                         st.layout());
  }
  std::vector<DeviceMesh> out;
  out.reserve(stages);
  // Stage s holds the ranks whose PP index is s: anchor each stage at the
  // rank of coordinate (s, 0, ..., 0).
  Coordinate anchor(st.layout().ndim(), 0);
  for (int64_t stage = 0; stage < stages; ++stage) {
    anchor[st.pp_dim] = stage;
    VEMESH_ASSIGN_OR_RETURN(auto rank, st.layout().rank_at(anchor));
    VEMESH_ASSIGN_OR_RETURN(auto stage_mesh,
                            StageMesh(st.mesh, st.pp_dim, rank));
    out.push_back(std::move(stage_mesh));
  }
  return out;
}

// Rank and size from one snapshot: two queries could straddle a re-init
// and compare the old mesh's stage with the new one's stage count.
absl::StatusOr<bool> VeDeviceMesh::is_first_stage(MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  if (!s->coordinate) return NotMember(s->mesh);
  return s->pp_dim < 0 || (*s->coordinate)[s->pp_dim] == 0;
}

absl::StatusOr<bool> VeDeviceMesh::is_last_stage(MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  if (!s->coordinate) return NotMember(s->mesh);
  return s->pp_dim < 0 ||
         (*s->coordinate)[s->pp_dim] == s->shape[s->pp_dim] - 1;
}

// -- Pipeline neighbours
// -------------------------------------------------------

namespace {

// The stage (every dimension but PP) that holds `rank`. A mesh of PP alone
// has one-rank stages: a meta mesh of that rank, with no communicator.
absl::StatusOr<DeviceMesh> StageMesh(const DeviceMesh& mesh, int64_t pp_dim,
                                     int64_t rank) {
  if (pp_dim < 0) return mesh;
  std::vector<std::string> dims = NamesExcept(mesh.layout(), pp_dim);
  if (dims.empty()) {
    VEMESH_ASSIGN_OR_RETURN(auto single,
                            MeshLayout::Create({1}, {"stage"}, {rank}));
    return DeviceMesh::Meta(std::move(single), mesh.global_rank());
  }
  return mesh.submesh_at(dims, rank);
}

}  // namespace

absl::StatusOr<std::optional<int64_t>> VeDeviceMesh::stage_peer(
    int64_t shift, bool wrap, MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  const State& st = *s;
  if (!st.coordinate) return NotMember(st.mesh);
  return st.peers[shift > 0][wrap];
}

absl::StatusOr<std::optional<StageNeighbor>> VeDeviceMesh::stage_neighbor(
    int64_t shift, bool wrap, MeshName mesh) const {
  const Snapshot snap(*this, mesh);
  VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  const State& st = *s;
  if (!st.coordinate) return NotMember(st.mesh);
  VEMESH_ASSIGN_OR_RETURN(auto peer,
                          StagePeer(st.mesh, st.pp_dim, shift, wrap));
  if (!peer.has_value()) return std::optional<StageNeighbor>();
  int64_t stage = 0;
  if (st.pp_dim >= 0) {
    VEMESH_ASSIGN_OR_RETURN(auto coordinate, st.layout().coordinate_of(*peer));
    stage = coordinate[st.pp_dim];
  }
  VEMESH_ASSIGN_OR_RETURN(auto stage_mesh,
                          StageMesh(st.mesh, st.pp_dim, *peer));
  return std::optional<StageNeighbor>(
      StageNeighbor{stage, *peer, std::move(stage_mesh)});
}

absl::StatusOr<std::optional<StageNeighbor>> VeDeviceMesh::get_prev_stage(
    bool wrap, MeshName mesh) const {
  return stage_neighbor(-1, wrap, mesh);
}
absl::StatusOr<std::optional<StageNeighbor>> VeDeviceMesh::get_next_stage(
    bool wrap, MeshName mesh) const {
  return stage_neighbor(+1, wrap, mesh);
}
absl::StatusOr<std::optional<int64_t>> VeDeviceMesh::get_prev_stage_peer(
    bool wrap, MeshName mesh) const {
  return stage_peer(-1, wrap, mesh);
}
absl::StatusOr<std::optional<int64_t>> VeDeviceMesh::get_next_stage_peer(
    bool wrap, MeshName mesh) const {
  return stage_peer(+1, wrap, mesh);
}

}  // namespace vemesh
