// vemesh/strategies/row_parallel_linear.h
//
// A linear layer y = x W + b whose weight is split by input features (rows
// of W) across the tensor-parallel (TP) group, as in Megatron-LM.
//
//   W (in x out) = [ W_0 ; W_1 ; ... ; W_{T-1} ]    rank t holds W_t and b
//   x (batch x in) = [ x_0 | x_1 | ... | x_{T-1} ]
//
//   absl::StatusOr<RowParallelLinear> fc = RowParallelLinear::Create(
//       "fc2", full_weight, full_bias, {.input_is_parallel = true});
//   absl::StatusOr<Matrix> y = fc->Forward(x_t);       // batch x out, whole
//   absl::StatusOr<Matrix> dx = fc->Backward(x_t, dy); // batch x in/T
//
// Forward: y = sum over t of x_t W_t, then + b. Each rank computes its
// partial product and the partials are all-reduced over TP (one all_reduce);
// the bias, which every rank holds whole, is added once after the sum.
// With `input_is_parallel` the input is already this rank's slice x_t (the
// output of a ColumnParallelLinear without gather); otherwise the input is
// the whole x and the layer takes its own columns.
//
// Backward: dy is the gradient of the whole output, the same on every TP
// rank. dW_t = x_t^T dy and db = sum(dy) are local (db comes out the same on
// every rank, so the replicated bias stays replicated); dx_t = dy W_t^T is
// this rank's slice of dx. Without `input_is_parallel` the slices are
// all-gathered into the whole dx (one all_gather).
//
// TP size, rank and group come from VESCALE_DEVICE_MESH (TensorParallelShard).

#ifndef VEMESH_STRATEGIES_ROW_PARALLEL_LINEAR_H_
#define VEMESH_STRATEGIES_ROW_PARALLEL_LINEAR_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "vemesh/strategies/dense.h"
#include "vemesh/strategies/parameter.h"
#include "vemesh/strategies/tensor_parallel_shard.h"

namespace vemesh::strategies {

struct RowParallelOptions {
  // The input is already split by features (this rank's x_t).
  bool input_is_parallel = true;
};

class RowParallelLinear {
 public:
  // Keeps this rank's rows of `full_weight` (in x out) and the whole
  // `full_bias` (1 x out). InvalidArgument when the shapes disagree or `in`
  // does not divide by the TP size. Local: no communication.
  static absl::StatusOr<RowParallelLinear> Create(
      const std::string& name, const Matrix& full_weight,
      const Matrix& full_bias, RowParallelOptions options = {});

  // x: batch x in/T (input_is_parallel) or batch x in. Collective over TP.
  absl::StatusOr<Matrix> Forward(const Matrix& x) const;
  // x as given to Forward; grad_y: batch x out. Accumulates the gradients
  // and returns dL/dx in the shape of x (empty with !need_input_grad).
  // Collective over TP when it gathers dx (!input_is_parallel).
  absl::StatusOr<Matrix> Backward(const Matrix& x, const Matrix& grad_y,
                                  bool need_input_grad = true);

  const TensorParallelShard& shard() const { return shard_; }
  const RowParallelOptions& options() const { return options_; }
  Parameter& weight() { return weight_; }  // in/T x out
  Parameter& bias() { return bias_; }      // 1 x out, replicated over TP
  std::vector<Parameter*> parameters() { return {&weight_, &bias_}; }

 private:
  RowParallelLinear(TensorParallelShard shard, RowParallelOptions options,
                    Parameter weight, Parameter bias);
  // This rank's input columns, or an error naming the bad shape.
  absl::StatusOr<Matrix> LocalInput(const Matrix& x, int tp_size) const;

  TensorParallelShard shard_;
  RowParallelOptions options_;
  Parameter weight_;
  Parameter bias_;
};

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_ROW_PARALLEL_LINEAR_H_
