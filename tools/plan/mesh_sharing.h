// tools/plan/mesh_sharing.h
//
// Every mesh of a job and the groups they share (issue 45): the --mesh (the
// registry's default mesh, with its --flatten names) and each --also-mesh
// NAME:SPEC over the same ranks (an expert mesh, a rollout mesh). A
// dimension whose groups span the same rank sets as a dimension or
// flattening of an earlier mesh shares its communicator in the registry
// (the group cache, docs/ARCHITECTURE.md); the plan names which, and how
// many communicators the job makes per rank set instead of per dimension.
//
//   MeshLayout attention = *MeshLayout::Create({2, 2, 2}, {"PP", "DP", "TP"});
//   std::vector<NamedLayout> meshes = {
//       {"default", attention, {}},
//       {"experts", *MeshLayout::Create({2, 1, 4}, {"PP", "EDP", "EP"}), {}}};
//   absl::StatusOr<MeshSharing> s = ComputeMeshSharing(meshes);
//   s->meshes[1].dims[0].shared_with;   // "default.PP"
//   s->distinct_groups;                 // 5: PP, DP, TP, and the experts'
//                                       //    EDP (groups of one) and EP

#ifndef VEMESH_TOOLS_PLAN_MESH_SHARING_H_
#define VEMESH_TOOLS_PLAN_MESH_SHARING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "vemesh/layout/mesh_layout.h"

namespace vemesh::plan {

// The most ranks a sharing computation lists the groups of (O(world) per
// dimension): above it, ComputeMeshSharing is InvalidArgument.
inline constexpr int64_t kMaxSharingRanks = int64_t{1} << 22;

struct NamedLayout {
  std::string name;  // "default" for --mesh
  MeshLayout layout;
  // Flattenings to include (--flatten NAME=D1,D2 of the default mesh):
  // (name, dims).
  std::vector<std::pair<std::string, std::vector<std::string>>> flattened;
};

struct SharedDim {
  std::string name;  // a dimension, or a flattening's name
  int64_t size = 0;  // ranks per group
  bool flattened = false;
  // "mesh.dim" of the first earlier dimension or flattening with the same
  // rank sets (the communicator this one reuses); empty when it is new.
  std::string shared_with;
};

struct MeshEntry {
  std::string name;
  std::string spec;  // "PP=2,EDP=1,EP=4"
  std::vector<SharedDim> dims;
};

struct MeshSharing {
  std::vector<MeshEntry> meshes;
  int64_t total_dims = 0;       // dimensions and flattenings, all meshes
  int64_t distinct_groups = 0;  // distinct rank-set partitions among them
};

// InvalidArgument (naming the mesh) for a mesh whose size differs from the
// first's, a flattening of an unknown dimension, or more than
// kMaxSharingRanks ranks.
absl::StatusOr<MeshSharing> ComputeMeshSharing(
    const std::vector<NamedLayout>& meshes);

}  // namespace vemesh::plan

#endif  // VEMESH_TOOLS_PLAN_MESH_SHARING_H_
