#include "vemesh/strategies/elastic_state.h"

#include <utility>
#include <vector>

#include "vemesh/base/status_macros.h"

namespace vemesh::strategies {

absl::Status RegisterElasticState(ElasticMesh& mesh, TrainingState& state) {
  VEMESH_ASSIGN_OR_RETURN(std::vector<ElasticStateEntry> entries,
                          state.elastic_state());
  for (ElasticStateEntry& e : entries) {
    if (e.bytes) {
      VEMESH_RETURN_IF_ERROR(
          mesh.register_state_bytes(e.name, std::move(e.bytes)));
    } else {
      VEMESH_RETURN_IF_ERROR(mesh.register_state_dict_fn(
          e.name, std::move(e.state_dict), std::move(e.load_state_dict)));
    }
  }
  return absl::OkStatus();
}

}  // namespace vemesh::strategies
