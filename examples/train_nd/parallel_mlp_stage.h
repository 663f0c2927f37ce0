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
//
// With `--experts`, the stage holding layer MlpShape::kMoeLayer adds the
// MoE block after it, its experts spread over the expert-parallel group:
// DP x TP of this stage, flattened (DeviceMesh::flatten, made in Create on
// every rank). The rows are whole on every TP rank there, so each TP rank
// sends only its share of them to the experts and the results are gathered
// over TP again; every row of the global batch thus reaches one expert
// once. Expert parameters are not replicated: they are left out of
// parameters() (no DP averaging) and scaled by 1/DP instead, which turns
// the per-replica mean of the loss into the global one.
//
// Overlap with data parallelism: a hook set by set_gradient_ready is called
// for each parameter as soon as the last micro-batch's backward has
// finished its layer (layers in reverse), so that DataParallel can start
// that bucket's all_reduce while the earlier layers compute.

#ifndef EXAMPLES_TRAIN_ND_PARALLEL_MLP_STAGE_H_
#define EXAMPLES_TRAIN_ND_PARALLEL_MLP_STAGE_H_

#include <functional>
#include <memory>
#include <optional>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "synthetic_data.h"
#include "train_options.h"
#include "vemesh/strategies/column_parallel_linear.h"
#include "vemesh/strategies/expert_parallel.h"
#include "vemesh/strategies/fully_sharded_data_parallel.h"
#include "vemesh/strategies/parameter.h"
#include "vemesh/strategies/pipeline_stage_model.h"
#include "vemesh/strategies/row_parallel_linear.h"
#include "vemesh/strategies/state_dict.h"

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
  // The replicated parameters (DP averages them), first layer first.
  std::vector<vemesh::strategies::Parameter*> parameters();
  // parameters(), one list per layer of this stage (FSDP's units).
  std::vector<std::vector<vemesh::strategies::Parameter*>> layer_parameters();
  // This rank's experts' parameters (empty without the MoE block).
  std::vector<vemesh::strategies::Parameter*> expert_parameters();
  // FSDP's units: one per layer of this stage, named layer<l>.
  std::vector<vemesh::strategies::FsdpUnit> fsdp_units();
  // Names this rank's parameters in `state` before FSDP frees them:
  // layer<l>.weight ([in, out]) and .bias ([1, out]), even layers
  // column-parallel and odd ones row-parallel over TP, and the experts
  // whole by their global names (moe.expert<e>.weight / .bias).
  absl::Status NameParameters(vemesh::strategies::TrainingState* state);
  // Called with each of parameters() once per step, when its gradient is
  // final; an error stops the backward pass.
  void set_gradient_ready(
      std::function<absl::Status(const vemesh::strategies::Parameter*)> hook) {
    gradient_ready_ = std::move(hook);
  }
  int first_layer() const { return range_.begin; }
  int end_layer() const { return range_.end; }
  // This rank's TP slice: layer weights are cut into tp_size() equal blocks.
  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }

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
  // The TP share [begin, end) of `rows` rows that this rank routes.
  std::pair<int64_t, int64_t> TpShare(int64_t rows) const;
  absl::StatusOr<Matrix> MoeForward(int mb, const Matrix& h);
  absl::StatusOr<Matrix> MoeBackward(int mb, const Matrix& grad);

  Batch replica_;  // this replica's rows of the step's batch
  std::optional<vemesh::strategies::ExpertParallelMoe> moe_;
  // The experts' EDP group on the expert mesh (null or one rank: EP spans
  // the stage): their gradients are summed over it.
  std::shared_ptr<vemesh::Communicator> expert_edp_;
  int tp_rank_ = 0;
  // Per micro-batch: the MoE block's input (for the tanh derivative) and
  // what its forward sent where.
  std::vector<Matrix> moe_in_;
  std::vector<vemesh::strategies::MoeDispatch> moe_dispatch_;
  std::function<absl::Status(const vemesh::strategies::Parameter*)>
      gradient_ready_;
  int backwards_ = 0;  // Backward calls since SetBatch
  // Per micro-batch: inputs[mb][i] is local layer i's input, and the last
  // entry the stage's output (kept for the tanh derivative).
  std::vector<std::vector<Matrix>> inputs_;
  double squared_error_ = 0;
};

}  // namespace train_nd

#endif  // EXAMPLES_TRAIN_ND_PARALLEL_MLP_STAGE_H_
