#include "parallel_mlp_stage.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "vemesh/api/ve_device_mesh.h"

namespace train_nd {

using vemesh::strategies::ColumnParallelLinear;
using vemesh::strategies::Parameter;
using vemesh::strategies::RowParallelLinear;

ParallelMlpStage::ParallelMlpStage(const TrainPlan& plan, MlpShape::Range range,
                                   int64_t dp_rank, int tp_size)
    : plan_(plan),
      range_(range),
      dp_rank_(dp_rank),
      tp_size_(tp_size),
      inputs_(plan.options.micro_batches) {}

absl::Status ParallelMlpStage::Rebind(const TrainPlan& plan) {
  absl::StatusOr<int64_t> dp_rank = VESCALE_DEVICE_MESH.get_data_parallel_rank();
  if (!dp_rank.ok()) return dp_rank.status();
  plan_ = plan;
  dp_rank_ = *dp_rank;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ParallelMlpStage>> ParallelMlpStage::Create(
    const TrainPlan& plan) {
  absl::StatusOr<int64_t> pp_rank =
      VESCALE_DEVICE_MESH.get_pipeline_parallel_rank();
  if (!pp_rank.ok()) return pp_rank.status();
  absl::StatusOr<int64_t> pp_size = VESCALE_DEVICE_MESH.get_role_size("PP");
  if (!pp_size.ok()) return pp_size.status();
  absl::StatusOr<int64_t> dp_rank = VESCALE_DEVICE_MESH.get_data_parallel_rank();
  if (!dp_rank.ok()) return dp_rank.status();
  absl::StatusOr<int64_t> tp_size = VESCALE_DEVICE_MESH.get_role_size("TP");
  if (!tp_size.ok()) return tp_size.status();

  const MlpShape& shape = plan.shape;
  const MlpShape::Range range = shape.stage_layers(
      static_cast<int>(*pp_rank), static_cast<int>(*pp_size));
  std::unique_ptr<ParallelMlpStage> stage(new ParallelMlpStage(
      plan, range, *dp_rank, static_cast<int>(*tp_size)));
  for (int l = range.begin; l < range.end; ++l) {
    const std::string name = absl::StrCat("layer", l);
    const Matrix w = InitialWeight(plan.options.seed, l, shape, *dp_rank);
    const Matrix b = InitialBias(plan.options.seed, l, shape, *dp_rank);
    if (MlpShape::column_parallel(l)) {
      // Gather only at the model's end: the loss needs the whole output.
      absl::StatusOr<ColumnParallelLinear> layer = ColumnParallelLinear::Create(
          name, w, b, {.gather_output = l + 1 == shape.layers});
      if (!layer.ok()) return layer.status();
      stage->layers_.emplace_back(*std::move(layer));
    } else {
      // A row layer always follows a column layer, whose output is split.
      absl::StatusOr<RowParallelLinear> layer =
          RowParallelLinear::Create(name, w, b, {.input_is_parallel = true});
      if (!layer.ok()) return layer.status();
      stage->layers_.emplace_back(*std::move(layer));
    }
  }
  return stage;
}

void ParallelMlpStage::SetBatch(const Batch& batch) {
  const int64_t rows = plan_.rows_per_replica;
  replica_.x = batch.x.middleRows(dp_rank_ * rows, rows);
  replica_.y = batch.y.middleRows(dp_rank_ * rows, rows);
}

double ParallelMlpStage::TakeSquaredError() {
  return std::exchange(squared_error_, 0.0);
}

std::vector<Parameter*> ParallelMlpStage::parameters() {
  std::vector<Parameter*> params;
  for (Layer& layer : layers_) {
    std::visit(
        [&](auto& l) {
          for (Parameter* p : l.parameters()) params.push_back(p);
        },
        layer);
  }
  return params;
}

int64_t ParallelMlpStage::InputRows(int) const {
  return plan_.rows_per_micro_batch;
}

int64_t ParallelMlpStage::InputCols() const {
  // A row layer takes its TP slice of the previous column layer's output.
  const int l = range_.begin;
  return MlpShape::column_parallel(l) ? plan_.shape.in_features(l)
                                      : plan_.shape.in_features(l) / tp_size_;
}

absl::StatusOr<Matrix> ParallelMlpStage::FirstStageInput(int mb) {
  return Matrix(replica_.x.middleRows(mb * plan_.rows_per_micro_batch,
                                      plan_.rows_per_micro_batch));
}

absl::StatusOr<Matrix> ParallelMlpStage::Forward(int mb, const Matrix& input) {
  std::vector<Matrix>& saved = inputs_[mb];
  saved.assign(1, input);
  for (size_t i = 0; i < layers_.size(); ++i) {
    absl::StatusOr<Matrix> y = std::visit(
        [&](const auto& l) { return l.Forward(saved.back()); }, layers_[i]);
    if (!y.ok()) return y.status();
    if (plan_.shape.has_activation(range_.begin + static_cast<int>(i))) {
      *y = y->array().tanh().matrix();
    }
    saved.push_back(*std::move(y));
  }
  return saved.back();
}

absl::StatusOr<Matrix> ParallelMlpStage::LossGradient(int mb,
                                                      const Matrix& output) {
  const Matrix target = replica_.y.middleRows(
      mb * plan_.rows_per_micro_batch, plan_.rows_per_micro_batch);
  const Matrix diff = output - target;
  squared_error_ += diff.squaredNorm();
  // d/d(output) of sum(diff^2) / (replica rows * outputs): this replica's
  // mean; DP averaging of the gradients makes it the global mean.
  const double count =
      static_cast<double>(plan_.rows_per_replica * plan_.shape.output_dim);
  return Matrix((2.0 / count) * diff);
}

absl::StatusOr<Matrix> ParallelMlpStage::Backward(int mb,
                                                  const Matrix& grad_output,
                                                  bool need_input_grad) {
  std::vector<Matrix>& saved = inputs_[mb];
  Matrix grad = grad_output;
  for (int i = static_cast<int>(layers_.size()) - 1; i >= 0; --i) {
    if (plan_.shape.has_activation(range_.begin + i)) {
      grad = (grad.array() * (1.0 - saved[i + 1].array().square())).matrix();
    }
    const bool need = i > 0 || need_input_grad;
    absl::StatusOr<Matrix> g = std::visit(
        [&](auto& l) { return l.Backward(saved[i], grad, need); }, layers_[i]);
    if (!g.ok()) return g.status();
    grad = *std::move(g);
  }
  saved.clear();  // this micro-batch is done
  return grad;
}

}  // namespace train_nd
