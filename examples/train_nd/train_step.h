// examples/train_nd/train_step.h
//
// The pieces of a training step that the static and the elastic loops
// share: the step's global loss, and the serial reference curve; and the
// elastic loop's step.

#ifndef EXAMPLES_TRAIN_ND_TRAIN_STEP_H_
#define EXAMPLES_TRAIN_ND_TRAIN_STEP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "parallel_mlp_stage.h"
#include "train_options.h"
#include "vemesh/strategies/data_parallel_trainer.h"

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
// HSDP: summed over `shard`, then over `replicate` (either may be null), as
// the elastic step sums it, not over the flattened DP group: a plain job on
// the elastic job's transports (--replicate_backend) then runs the same
// reductions on the same backends as the elastic job.
absl::StatusOr<double> GlobalLoss(
    const TrainPlan& plan, double squared_error,
    const std::shared_ptr<vemesh::Communicator>& shard,
    const std::shared_ptr<vemesh::Communicator>& replicate);
// `value` summed over `group`; as it is when the group is null or of one.
absl::StatusOr<double> SumOver(
    const std::shared_ptr<vemesh::Communicator>& group, double value);

// One elastic step (train_nd --elastic) on the current epoch's mesh: the
// loss, or the first error. Every operation on the replica's own groups
// (PP, TP, DP_SHARD) comes before the first over the elastic dimension: a
// DP failure then leaves no replica-internal collective unmatched on the
// way to end_step (docs/ELASTIC.md). `fault` is called at "tp", "dp" and
// "stop" (train_nd's --fault).
absl::StatusOr<double> ElasticStep(
    const TrainPlan& plan, ParallelMlpStage& stage,
    vemesh::strategies::DataParallelTrainer& trainer, int64_t step,
    const std::function<void(const char*)>& fault);

// The serial model's loss per step, trained in-process with the plan's
// optimizer.
absl::StatusOr<std::vector<double>> SerialLosses(const TrainPlan& plan);

}  // namespace train_nd

#endif  // EXAMPLES_TRAIN_ND_TRAIN_STEP_H_
