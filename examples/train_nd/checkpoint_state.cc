#include "checkpoint_state.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace train_nd {

using vemesh::strategies::ParameterPlacement;
using vemesh::strategies::Parameter;

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

absl::Status DescribeState(const TrainPlan& plan, const TrainingParts& parts,
                           StateParts which,
                           vemesh::checkpoint::StateDict* dict) {
  const bool optimizers = parts.local_optimizer != nullptr ||
                          parts.zero != nullptr || parts.fsdp != nullptr ||
                          parts.expert_optimizer != nullptr;
  if (which != StateParts::kParameters && optimizers) {
    return absl::InvalidArgumentError(
        "checkpoint: optimizer state is described by a TrainingState that "
        "outlives Save and Load (NameTrainingState)");
  }
  if (which == StateParts::kParameters && parts.fsdp != nullptr) {
    return absl::InvalidArgumentError(
        "checkpoint: load the parameters before FSDP shards them");
  }
  vemesh::strategies::TrainingState state;
  if (absl::Status s = NameTrainingState(plan, parts, &state); !s.ok()) {
    return s;
  }
  return state.get_state_dict(dict, vemesh::strategies::StateDictParts::kModel);
}

std::string ModelFingerprint(const TrainPlan& plan) {
  const TrainOptions& o = plan.options;
  return absl::StrFormat(
      "mlp input_dim=%d hidden=%d output_dim=%d layers=%d experts=%d seed=%d "
      "batch=%d optimizer=%s lr=%.17g",
      o.input_dim, o.hidden, o.output_dim, o.layers, o.experts, o.seed, o.batch,
      vemesh::strategies::OptimizerKindName(plan.optimizer.kind), o.lr);
}

void SetStateMetadata(const TrainPlan& plan, int64_t step,
                      vemesh::checkpoint::StateDict* dict) {
  dict->SetMetadata("step", absl::StrCat(step));
  // The next batch to train on: MakeBatch(seed, step).
  dict->SetMetadata("data_position", absl::StrCat(step));
  dict->SetMetadata("model", ModelFingerprint(plan));
}

absl::Status CheckResumable(
    const TrainPlan& plan, const std::string& path, int64_t step,
    const absl::flat_hash_map<std::string, std::string>& metadata) {
  const std::string want = ModelFingerprint(plan);
  auto model = metadata.find("model");
  if (model == metadata.end() || model->second != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint '", path, "' is of another model or training: it holds '",
        model == metadata.end() ? "(no model metadata)" : model->second,
        "'; this run is '", want, "'"));
  }
  auto position = metadata.find("data_position");
  if (position == metadata.end() || position->second != absl::StrCat(step)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint '", path, "' at step ", step, " has data_position '",
        position == metadata.end() ? "(none)" : position->second,
        "'; expected ", step));
  }
  if (step >= plan.options.steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("--steps=", plan.options.steps, " but checkpoint '", path,
                     "' is at step ", step,
                     ": nothing left to train; expected --steps > ", step));
  }
  return absl::OkStatus();
}

}  // namespace train_nd
