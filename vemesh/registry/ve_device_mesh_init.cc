// VeDeviceMesh's publication: init, reset and each elastic epoch build a
// State and publish it; the queries (ve_device_mesh.cc) read it.

#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/base/status_macros.h"
#ifndef VEMESH_NO_MPI
#include "vemesh/comm/mpi/mpi_environment.h"
#endif
#include "vemesh/registry/internal/registry_state.h"
#include "vemesh/registry/ve_device_mesh.h"

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

using registry_internal::DataParallelParts;
using registry_internal::RoleDim;
using registry_internal::StagePeer;

VeDeviceMesh& VeDeviceMesh::Instance() {
  static VeDeviceMesh* const instance = new VeDeviceMesh();
  return *instance;
}

VeDeviceMesh::VeDeviceMesh() = default;

VeDeviceMesh::~VeDeviceMesh() { reset_all(); }

void VeDeviceMesh::replace(std::unique_ptr<const State> next) {
  replace(owner_, published_, std::move(next));
}

void VeDeviceMesh::replace(std::unique_ptr<const State>& owner,
                           std::atomic<const void*>& published,
                           std::unique_ptr<const State> next) {
  std::unique_ptr<const State> old = std::move(owner);
  owner = std::move(next);
  published.store(owner.get());
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
  if (!options.mesh_name.empty()) {
    return init_named(device_type, std::move(mesh_shape),
                      std::move(mesh_dim_names), std::move(options));
  }
  if (options.elastic.has_value() && !mesh_names().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "an elastic default mesh beside the named meshes [",
        absl::StrJoin(mesh_names(), ", "),
        "]: the elastic replica dimension changes membership each epoch, and "
        "the other meshes would keep groups of replicas that are gone; reset "
        "them (reset(MeshName(name)) or reset_all()) first"));
  }
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

void VeDeviceMesh::reset(MeshName mesh) {
  if (mesh.is_default()) return reset();
  std::lock_guard<std::mutex> init_lock(init_mu_);
  Slot* slot = nullptr;
  {
    std::lock_guard<std::mutex> lock(named_mu_);
    auto it = named_.find(mesh.name);
    if (it == named_.end()) return;
    slot = it->second.get();
  }
  replace(slot->owner, slot->published, nullptr);
}

void VeDeviceMesh::reset_all() {
  for (const std::string& name : mesh_names()) reset(MeshName(name));
  reset();
}

bool VeDeviceMesh::is_initialized() const {
  return published_.load() != nullptr;
}

bool VeDeviceMesh::is_initialized(MeshName mesh) const {
  const std::atomic<const void*>* published = published_for(mesh);
  return published != nullptr && published->load() != nullptr;
}

absl::StatusOr<DeviceMesh> VeDeviceMesh::init_named(
    absl::string_view device_type, std::vector<int64_t> mesh_shape,
    std::vector<std::string> mesh_dim_names, InitOptions options) {
  const std::string name = options.mesh_name;
  if (name == "default") {
    return absl::InvalidArgumentError(
        "InitOptions.mesh_name 'default' is reserved for the default mesh: "
        "leave mesh_name empty for it, or pick another name");
  }
  // An elastic job keeps one mesh (the header says why).
  if (options.elastic.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mesh '", name,
        "' cannot be elastic: only the default mesh may be, "
        "and alone; its replica dimension changes membership each epoch, "
        "and the registry keeps no second mesh spanning it consistent"));
  }
  if (elastic_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "mesh '", name,
        "' beside an elastic default mesh: its replica "
        "dimension changes membership each epoch, and a second mesh over the "
        "same "
        "ranks would keep groups of replicas that are gone; build the other "
        "factorisation with DeviceMesh::view on each epoch's mesh instead"));
  }
  if (options.check_uniqueness && is_initialized(MeshName(name))) {
    return absl::AlreadyExistsError(
        absl::StrCat("mesh '", name,
                     "' is already initialised and check_uniqueness is "
                     "set: call reset(MeshName(\"",
                     name, "\")) first"));
  }
  VEMESH_ASSIGN_OR_RETURN(auto parsed, ParseDeviceType(device_type));
  if (parsed.type != DeviceType::kMeta) {
    VEMESH_RETURN_IF_ERROR(MayCallMpi(absl::StrCat(
        "VESCALE_DEVICE_MESH.init_device_mesh(\"", device_type, "\")")));
  }
  // The names a view needs (defaults when none are given).
  VEMESH_ASSIGN_OR_RETURN(auto layout,
                          MeshLayout::Create(mesh_shape, mesh_dim_names));
  // A mesh over the same ranks to view: the default one, else the first
  // named one (name order), of the same device type and size. Every rank
  // holds the same meshes, so every rank picks the same one.
  std::optional<DeviceMesh> base;
  const MeshOptions& mo = options.mesh;
  const bool own_world = !mo.ranks.empty() || !mo.backend.empty() ||
                         !mo.backend_override.empty() || mo.world != nullptr ||
                         mo.bootstrap != nullptr;
  if (!own_world) {
    std::vector<const std::atomic<const void*>*> candidates = {&published_};
    {
      std::lock_guard<std::mutex> lock(named_mu_);
      for (const auto& [other, slot] : named_) {
        if (other != name) candidates.push_back(&slot->published);
      }
    }
    for (const auto* published : candidates) {
      const auto* st = static_cast<const State*>(published->load());
      if (st == nullptr) continue;
      const DeviceMesh root = st->mesh.root_mesh();
      if (root.device_type() == parsed.type && root.size() == layout.size()) {
        base = root;
        break;
      }
    }
  }
  DeviceMesh mesh = DeviceMesh::Meta(layout, 0);
  if (base.has_value()) {
    VEMESH_ASSIGN_OR_RETURN(
        mesh, base->view(layout.shape(), layout.dim_names(),
                         DeviceMesh::ViewOptions{.bind_names = false}));
  } else {
    VEMESH_ASSIGN_OR_RETURN(
        mesh, vemesh::init_device_mesh(device_type, mesh_shape, mesh_dim_names,
                                       options.mesh));
  }
  VEMESH_ASSIGN_OR_RETURN(auto state, MakeState(mesh, /*collective=*/true));
  Slot* slot = nullptr;
  {
    std::lock_guard<std::mutex> lock(named_mu_);
    std::unique_ptr<Slot>& at = named_[name];
    if (at == nullptr) at = std::make_unique<Slot>();
    slot = at.get();
  }
  replace(slot->owner, slot->published, std::move(state));
  return mesh;
}

}  // namespace vemesh
