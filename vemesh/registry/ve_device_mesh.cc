#include "vemesh/registry/ve_device_mesh.h"

#include <mutex>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/base/status_macros.h"
#ifndef VEMESH_NO_MPI
#include "vemesh/comm/mpi/mpi_environment.h"
#endif
#include "vemesh/registry/internal/snapshot_guard.h"

namespace vemesh {
namespace {

// CheckMpiThread (mpi_environment.h); in a build without MPI there is no
// MPI to call, and every thread may.
absl::Status MayCallMpi(absl::string_view what) {
#ifndef VEMESH_NO_MPI
  return CheckMpiThread(what);
#else
  (void)what;
  return absl::OkStatus();
#endif
}

// MayCallMpi's answer without a message (the success path builds none).
bool MpiThreadOk() {
#ifndef VEMESH_NO_MPI
  return MpiThreadAllowed();
#else
  return true;
#endif
}

}  // namespace

// Everything a query needs, built once per init and never changed: readers
// share it without locks. The registry alone owns it (and through `mesh`,
// the communicators).
struct VeDeviceMesh::State {
  DeviceMesh mesh;
  // This rank's coordinate; empty when it is outside a mesh smaller than
  // the world.
  std::optional<Coordinate> coordinate;
  // The 1-D sub-mesh along each dimension that holds this rank (members).
  std::vector<DeviceMesh> dim_meshes;
  // Index of the PP dimension, or -1 (a one-stage pipeline).
  int64_t pp_dim = -1;
  std::vector<int64_t> shape;
  // This rank's previous / next stage peer, [next][wrap]: the hot lookups of
  // a pipeline schedule, answered without arithmetic.
  std::optional<int64_t> peers[2][2];
  // A copy of the mesh's layout, read without a call into DeviceMesh.
  MeshLayout layout_copy = mesh.layout();
  // A mesh without DP but with DP_REPLICATE and DP_SHARD: their dimensions
  // (in that order), whose flattening plays DP; else empty.
  std::vector<int64_t> dp_parts = {};
  // That flattening, the 1-D mesh holding this rank (members of a cpu or
  // cuda mesh made by init_device_mesh).
  std::optional<DeviceMesh> dp_flat = std::nullopt;

  const MeshLayout& layout() const { return layout_copy; }
};

// One reading of the registry: the state as published when it was made,
// kept alive (not owned) until it dies. Every query makes exactly one, so
// that all it answers comes from one mesh.
class VeDeviceMesh::Snapshot {
 public:
  explicit Snapshot(const VeDeviceMesh& registry)
      : guard_(registry.published_) {}
  // Null before init and after reset.
  const State* get() const { return static_cast<const State*>(guard_.get()); }

