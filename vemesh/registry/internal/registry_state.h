// vemesh/registry/internal/registry_state.h
//
// The registry's state and its reading, shared by the two halves of
// VeDeviceMesh: its publication (ve_device_mesh_init.cc: init, reset, each
// elastic epoch) and its queries (ve_device_mesh.cc). Private: not installed.

#ifndef VEMESH_REGISTRY_INTERNAL_REGISTRY_STATE_H_
#define VEMESH_REGISTRY_INTERNAL_REGISTRY_STATE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "vemesh/registry/internal/snapshot_guard.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace vemesh {
namespace registry_internal {

// FailedPrecondition: no init yet, or reset since.
absl::Status NotInitialized();

// The dimension that plays `role`, or -1 when the mesh lacks it
// (ve_device_mesh.cc).
absl::StatusOr<int64_t> RoleDim(const MeshLayout& layout,
                                absl::string_view role);
// The dimensions of DP_REPLICATE and DP_SHARD present, in that order.
absl::StatusOr<std::vector<int64_t>> DataParallelParts(
    const MeshLayout& layout);
// The global rank `shift` stages away from this rank, or nullopt.
absl::StatusOr<std::optional<int64_t>> StagePeer(const DeviceMesh& mesh,
                                                 int64_t pp_dim, int64_t shift,
                                                 bool wrap);

}  // namespace registry_internal

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
      : registry_(registry), guard_(registry.published_) {}
  // A reading of `mesh`: the default mesh's (as above) or a named one's.
  Snapshot(const VeDeviceMesh& registry, MeshName mesh)
      : registry_(registry),
        mesh_(mesh),
        guard_(mesh.is_default() ? registry.published_
                                 : Target(registry, mesh)) {}
  // Null before init and after reset.
  const State* get() const { return static_cast<const State*>(guard_.get()); }
  // get(), or NotInitialized (the default mesh) / NotFound naming the
  // meshes (a named one) when null: a query's prologue,
  //   const Snapshot snap(*this, mesh);
  //   VEMESH_ASSIGN_OR_RETURN(const State* s, snap.state());
  // Inlined, so the hot queries pay one null test.
  absl::StatusOr<const State*> state() const {
    const State* s = get();
    if (s == nullptr) [[unlikely]] {
      if (mesh_.is_default()) return registry_internal::NotInitialized();
      return registry_.MissingMesh(mesh_);
    }
    return s;
  }
  MeshName mesh() const { return mesh_; }

 private:
  static const std::atomic<const void*>& Target(const VeDeviceMesh& registry,
                                                MeshName mesh) {
    // A name never initialised reads as nothing published.
    static const std::atomic<const void*> nothing{nullptr};
    const std::atomic<const void*>* p = registry.published_for(mesh);
    return p != nullptr ? *p : nothing;
  }
  const VeDeviceMesh& registry_;
  MeshName mesh_;
  SnapshotGuard guard_;
};

}  // namespace vemesh

#endif  // VEMESH_REGISTRY_INTERNAL_REGISTRY_STATE_H_
