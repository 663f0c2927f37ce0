// vemesh/strategies/pipeline_stage_model.h
//
// What a pipeline stage computes: the part of the model this stage holds,
// seen one micro-batch at a time. RunPipeline (pipeline_runner.h) calls it
// in schedule order and moves the tensors between stages.
//
//   class MyStage : public PipelineStageModel { ... };
//   MyStage stage(...);
//   absl::Status s = RunPipeline(stage, {.num_micro_batches = 4});
//
// Micro-batches are numbered 0..M-1. Several may be in flight (forward done,
// backward not yet), so the model keeps what its backward needs per
// micro-batch, and may drop it once Backward(mb) has run. Only the first
// stage is asked for inputs and only the last stage for the loss gradient.

#ifndef VEMESH_STRATEGIES_PIPELINE_STAGE_MODEL_H_
#define VEMESH_STRATEGIES_PIPELINE_STAGE_MODEL_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "vemesh/strategies/dense.h"

namespace vemesh::strategies {

class PipelineStageModel {
 public:
  virtual ~PipelineStageModel() = default;

  // Rows and columns of micro-batch `mb`'s activation coming from the
  // previous stage: the receive buffer (not asked on the first stage).
  virtual int64_t InputRows(int mb) const = 0;
  virtual int64_t InputCols() const = 0;

  // First stage only: micro-batch `mb` of the training data.
  virtual absl::StatusOr<Matrix> FirstStageInput(int mb) = 0;
  // This stage's layers on micro-batch `mb`; the result goes to the next
  // stage (or to LossGradient on the last stage).
  virtual absl::StatusOr<Matrix> Forward(int mb, const Matrix& input) = 0;
  // Last stage only: records the loss of `output` and returns dLoss/doutput.
  virtual absl::StatusOr<Matrix> LossGradient(int mb, const Matrix& output) = 0;
  // Accumulates parameter gradients for micro-batch `mb` given the gradient
  // of its output; returns the gradient of its input for the previous stage
  // (not needed, and may be empty, when !need_input_grad: the first stage).
  virtual absl::StatusOr<Matrix> Backward(int mb, const Matrix& grad_output,
                                          bool need_input_grad) = 0;
};

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_PIPELINE_STAGE_MODEL_H_