 private:
  SnapshotGuard guard_;
};

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

absl::Status NotInitialized() {
  return absl::FailedPreconditionError(
      "the device mesh is not initialised: call "
      "VESCALE_DEVICE_MESH.init_device_mesh(device_type, mesh_shape, "
      "mesh_dim_names) first");
}

absl::Status NotMember(const DeviceMesh& mesh) {
  return absl::NotFoundError(
      absl::StrCat("global rank ", mesh.global_rank(), " is not a member of ",
                   mesh.ToString(), ": the mesh is smaller than the world"));
}

bool IsKnownRole(absl::string_view name) {
  return absl::EqualsIgnoreCase(name, "PP") ||
         absl::EqualsIgnoreCase(name, "DP") ||
         absl::EqualsIgnoreCase(name, "TP") ||
         absl::EqualsIgnoreCase(name, "DP_REPLICATE") ||
         absl::EqualsIgnoreCase(name, "DP_SHARD");
}

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

absl::StatusOr<DeviceMesh> StageMesh(const DeviceMesh& mesh, int64_t pp_dim,
                                     int64_t rank);
absl::StatusOr<std::optional<int64_t>> StagePeer(const DeviceMesh& mesh,
                                                 int64_t pp_dim, int64_t shift,
                                                 bool wrap);

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

VeDeviceMesh& VeDeviceMesh::Instance() {
  static VeDeviceMesh* const instance = new VeDeviceMesh();
  return *instance;
}

VeDeviceMesh::VeDeviceMesh() = default;

VeDeviceMesh::~VeDeviceMesh() { reset(); }

void VeDeviceMesh::replace(std::unique_ptr<const State> next) {
  std::unique_ptr<const State> old = std::move(owner_);
  owner_ = std::move(next);
  published_.store(owner_.get());
  // No query can start on `old` now; let those in flight finish with it.
  WaitForReaders(old.get());
  // Freeing a mesh frees its communicators, which calls MPI: only on a
  // thread that may (mpi_environment.h). Otherwise keep it for later.
  if (!MayCallMpi("freeing the replaced mesh").ok()) {
    if (old != nullptr && old->mesh.device_type() != DeviceType::kMeta) {
      retired_.push_back(std::move(old));
    }
    return;
  }
  retired_.clear();
  old.reset();
}

absl::StatusOr<DeviceMesh> VeDeviceMesh::init_device_mesh(
    absl::string_view device_type, std::vector<int64_t> mesh_shape,
    std::vector<std::string> mesh_dim_names, InitOptions options) {
  std::lock_guard<std::mutex> init_lock(init_mu_);
  if (options.check_uniqueness && is_initialized()) {
    return absl::AlreadyExistsError(
        "the device mesh is already initialised and check_uniqueness is set: "
        "call reset() first, or init without check_uniqueness to replace it");
  }
  // A cpu or cuda mesh is built with MPI under an MPI launcher: refuse a
  // thread that MPI's thread level forbids, before any rank communicates.
  // (A bad device type is left to init_device_mesh to name.)
  if (auto parsed = ParseDeviceType(device_type);
      parsed.ok() && parsed->type != DeviceType::kMeta && !MpiThreadOk()) {
    VEMESH_RETURN_IF_ERROR(MayCallMpi(absl::StrCat(
        "VESCALE_DEVICE_MESH.init_device_mesh(\"", device_type, "\")")));
  }
  MeshOptions mesh_options = std::move(options.mesh);
  if (options.elastic.has_value()) {
    if (!mesh_options.ranks.empty()) {
      return absl::InvalidArgumentError(
          "an elastic mesh numbers its ranks itself: InitOptions.mesh.ranks "
          "must be empty");
    }
    VEMESH_ASSIGN_OR_RETURN(auto parsed, ParseDeviceType(device_type));
    mesh_options.cuda_device = parsed.index;  // "cuda:N"
    VEMESH_ASSIGN_OR_RETURN(auto layout,
                            MeshLayout::Create(mesh_shape, mesh_dim_names));
    VEMESH_ASSIGN_OR_RETURN(
        auto elastic, ElasticMesh::Create(parsed.type, layout, mesh_options,
                                          *options.elastic));
    VEMESH_ASSIGN_OR_RETURN(auto state, MakeState(elastic->mesh()));
    const DeviceMesh mesh = elastic->mesh();
    replace(std::move(state));
    elastic_view_.store(nullptr);
    elastic_ = std::move(elastic);
    elastic_->set_publisher(
        [this](const DeviceMesh& next) { return publish_epoch(next); });
    elastic_view_.store(elastic_.get());
    return mesh;
  }
  VEMESH_ASSIGN_OR_RETURN(
      auto mesh, vemesh::init_device_mesh(device_type, mesh_shape,
                                          mesh_dim_names, mesh_options));
  VEMESH_ASSIGN_OR_RETURN(auto state, MakeState(mesh, /*collective=*/true));
  replace(std::move(state));
  elastic_view_.store(nullptr);
  elastic_.reset();
  return mesh;
}

absl::StatusOr<std::unique_ptr<const VeDeviceMesh::State>>
VeDeviceMesh::MakeState(const DeviceMesh& mesh, bool collective) {
  auto state = std::make_unique<State>(
      State{mesh, std::nullopt, {}, -1, mesh.shape(), {}});
  VEMESH_ASSIGN_OR_RETURN(state->pp_dim, RoleDim(state->layout(), "PP"));
  if (RoleDim(state->layout(), "DP").value_or(0) < 0) {
    VEMESH_ASSIGN_OR_RETURN(auto parts, DataParallelParts(state->layout()));
    if (parts.size() == 2) {
      state->dp_parts = parts;
      // Collective (every rank of the world, as init_device_mesh is): the
      // DP communicator, made once here so that queries never communicate.
      if (collective && mesh.device_type() != DeviceType::kMeta) {
        const std::vector<std::string> dims = {
            state->layout().dim_name(parts[0]),
            state->layout().dim_name(parts[1])};
        absl::StatusOr<DeviceMesh> flat = mesh.flatten_mesh(dims);
        if (flat.ok()) {
          state->dp_flat = *std::move(flat);
        } else if (mesh.has_self()) {
          return flat.status();
        }
      }
    }
  }
  if (mesh.has_self()) {
    auto coordinate = mesh.get_coordinate();
    if (!coordinate.ok()) return coordinate.status();
    state->coordinate = *coordinate;
    const MeshLayout& layout = state->layout();
    state->dim_meshes.reserve(static_cast<size_t>(layout.ndim()));
    for (int64_t d = 0; d < layout.ndim(); ++d) {
      // mesh[name] without copying the names (issue 32).
      VEMESH_ASSIGN_OR_RETURN(
          auto child, mesh.slice(absl::MakeConstSpan(&layout.dim_name(d), 1)));
      state->dim_meshes.push_back(std::move(child));
    }
    for (int next = 0; next < 2; ++next) {
      for (int wrap = 0; wrap < 2; ++wrap) {
        VEMESH_ASSIGN_OR_RETURN(
            auto peer, StagePeer(mesh, state->pp_dim, next ? 1 : -1, wrap));
        state->peers[next][wrap] = peer;
      }
    }
  }
  return std::unique_ptr<const State>(std::move(state));
}

absl::Status VeDeviceMesh::publish_epoch(const DeviceMesh& mesh) {
  auto state = MakeState(mesh);
  if (!state.ok()) return state.status();
  std::lock_guard<std::mutex> init_lock(init_mu_);
  replace(*std::move(state));
  return absl::OkStatus();
}

ElasticMesh* VeDeviceMesh::elastic() const { return elastic_view_.load(); }

void VeDeviceMesh::reset() {
  std::lock_guard<std::mutex> init_lock(init_mu_);
  replace(nullptr);
  elastic_view_.store(nullptr);
  elastic_.reset();
}

bool VeDeviceMesh::is_initialized() const {
  return published_.load() != nullptr;
}

bool VeDeviceMesh::is_current(const DeviceMesh& mesh) const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  return s != nullptr && s->mesh.same_root(mesh);
}

