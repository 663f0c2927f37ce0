// vemesh/strategies/elastic_state.h
//
// Registers what a TrainingState describes (vemesh/strategies/state_dict.h)
// with an ElasticMesh, so that a replica that joins receives the
// parameters AND the optimizer state, and the replicas' fingerprint covers
// both:
//
//   TrainingState state;
//   absl::Status s = state.AddFsdp(fsdp, units);   // after AddParameter...
//   s = RegisterElasticState(el, state);  // once, before el.sync_state()
//   s = el.sync_state();
//
// Each live buffer is registered as its bytes (register_state_bytes: sent,
// received and hashed in place, no copy): the parameters' values outside
// FSDP, each FSDP unit's shard, each optimizer state buffer; the step
// counts, which no buffer holds, as a pair of callbacks. The names are
// TrainingState::elastic_state()'s: the same on every replica holding the
// same shard coordinate (replicas that differ would not agree on a step).
//
// State sharded over the elastic dimension itself (a DistributedOptimizer
// whose DP group is the replicate dimension) differs from replica to
// replica and cannot be carried this way: shard inside a replica (HSDP's
// DP_SHARD) and replicate over the elastic dimension.
//
// `state` and what it points at must outlive the mesh's use of them (every
// recover() and sync_state() reads the buffers through them).

#ifndef VEMESH_STRATEGIES_ELASTIC_STATE_H_
#define VEMESH_STRATEGIES_ELASTIC_STATE_H_

#include "absl/status/status.h"
#include "vemesh/elastic/elastic_mesh.h"
#include "vemesh/strategies/state_dict.h"

namespace vemesh::strategies {

// register_state_bytes (or register_state_dict_fn) for each of
// state.elastic_state(); its error, or the mesh's, as they come.
absl::Status RegisterElasticState(ElasticMesh& mesh, TrainingState& state);

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_ELASTIC_STATE_H_
