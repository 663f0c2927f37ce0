// vemesh/strategies/expert_mesh.h
//
// Expert folding (docs/STRATEGIES.md): an MoE job's experts on their own
// factorisation of the ranks, beside the attention mesh. The attention
// mesh is the registry's default mesh (PP x DP x CP x TP, say); the expert
// mesh is a named mesh over the same ranks, PP x EDP x EP: EP splits each
// pipeline stage's ranks into expert-parallel groups (the experts spread
// over one), EDP replicates each group (expert data parallelism: the
// replicas' gradients are summed). Dimensions that span the same ranks as
// an attention dimension share its communicator (the registry's group
// cache), so folding costs one split per new rank set.
//
//   VESCALE_DEVICE_MESH.init_device_mesh("cpu", {2, 2, 2}, {"PP", "DP", "TP"});
//   auto mesh = FoldExpertMesh(VESCALE_DEVICE_MESH, /*ep=*/2);  // collective
//   // mesh: PP=2, EDP=2, EP=2, named "experts"; EP is TP's rank sets here
//   auto groups = ExpertGroupsOf(VESCALE_DEVICE_MESH);
//   auto moe = ExpertParallelMoe::Create("moe", 8, groups->ep, init);
//   ... forward, backward ...
//   SumExpertGradients(moe->parameters(), groups->edp.get());
//
// The getters then answer for either mesh by name: get_role_size("EP")
// without MeshName("experts") is FailedPrecondition, never 1.

#ifndef VEMESH_STRATEGIES_EXPERT_MESH_H_
#define VEMESH_STRATEGIES_EXPERT_MESH_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/registry/ve_device_mesh.h"
#include "vemesh/strategies/parameter.h"

namespace vemesh::strategies {

// The expert mesh's name in the registry unless a caller picks another.
inline constexpr char kExpertMeshName[] = "experts";

// Collective (every rank, the same arguments): makes (or replaces) the
// named mesh `name` over the default mesh's ranks: (PP, EDP, EP) of sizes
// (pp, S / ep, ep), S the ranks of one stage, EP innermost (contiguous
// ranks of a stage); without PP in the default mesh, (EDP, EP).
// FailedPrecondition before init_device_mesh; InvalidArgument (naming the
// value) for an `ep` < 1 or not dividing S, or a PP that is not the
// default mesh's outermost dimension (a stage's ranks would not be
// contiguous).
absl::StatusOr<DeviceMesh> FoldExpertMesh(
    VeDeviceMesh& registry, int64_t ep,
    const std::string& name = kExpertMeshName);

// The expert mesh's groups that this rank is in: EP (the experts' all to
// all) and EDP (the experts' gradient sum). Errors of the registry's
// getters (NotFound naming the meshes when there is no such mesh).
struct ExpertGroups {
  std::shared_ptr<Communicator> ep;
  std::shared_ptr<Communicator> edp;
  int64_t ep_size = 1;
  int64_t edp_size = 1;
};
absl::StatusOr<ExpertGroups> ExpertGroupsOf(
    const VeDeviceMesh& registry, MeshName mesh = MeshName(kExpertMeshName));

// Sums each parameter's gradient over `edp` (the replicas of the same
// experts), in place: afterwards every replica holds the gradient of all
// the tokens its experts saw across EDP, and their updates stay equal.
// Collective over `edp`; null or a group of one does nothing.
absl::Status SumExpertGradients(absl::Span<Parameter* const> parameters,
                                Communicator* edp);

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_EXPERT_MESH_H_