absl::Status VeDeviceMesh::check_current(const DeviceMesh& mesh) const {
  // One snapshot for both questions: current? initialised at all?
  const Snapshot snap(*this);
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

absl::StatusOr<DeviceMesh> VeDeviceMesh::get() const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  return s->mesh;
}

absl::StatusOr<DeviceMesh> VeDeviceMesh::operator[](
    absl::string_view dim) const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  const State& st = *s;
  auto d = st.layout().find_dim(dim);
  if (!d) {
    VEMESH_ASSIGN_OR_RETURN(auto flat, FlatSize(st.mesh, dim));
    if (!flat) return st.layout().dim_index(dim).status();
    if (!st.coordinate) return NotMember(st.mesh);
    return st.mesh[dim];
  }
  if (!st.coordinate) return NotMember(st.mesh);
  return st.dim_meshes[*d];
}

absl::StatusOr<DeviceMesh> VeDeviceMesh::operator[](int64_t dim) const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
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
    absl::Span<const std::string> dims) const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  return s->mesh.slice(dims);
}

// -- Shape and coordinates ---------------------------------------------------

absl::StatusOr<int64_t> VeDeviceMesh::get_strategy_size(
    absl::string_view dim) const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  if (auto d = s->layout().find_dim(dim)) return s->shape[*d];
  VEMESH_ASSIGN_OR_RETURN(auto flat, FlatSize(s->mesh, dim));
  if (flat) return *flat;
  return s->layout().dim_index(dim).status();
}

absl::StatusOr<int64_t> VeDeviceMesh::get_strategy_size(int64_t dim) const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  return s->layout().dim_size(dim);
}

absl::StatusOr<Coordinate> VeDeviceMesh::get_strategy_coordinate() const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  if (!s->coordinate) return NotMember(s->mesh);
  return *s->coordinate;
}

absl::StatusOr<Coordinate> VeDeviceMesh::get_strategy_coordinate(
    int64_t global_rank) const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  return s->layout().coordinate_of(global_rank);
}

absl::Status VeDeviceMesh::get_strategy_coordinate(
    int64_t global_rank, absl::Span<int64_t> out) const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) [[unlikely]]
    return NotInitialized();
  return s->layout().coordinate_of(global_rank, out);
}

absl::StatusOr<int64_t> VeDeviceMesh::lookup_rank(absl::string_view dim) const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  auto d = s->layout().find_dim(dim);
  if (!d) {
    VEMESH_ASSIGN_OR_RETURN(auto flat, FlatSize(s->mesh, dim));
    if (!flat) return s->layout().dim_index(dim).status();
    if (!s->coordinate) return NotMember(s->mesh);
    return s->mesh.get_local_rank(dim);
  }
  if (!s->coordinate) return NotMember(s->mesh);
  return (*s->coordinate)[*d];
}

