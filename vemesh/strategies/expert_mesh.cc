#include "vemesh/strategies/expert_mesh.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "vemesh/base/status_macros.h"

namespace vemesh::strategies {

absl::StatusOr<DeviceMesh> FoldExpertMesh(VeDeviceMesh& registry, int64_t ep,
                                          const std::string& name) {
  VEMESH_ASSIGN_OR_RETURN(DeviceMesh attention, registry.get());
  const MeshLayout& layout = attention.layout();
  int64_t pp = 1;
  absl::StatusOr<int64_t> pp_dim = layout.find_role("PP");
  if (pp_dim.ok()) {
    if (*pp_dim != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FoldExpertMesh: PP is dimension ", *pp_dim, " of ",
          layout.ToString(),
          ": expected the outermost (0), so that a stage's ranks are "
          "contiguous"));
    }
    pp = layout.dim_size(0).value_or(1);
  }
  const int64_t stage = layout.size() / pp;
  if (ep < 1 || stage % ep != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FoldExpertMesh: expert-parallel size ", ep, " for stages of ", stage,
        " ranks (", layout.ToString(), "): expected a divisor of ", stage));
  }
  std::vector<int64_t> shape = {stage / ep, ep};
  std::vector<std::string> names = {"EDP", "EP"};
  if (pp_dim.ok()) {
    shape.insert(shape.begin(), pp);
    names.insert(names.begin(), "PP");
  }
  InitOptions options;
  options.mesh_name = name;
  return registry.init_device_mesh(DeviceTypeName(attention.device_type()),
                                   std::move(shape), std::move(names),
                                   std::move(options));
}

absl::StatusOr<ExpertGroups> ExpertGroupsOf(const VeDeviceMesh& registry,
                                            MeshName mesh) {
  ExpertGroups out;
  VEMESH_ASSIGN_OR_RETURN(out.ep, registry.get_role_dim_groups("EP", mesh));
  VEMESH_ASSIGN_OR_RETURN(out.edp, registry.get_role_dim_groups("EDP", mesh));
  VEMESH_ASSIGN_OR_RETURN(out.ep_size, registry.get_role_size("EP", mesh));
  VEMESH_ASSIGN_OR_RETURN(out.edp_size, registry.get_role_size("EDP", mesh));
  return out;
}

absl::Status SumExpertGradients(absl::Span<Parameter* const> parameters,
                                Communicator* edp) {
  if (edp == nullptr || edp->size() == 1) return absl::OkStatus();
  for (Parameter* p : parameters) {
    VEMESH_RETURN_IF_ERROR(edp->all_reduce(p->grad.data(), p->grad.data(),
                                           static_cast<size_t>(p->grad.size()),
                                           DataType::kFloat64, ReduceOp::kSum));
  }
  return absl::OkStatus();
}

}  // namespace vemesh::strategies
