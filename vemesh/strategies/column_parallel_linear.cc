#include "vemesh/strategies/column_parallel_linear.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/strategies/linear.h"

namespace vemesh::strategies {

ColumnParallelLinear::ColumnParallelLinear(TensorParallelShard shard,
                                           ColumnParallelOptions options,
                                           Parameter weight, Parameter bias)
    : shard_(std::move(shard)),
      options_(options),
      weight_(std::move(weight)),
      bias_(std::move(bias)) {}

absl::StatusOr<ColumnParallelLinear> ColumnParallelLinear::Create(
    const std::string& name, const Matrix& full_weight, const Matrix& full_bias,
    ColumnParallelOptions options) {
  if (absl::Status s = CheckLinearShapes(name, full_weight, full_bias);
      !s.ok()) {
    return s;
  }
  VEMESH_ASSIGN_OR_RETURN(
      TensorParallelShard shard,
      TensorParallelShard::Create(absl::StrCat(name, " output features"),
                                  full_weight.cols()));
  Parameter weight(name + ".weight",
                   full_weight.middleCols(shard.begin(), shard.size()));
  Parameter bias(name + ".bias",
                 full_bias.middleCols(shard.begin(), shard.size()));
  return ColumnParallelLinear(std::move(shard), options, std::move(weight),
                              std::move(bias));
}

absl::StatusOr<Matrix> ColumnParallelLinear::Forward(const Matrix& x) const {
  VEMESH_ASSIGN_OR_RETURN(RoleGroup tp, shard_.CurrentGroup());
  Matrix local = AffineForward(x, weight_.value, bias_.value);
  if (!options_.gather_output || tp.size == 1) return local;

  // all_gather puts rank t's (batch x out/T) block at offset t * block; the
  // whole output wants it as columns [t * out/T, (t+1) * out/T).
  const int64_t rows = local.rows();
  const int64_t cols = local.cols();
  Matrix blocks(static_cast<int64_t>(tp.size) * rows, cols);
  VEMESH_RETURN_IF_ERROR(
      tp.comm->all_gather(AsConstSpan(local), AsSpan(blocks)));
  Matrix out(rows, cols * tp.size);
  for (int t = 0; t < tp.size; ++t) {
    out.middleCols(t * cols, cols) = blocks.middleRows(t * rows, rows);
  }
  return out;
}

absl::StatusOr<Matrix> ColumnParallelLinear::Backward(const Matrix& x,
                                                      const Matrix& grad_y,
                                                      bool need_input_grad) {
  VEMESH_ASSIGN_OR_RETURN(RoleGroup tp, shard_.CurrentGroup());
  const bool whole = options_.gather_output && tp.size > 1;
  const int64_t expected_cols = whole ? shard_.total() : shard_.size();
  if (grad_y.rows() != x.rows() || grad_y.cols() != expected_cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ColumnParallelLinear ", weight_.name, ": grad_y is ", grad_y.rows(),
        " x ", grad_y.cols(), ", expected ", x.rows(), " x ", expected_cols));
  }
  // The gradient of this rank's output columns.
  const Matrix local =
      whole ? Matrix(grad_y.middleCols(shard_.begin(), shard_.size())) : grad_y;
  weight_.grad.noalias() += x.transpose() * local;
  bias_.grad += local.colwise().sum();
  if (!need_input_grad) return Matrix();

  Matrix grad_x = local * weight_.value.transpose();
  if (tp.size > 1) {
    VEMESH_RETURN_IF_ERROR(tp.comm->all_reduce(AsSpan(grad_x), ReduceOp::kSum));
  }
  return grad_x;
}

}  // namespace vemesh::strategies
