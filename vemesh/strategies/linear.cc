#include "vemesh/strategies/linear.h"

#include <utility>

namespace vemesh::strategies {

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