absl::StatusOr<int64_t> VeDeviceMesh::lookup_rank(int64_t dim) const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  VEMESH_RETURN_IF_ERROR(s->layout().dim_size(dim));
  if (!s->coordinate) return NotMember(s->mesh);
  return (*s->coordinate)[dim];
}

absl::StatusOr<int64_t> VeDeviceMesh::get_global_rank(
    absl::Span<const int64_t> coordinate) const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  return s->layout().rank_at(coordinate);
}

absl::StatusOr<int64_t> VeDeviceMesh::get_rank() const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  return s->mesh.global_rank();
}

absl::StatusOr<int64_t> VeDeviceMesh::get_local_rank() const {
  return host_local_rank();
}

absl::StatusOr<int64_t> VeDeviceMesh::host_local_rank() const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  return s->mesh.host_local_rank();
}

absl::StatusOr<Placement> VeDeviceMesh::get_placement() const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  return s->mesh.get_placement();
}

absl::StatusOr<Coordinate> VeDeviceMesh::get_coordinate() const {
  return get_strategy_coordinate();
}

absl::StatusOr<int64_t> VeDeviceMesh::size() const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  return s->layout().size();
}

absl::StatusOr<int64_t> VeDeviceMesh::size(absl::string_view dim) const {
  return get_strategy_size(dim);
}

absl::StatusOr<int64_t> VeDeviceMesh::size(int64_t dim) const {
  return get_strategy_size(dim);
}

absl::StatusOr<int64_t> VeDeviceMesh::ndim() const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  return s->layout().ndim();
}

absl::StatusOr<std::vector<int64_t>> VeDeviceMesh::shape() const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  return s->layout().shape();
}

absl::StatusOr<std::vector<std::string>> VeDeviceMesh::mesh_dim_names() const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  return s->layout().dim_names();
}

absl::StatusOr<DeviceType> VeDeviceMesh::device_type() const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
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

absl::StatusOr<int64_t> VeDeviceMesh::get_role_size(
    absl::string_view role) const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  if (IsFlatDp(*s, role)) {
    return s->shape[s->dp_parts[0]] * s->shape[s->dp_parts[1]];
  }
  VEMESH_ASSIGN_OR_RETURN(const int64_t d, RoleDim(s->layout(), role));
  if (d >= 0) return s->layout().dim_size(d);
  VEMESH_ASSIGN_OR_RETURN(auto flat, FlatSize(s->mesh, role));
  return flat.value_or(1);
}

absl::StatusOr<int64_t> VeDeviceMesh::get_role_rank(
    absl::string_view role) const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  if (!s->coordinate) return NotMember(s->mesh);
  if (IsFlatDp(*s, role)) {
    return (*s->coordinate)[s->dp_parts[0]] * s->shape[s->dp_parts[1]] +
           (*s->coordinate)[s->dp_parts[1]];
  }
  VEMESH_ASSIGN_OR_RETURN(const int64_t d, RoleDim(s->layout(), role));
  if (d >= 0) return (*s->coordinate)[d];
  VEMESH_ASSIGN_OR_RETURN(auto flat, FlatSize(s->mesh, role));
  if (!flat) return 0;
  return s->mesh.get_local_rank(role);
}

absl::StatusOr<DeviceMesh> VeDeviceMesh::get_role_mesh(
    absl::string_view role) const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  if (IsFlatDp(*s, role)) {
    if (!s->coordinate) return NotMember(s->mesh);
    VEMESH_RETURN_IF_ERROR(NoFlatDp(*s));
    return *s->dp_flat;
  }
  VEMESH_ASSIGN_OR_RETURN(const int64_t d, RoleDim(s->layout(), role));
  if (d < 0) {
    VEMESH_ASSIGN_OR_RETURN(auto flat, FlatSize(s->mesh, role));
    if (!flat) return MissingRole(s->layout(), role);
    if (!s->coordinate) return NotMember(s->mesh);
    return s->mesh[role];
  }
  if (!s->coordinate) return NotMember(s->mesh);
  return s->dim_meshes[d];
}

absl::StatusOr<std::shared_ptr<Communicator>> VeDeviceMesh::get_role_dim_groups(
    absl::string_view role) const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  if (IsFlatDp(*s, role)) {
    if (!s->coordinate) return NotMember(s->mesh);
    VEMESH_RETURN_IF_ERROR(NoFlatDp(*s));
    return s->dp_flat->get_group();
  }
  VEMESH_ASSIGN_OR_RETURN(const int64_t d, RoleDim(s->layout(), role));
  if (d < 0) {
    VEMESH_ASSIGN_OR_RETURN(auto flat, FlatSize(s->mesh, role));
    if (!flat) return MissingRole(s->layout(), role);
    return s->mesh.get_group(role);
  }
  return s->mesh.get_group(d);
}

