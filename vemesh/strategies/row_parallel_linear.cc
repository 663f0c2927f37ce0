#include "vemesh/strategies/row_parallel_linear.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/strategies/linear.h"

namespace vemesh::strategies {

RowParallelLinear::RowParallelLinear(TensorParallelShard shard,
                                     RowParallelOptions options,
                                     Parameter weight, Parameter bias)
    : shard_(std::move(shard)),
      options_(options),
      weight_(std::move(weight)),
      bias_(std::move(bias)) {}

absl::StatusOr<RowParallelLinear> RowParallelLinear::Create(
    const std::string& name, const Matrix& full_weight, const Matrix& full_bias,
    RowParallelOptions options) {
  if (absl::Status s = CheckLinearShapes(name, full_weight, full_bias);
      !s.ok()) {
    return s;
  }
  VEMESH_ASSIGN_OR_RETURN(
      TensorParallelShard shard,
      TensorParallelShard::Create(absl::StrCat(name, " input features"),
                                  full_weight.rows()));
  Parameter weight(name + ".weight",
                   full_weight.middleRows(shard.begin(), shard.size()));
  Parameter bias(name + ".bias", full_bias);
  return RowParallelLinear(std::move(shard), options, std::move(weight),
                           std::move(bias));
}

absl::StatusOr<Matrix> RowParallelLinear::LocalInput(const Matrix& x,
                                                     int tp_size) const {
  const bool sliced = options_.input_is_parallel || tp_size == 1;
  const int64_t expected = sliced ? shard_.size() : shard_.total();
  if (x.cols() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("RowParallelLinear ", weight_.name, ": input has ",
                     x.cols(), " columns, expected ", expected));
  }
  if (sliced) return x;
  return Matrix(x.middleCols(shard_.begin(), shard_.size()));
}

absl::StatusOr<Matrix> RowParallelLinear::Forward(const Matrix& x) const {
  VEMESH_ASSIGN_OR_RETURN(RoleGroup tp, shard_.CurrentGroup());
  VEMESH_ASSIGN_OR_RETURN(Matrix local, LocalInput(x, tp.size));
  Matrix y = local * weight_.value;
  if (tp.size > 1) {
    VEMESH_RETURN_IF_ERROR(tp.comm->all_reduce(AsSpan(y), ReduceOp::kSum));
  }
  y.rowwise() += bias_.value.row(0);
  return y;
}

absl::StatusOr<Matrix> RowParallelLinear::Backward(const Matrix& x,
                                                   const Matrix& grad_y,
                                                   bool need_input_grad) {
  VEMESH_ASSIGN_OR_RETURN(RoleGroup tp, shard_.CurrentGroup());
  VEMESH_ASSIGN_OR_RETURN(Matrix local, LocalInput(x, tp.size));
  if (grad_y.rows() != x.rows() || grad_y.cols() != weight_.value.cols()) {
    return absl::InvalidArgumentError(
        absl::StrCat("RowParallelLinear ", weight_.name, ": grad_y is ",
                     grad_y.rows(), " x ", grad_y.cols(), ", expected ",
                     x.rows(), " x ", weight_.value.cols()));
  }
  weight_.grad.noalias() += local.transpose() * grad_y;
  bias_.grad += grad_y.colwise().sum();
  if (!need_input_grad) return Matrix();

  Matrix grad_local = grad_y * weight_.value.transpose();
  if (options_.input_is_parallel || tp.size == 1) return grad_local;
  // Rank t's block (batch x in/T) lands at offset t * block; dx wants it as
  // columns [t * in/T, (t+1) * in/T).
  const int64_t rows = grad_local.rows();
  const int64_t cols = grad_local.cols();
  Matrix blocks(static_cast<int64_t>(tp.size) * rows, cols);
  VEMESH_RETURN_IF_ERROR(
      tp.comm->all_gather(AsConstSpan(grad_local), AsSpan(blocks)));
  Matrix grad_x(rows, cols * tp.size);
  for (int t = 0; t < tp.size; ++t) {
    grad_x.middleCols(t * cols, cols) = blocks.middleRows(t * rows, rows);
  }
  return grad_x;
}

}  // namespace vemesh::strategies
