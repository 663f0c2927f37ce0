// vemesh/mesh/internal/mesh_shared.h
//
// What every DeviceMesh handle points at: the state shared by a created mesh
// and all its children (DeviceMesh::Shared), and one handle's view of it
// (DeviceMesh::View). device_mesh.cc answers queries from them,
// mesh_creation.cc makes them, mesh_reshape.cc derives new roots (flatten,
// unflatten, view).
//
//   auto shared = std::make_shared<DeviceMesh::Shared>(type, layout, rank);
//   const std::vector<std::string> names = {"DP_TP"};  // a flatten name
//   VEMESH_ASSIGN_OR_RETURN(MeshLayout with_flat,
//                           shared->Resolve(layout, names));
//   VEMESH_ASSIGN_OR_RETURN(SplitRequest request,
//                           DimSplitRequest(layout, "TP", rank, member));
//
// Internal to the mesh folder.

#ifndef VEMESH_MESH_INTERNAL_MESH_SHARED_H_
#define VEMESH_MESH_INTERNAL_MESH_SHARED_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "vemesh/bootstrap/bootstrap.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/layout/device_type.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/mesh/device_mesh.h"
#include "vemesh/mesh/internal/mesh_backends.h"

namespace vemesh {

// The dimensions of every view of one root (DeviceMesh::view), by name:
// the groups each enumerates and this rank's communicator, so that a view
// sharing a name shares the communicator, and a view whose groups differ
// for a known name is refused.
//
// The group cache: the same communicators keyed by the rank sets alone
// (the sorted list of groups a dimension or flattening enumerates), whatever
// they are named. A view's dimension, or a flattening of any view, whose
// groups are already here reuses the communicator instead of splitting: an
// attention mesh's DP and an expert mesh's EDP over the same ranks are one
// communicator (PyTorch's shared state across meshes of one universe,
// Megatron's HyperCommGrid). Every rank makes the same collective calls in
// the same order, so every rank's cache holds the same keys and takes the
// same decision without communicating.
struct ViewFamily {
  using Groups = std::vector<std::vector<int64_t>>;  // sorted
  struct Dim {
    Groups groups;
    std::shared_ptr<Communicator> mine;  // null outside the mesh
  };
  std::mutex mu;
  absl::flat_hash_map<std::string, Dim> dims;
  absl::flat_hash_map<Groups, std::shared_ptr<Communicator>> by_groups;
};

// What a mesh and all its children share: the layout the mesh was created
// with (the "root"), this process's place in the world, and the
// communicators. Dimension communicators are indexed by root dimension;
// flattened ones are keyed by the root dimensions they span, in order.
struct DeviceMesh::Shared {
  Shared(DeviceType type, MeshLayout layout, int64_t rank)
      : device_type(type), root(std::move(layout)), global_rank(rank) {}
  // A new root over the same ranks (unflatten, view): this rank's place,
  // the bootstrap, the backends and their worlds carried over; no groups.
  std::shared_ptr<Shared> Sibling(MeshLayout layout) const {
    auto next =
        std::make_shared<Shared>(device_type, std::move(layout), global_rank);
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
  // The world on the mesh's default backend (flatten splits it); null while
  // a torchrun cuda mesh's NCCL world waits for its first use.
  std::shared_ptr<Communicator> device_world;
  // device_world, made now if it waited (collective: the same call on every
  // rank, under flatten_mu or in an unflatten).
  absl::StatusOr<std::shared_ptr<Communicator>> DeviceWorld() const {
    if (device_world != nullptr) return device_world;
    if (backends == nullptr) {
      return absl::FailedPreconditionError("this mesh has no device world");
    }
    return backends->default_world();
  }
  // One per root dimension; null on ranks outside the mesh.
  std::vector<std::shared_ptr<Communicator>> dims;
  // Set by DeviceMesh::abort(): flatten refuses, shrink rebuilds every
  // dimension.
  std::atomic<bool> aborted{false};

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

  // The family of this root's views, made on first use from the root's
  // dimensions and flattenings (by name and by rank set). Takes `mu`.
  absl::StatusOr<std::shared_ptr<ViewFamily>> Family();
  // The group cache (ViewFamily::by_groups): the communicator of the
  // groups `names` enumerate on `layout` when any view of the family made
  // them (`*found`; null outside them), else null and !*found. No family
  // (no view made yet): never found. CacheGroup records one. Take `mu`.
  std::shared_ptr<Communicator> CachedGroup(const MeshLayout& layout,
                                            absl::Span<const std::string> names,
                                            bool* found);
  void CacheGroup(const MeshLayout& layout, absl::Span<const std::string> names,
                  std::shared_ptr<Communicator> comm);

  // `layout` with every name of `names` that it lacks but that names a
  // flattening of dimensions it holds (recursively) flattened in, so that
  // each of `names` is a dimension of the result. A name that is neither
  // stays missing (the caller's layout call reports it). Takes `mu`.
  absl::StatusOr<MeshLayout> Resolve(MeshLayout layout,
                                     absl::Span<const std::string> names,
                                     int depth = 0);
};

struct DeviceMesh::View {
  std::shared_ptr<Shared> shared;
  MeshLayout layout;
  bool has_self;
};

// This rank's request to split out the groups along dimension `name` of
// `layout`: its group and place in it, or no group (color -1) when the rank
// is not in the layout (it still takes part in the collective split). For
// a dimension of `layout` the request also carries the group's members and
// is group_local (communicator.h: MPI makes the group over its members, and
// a rank outside the layout makes no call).
absl::StatusOr<SplitRequest> DimSplitRequest(const MeshLayout& layout,
                                             const std::string& name,
                                             int64_t rank, bool member);

// FailedPrecondition: `rank` is not a member of `layout`, so it has no `what`.
absl::Status NotMember(const MeshLayout& layout, int64_t rank,
                       absl::string_view what);

}  // namespace vemesh

#endif  // VEMESH_MESH_INTERNAL_MESH_SHARED_H_
