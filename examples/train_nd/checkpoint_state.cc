#include "checkpoint_state.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace train_nd {

using vemesh::strategies::Parameter;
using vemesh::strategies::ParameterPlacement;

absl::Status NameTrainingState(const TrainPlan& plan,
                               const TrainingParts& parts,
                               vemesh::strategies::TrainingState* state) {
  ParallelMlpStage& stage = *parts.stage;
  std::vector<std::vector<Parameter*>> layers = stage.layer_parameters();
  for (int l = stage.first_layer(); l < stage.end_layer(); ++l) {
    const std::string name = absl::StrCat("layer", l);
    absl::StatusOr<std::vector<ParameterPlacement>> placements =
        MlpShape::column_parallel(l)
            ? vemesh::strategies::ColumnParallelPlacements(
                  name, plan.shape.in_features(l), plan.shape.out_features(l),
                  stage.tp_rank(), stage.tp_size())
            : vemesh::strategies::RowParallelPlacements(
                  name, plan.shape.in_features(l), plan.shape.out_features(l),
                  stage.tp_rank(), stage.tp_size());
    if (!placements.ok()) return placements.status();
    if (absl::Status s = state->AddParameters(layers[l - stage.first_layer()],
                                              *std::move(placements));
        !s.ok()) {
      return s;
    }
  }
  // The experts: whole, one owner each, named by their global index.
  for (Parameter* p : stage.expert_parameters()) {
    if (absl::Status s = state->AddParameter(
            p, vemesh::strategies::WholePlacement(p->name, p->value.rows(),
                                                  p->value.cols()));
        !s.ok()) {
      return s;
    }
  }
  absl::Status s = absl::OkStatus();
  if (parts.fsdp != nullptr) s = state->AddFsdp(*parts.fsdp, std::move(layers));
  if (s.ok() && parts.zero != nullptr) {
    s = state->AddDistributedOptimizer(*parts.zero, stage.parameters());
  }
  if (s.ok() && parts.local_optimizer != nullptr) {
    s = state->AddOptimizer(*parts.local_optimizer);
  }
  if (s.ok() && parts.expert_optimizer != nullptr) {
    s = state->AddOptimizer(*parts.expert_optimizer);
  }
  return s;
}

std::map<std::string, std::string> CheckpointIdentity(const TrainPlan& plan) {
  const TrainOptions& o = plan.options;
  return {
      {"model",
       absl::StrFormat(
           "mlp input_dim=%d hidden=%d output_dim=%d layers=%d experts=%d "
           "seed=%d batch=%d optimizer=%s lr=%.17g",
           o.input_dim, o.hidden, o.output_dim, o.layers, o.experts, o.seed,
           o.batch, vemesh::strategies::OptimizerKindName(plan.optimizer.kind),
           o.lr)}};
}

std::string JobDescriptor(const TrainPlan& plan) {
  const TrainOptions& o = plan.options;
  return absl::StrCat("model=", o.layers, "x", o.hidden, ",in=", o.input_dim,
                      ",out=", o.output_dim, ";batch=", o.batch,
                      ";micro_batches=", o.micro_batches,
                      ";optimizer=", o.optimizer, ";lr=", o.lr,
                      ";seed=", o.seed, ";schedule=", o.schedule,
                      ";steps=", o.steps);
}

}  // namespace train_nd
