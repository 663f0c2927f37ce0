// vemesh/strategies/column_parallel_linear.h
//
// A linear layer y = x W + b whose weight is split by output features across
// the tensor-parallel (TP) group, as in Megatron-LM.
//
//   W (in x out) = [ W_0 | W_1 | ... | W_{T-1} ]    rank t holds W_t, b_t
//
//   absl::StatusOr<ColumnParallelLinear> fc = ColumnParallelLinear::Create(
//       "fc1", full_weight, full_bias, {.gather_output = false});
//   absl::StatusOr<Matrix> y = fc->Forward(x);        // batch x out/T
//   absl::StatusOr<Matrix> dx = fc->Backward(x, dy);  // batch x in
//
// Forward: every TP rank has the whole input x and computes its slice of the
// output columns, x W_t + b_t; with `gather_output` the slices are
// all-gathered into the whole output (one all_gather). Without it the output
// stays split, ready for a RowParallelLinear (the Megatron MLP pairing, which
// needs no communication between the two layers).
//
// Backward: dW_t = x^T dy_t and db_t = sum(dy_t) stay local; dx = sum over t
// of dy_t W_t^T is a partial sum on each rank and is all-reduced over TP (one
// all_reduce). With `gather_output`, dy is the gradient of the whole output
// (the same on every TP rank) and each rank takes its own columns of it.
//
// The TP group, size and rank come from VESCALE_DEVICE_MESH (see
// TensorParallelShard): the registry at Create decides the slice, and every
// Forward/Backward asks the registry for the current group.

#ifndef VEMESH_STRATEGIES_COLUMN_PARALLEL_LINEAR_H_
#define VEMESH_STRATEGIES_COLUMN_PARALLEL_LINEAR_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "vemesh/strategies/dense.h"
#include "vemesh/strategies/parameter.h"
#include "vemesh/strategies/tensor_parallel_shard.h"

namespace vemesh::strategies {

struct ColumnParallelOptions {
  // All-gather the output slices into the whole output.
  bool gather_output = false;
};

class ColumnParallelLinear {
 public:
  // Keeps this rank's columns of `full_weight` (in x out) and `full_bias`
  // (1 x out). InvalidArgument when the shapes disagree or `out` does not
  // divide by the TP size. Local: no communication.
  static absl::StatusOr<ColumnParallelLinear> Create(
      const std::string& name, const Matrix& full_weight,
      const Matrix& full_bias, ColumnParallelOptions options = {});

  // x: batch x in, the same on every TP rank. Collective over TP when
  // gather_output.
  absl::StatusOr<Matrix> Forward(const Matrix& x) const;
  // grad_y has Forward's output shape. Accumulates the shard's gradients and
  // returns dL/dx (batch x in, whole); with !need_input_grad skips the
  // all_reduce and returns an empty matrix. Collective over TP unless
  // !need_input_grad.
  absl::StatusOr<Matrix> Backward(const Matrix& x, const Matrix& grad_y,
                                  bool need_input_grad = true);

  const TensorParallelShard& shard() const { return shard_; }
  const ColumnParallelOptions& options() const { return options_; }
  Parameter& weight() { return weight_; }  // in x out/T
  Parameter& bias() { return bias_; }      // 1 x out/T
  std::vector<Parameter*> parameters() { return {&weight_, &bias_}; }

 private:
  ColumnParallelLinear(TensorParallelShard shard, ColumnParallelOptions options,
                       Parameter weight, Parameter bias);

  TensorParallelShard shard_;
  ColumnParallelOptions options_;
  Parameter weight_;
  Parameter bias_;
};

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_COLUMN_PARALLEL_LINEAR_H_
