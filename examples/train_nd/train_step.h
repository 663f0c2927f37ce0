// examples/train_nd/train_step.h
//
// The pieces of a training step that the static and the elastic loops
// share: the step's global loss, and the serial reference curve.

#ifndef EXAMPLES_TRAIN_ND_TRAIN_STEP_H_
#define EXAMPLES_TRAIN_ND_TRAIN_STEP_H_

#include <vector>

#include "absl/status/statusor.h"
#include "train_options.h"

namespace train_nd {

// The step's loss, on every rank, in two parts so that an elastic step can
// put every DP operation after every operation on the replica's own groups:
// the last stage's squared error broadcast along PP (the replica's groups),
// then summed over DP and normalised by the global batch.
absl::StatusOr<double> PipelineSquaredError(double squared_error);
absl::StatusOr<double> DataParallelLoss(const TrainPlan& plan,
                                        double replica_squared_error);
// Both, in that order.
absl::StatusOr<double> GlobalLoss(const TrainPlan& plan, double squared_error);

// The serial model's loss per step, trained in-process with the plan's
// optimizer.
absl::StatusOr<std::vector<double>> SerialLosses(const TrainPlan& plan);

}  // namespace train_nd

#endif  // EXAMPLES_TRAIN_ND_TRAIN_STEP_H_
