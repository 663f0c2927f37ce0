#include "vemesh/strategies/linear.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace vemesh::strategies {

absl::Status CheckLinearShapes(const std::string& name, const Matrix& weight,
                               const Matrix& bias) {
  if (bias.rows() == 1 && bias.cols() == weight.cols()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": bias is ", bias.rows(), " x ", bias.cols(),
                   ", expected 1 x ", weight.cols(), " for a ", weight.rows(),
                   " x ", weight.cols(), " weight"));
}

Linear::Linear(const std::string& name, Matrix weight, Matrix bias)
    : weight_(name + ".weight", std::move(weight)),
      bias_(name + ".bias", std::move(bias)) {}

Matrix Linear::Forward(const Matrix& x) const {
  return AffineForward(x, weight_.value, bias_.value);
}

Matrix Linear::Backward(const Matrix& x, const Matrix& grad_y) {
  weight_.grad.noalias() += x.transpose() * grad_y;
  bias_.grad += grad_y.colwise().sum();
  return grad_y * weight_.value.transpose();
}

}  // namespace vemesh::strategies
