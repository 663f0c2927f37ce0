// examples/train_nd/parallel_mlp_stage.h
//
// This rank's part of the example's MLP: the layers of its pipeline stage,
// each split across its TP group, trained on its DP replica's rows of the
// batch. It is the PipelineStageModel that RunPipeline drives.
//
//   absl::StatusOr<std::unique_ptr<ParallelMlpStage>> stage =
//       ParallelMlpStage::Create(plan);
//   (*stage)->SetBatch(batch);                 // the step's whole batch
//   RunPipeline(**stage, {plan.schedule, micro_batches});
//   double sse = (*stage)->TakeSquaredError(); // last stage only
//
// Which stage, TP slice and DP replica this rank is comes from
// VESCALE_DEVICE_MESH (PP, TP and DP ranks); layer kinds and stage ranges
// from MlpShape. The loss is the mean squared error over the whole global
// batch, so each micro-batch's loss gradient is scaled by the replica's row
// count, and averaging over DP then gives exactly the serial gradient.

#ifndef EXAMPLES_TRAIN_ND_PARALLEL_MLP_STAGE_H_
#define EXAMPLES_TRAIN_ND_PARALLEL_MLP_STAGE_H_

#include <memory>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "synthetic_data.h"
#include "train_options.h"
#include "vemesh/strategies/column_parallel_linear.h"
#include "vemesh/strategies/parameter.h"
#include "vemesh/strategies/pipeline_stage_model.h"
#include "vemesh/strategies/row_parallel_linear.h"

namespace train_nd {

class ParallelMlpStage : public vemesh::strategies::PipelineStageModel {
 public:
  // Builds this rank's layers with DP replica r's initial weights (replicas
  // differ until DataParallel::BroadcastParameters).
  static absl::StatusOr<std::unique_ptr<ParallelMlpStage>> Create(
      const TrainPlan& plan);

  // After an elastic membership change: the new DP rank (from the registry)
  // and the plan's rows per replica for the new DP size.
  absl::Status Rebind(const TrainPlan& plan);
  // The step's whole batch; this rank uses its DP replica's rows.
  void SetBatch(const Batch& batch);
  // Sum of squared errors over this step's micro-batches (0 off the last
  // stage), and reset.
  double TakeSquaredError();
  std::vector<vemesh::strategies::Parameter*> parameters();
  int first_layer() const { return range_.begin; }
  int end_layer() const { return range_.end; }

  // PipelineStageModel.
  int64_t InputRows(int mb) const override;
  int64_t InputCols() const override;
  absl::StatusOr<Matrix> FirstStageInput(int mb) override;
  absl::StatusOr<Matrix> Forward(int mb, const Matrix& input) override;
  absl::StatusOr<Matrix> LossGradient(int mb, const Matrix& output) override;
  absl::StatusOr<Matrix> Backward(int mb, const Matrix& grad_output,
                                  bool need_input_grad) override;

 private:
  using Layer = std::variant<vemesh::strategies::ColumnParallelLinear,
                             vemesh::strategies::RowParallelLinear>;
  ParallelMlpStage(const TrainPlan& plan, MlpShape::Range range,
                   int64_t dp_rank, int tp_size);

  TrainPlan plan_;
  MlpShape::Range range_;
  int64_t dp_rank_;
  int tp_size_;
  std::vector<Layer> layers_;
  Batch replica_;  // this replica's rows of the step's batch
  // Per micro-batch: inputs[mb][i] is local layer i's input, and the last
  // entry the stage's output (kept for the tanh derivative).
  std::vector<std::vector<Matrix>> inputs_;
  double squared_error_ = 0;
};

}  // namespace train_nd

#endif  // EXAMPLES_TRAIN_ND_PARALLEL_MLP_STAGE_H_