absl::StatusOr<std::vector<DeviceMesh>> VeDeviceMesh::get_global_role_meshes(
    absl::string_view role) const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
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
    if (!flat) return MissingRole(layout, role);
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
    VEMESH_ASSIGN_OR_RETURN(auto mesh, s->mesh.submesh_at(dims, rank));
    out.push_back(std::move(mesh));
  }
  return out;
}

absl::StatusOr<int64_t> VeDeviceMesh::get_pipeline_parallel_rank() const {
  return get_role_rank("PP");
}
absl::StatusOr<int64_t> VeDeviceMesh::get_data_parallel_rank() const {
  return get_role_rank("DP");
}
absl::StatusOr<int64_t> VeDeviceMesh::get_tensor_parallel_rank() const {
  return get_role_rank("TP");
}
absl::StatusOr<DeviceMesh> VeDeviceMesh::get_pipeline_parallel_mesh() const {
  return get_role_mesh("PP");
}
absl::StatusOr<DeviceMesh> VeDeviceMesh::get_data_parallel_mesh() const {
  return get_role_mesh("DP");
}
absl::StatusOr<DeviceMesh> VeDeviceMesh::get_tensor_parallel_mesh() const {
  return get_role_mesh("TP");
}
absl::StatusOr<std::shared_ptr<Communicator>>
VeDeviceMesh::get_pipeline_parallel_dim_groups() const {
  return get_role_dim_groups("PP");
}
absl::StatusOr<std::shared_ptr<Communicator>>
VeDeviceMesh::get_data_parallel_dim_groups() const {
  return get_role_dim_groups("DP");
}
absl::StatusOr<std::shared_ptr<Communicator>>
VeDeviceMesh::get_tensor_parallel_dim_groups() const {
  return get_role_dim_groups("TP");
}
absl::StatusOr<std::vector<DeviceMesh>>
VeDeviceMesh::get_global_tensor_parallel_meshes() const {
  return get_global_role_meshes("TP");
}

absl::StatusOr<std::vector<DeviceMesh>>
VeDeviceMesh::get_global_pipeline_parallel_meshes() const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
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
    VEMESH_ASSIGN_OR_RETURN(auto mesh, StageMesh(st.mesh, st.pp_dim, rank));
    out.push_back(std::move(mesh));
  }
  return out;
}

// Rank and size from one snapshot: two queries could straddle a re-init
// and compare the old mesh's stage with the new one's stage count.
absl::StatusOr<bool> VeDeviceMesh::is_first_stage() const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  if (!s->coordinate) return NotMember(s->mesh);
  return s->pp_dim < 0 || (*s->coordinate)[s->pp_dim] == 0;
}

absl::StatusOr<bool> VeDeviceMesh::is_last_stage() const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  if (!s->coordinate) return NotMember(s->mesh);
  return s->pp_dim < 0 ||
         (*s->coordinate)[s->pp_dim] == s->shape[s->pp_dim] - 1;
}

// -- Pipeline neighbours
// -------------------------------------------------------

namespace {

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
    int64_t shift, bool wrap) const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
  const State& st = *s;
  if (!st.coordinate) return NotMember(st.mesh);
  return st.peers[shift > 0][wrap];
}

absl::StatusOr<std::optional<StageNeighbor>> VeDeviceMesh::stage_neighbor(
    int64_t shift, bool wrap) const {
  const Snapshot snap(*this);
  const State* s = snap.get();
  if (s == nullptr) return NotInitialized();
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
  VEMESH_ASSIGN_OR_RETURN(auto mesh, StageMesh(st.mesh, st.pp_dim, *peer));
  return std::optional<StageNeighbor>(
      StageNeighbor{stage, *peer, std::move(mesh)});
}

absl::StatusOr<std::optional<StageNeighbor>> VeDeviceMesh::get_prev_stage(
    bool wrap) const {
  return stage_neighbor(-1, wrap);
}
absl::StatusOr<std::optional<StageNeighbor>> VeDeviceMesh::get_next_stage(
    bool wrap) const {
  return stage_neighbor(+1, wrap);
}
absl::StatusOr<std::optional<int64_t>> VeDeviceMesh::get_prev_stage_peer(
    bool wrap) const {
  return stage_peer(-1, wrap);
}
absl::StatusOr<std::optional<int64_t>> VeDeviceMesh::get_next_stage_peer(
    bool wrap) const {
  return stage_peer(+1, wrap);
}

}  // namespace vemesh
