#include "checkpoint_state.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace train_nd {

std::map<std::string, std::string> CheckpointIdentity(const TrainPlan& plan) {
  const TrainOptions& o = plan.options;
  return {
      {"model", absl::StrCat(o.layers, "x", o.hidden, " mlp, in ", o.input_dim,
                             ", out ", o.output_dim, ", experts ", o.experts)},
      {"seed", absl::StrCat(o.seed)},
      {"batch", absl::StrCat(o.batch)},
      {"optimizer",
       std::string(vemesh::strategies::OptimizerKindName(plan.optimizer.kind))},
      {"momentum", absl::StrFormat("%.17g", o.momentum)},
      {"lr", absl::StrFormat("%.17g", o.lr)}};
}

std::string JobDescriptor(const TrainPlan& plan) {
  const TrainOptions& o = plan.options;
  return absl::StrCat(
      absl::StrJoin(CheckpointIdentity(plan), ";", absl::PairFormatter("=")),
      ";micro_batches=", o.micro_batches, ";schedule=", o.schedule,
      ";steps=", o.steps);
}

}  // namespace train_nd
