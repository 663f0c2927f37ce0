// vemesh/strategies/parameter.h
//
// A trainable tensor and its gradient, always of the same shape.
//
//   Parameter w{"layer0.weight", Matrix::Random(16, 64)};
//   w.grad += ...;          // backward passes accumulate
//   w.ZeroGrad();           // before the next step
//
// Layers own their parameters and hand out pointers (`parameters()`) to the
// optimiser and to data parallelism, which reads and writes `value` and
// `grad` in place. A bias is a 1 x N parameter.

#ifndef VEMESH_STRATEGIES_PARAMETER_H_
#define VEMESH_STRATEGIES_PARAMETER_H_

#include <string>
#include <utility>

#include "vemesh/strategies/dense.h"

namespace vemesh::strategies {

struct Parameter {
  Parameter() = default;
  Parameter(std::string name, Matrix value)
      : name(std::move(name)),
        value(std::move(value)),
        grad(Matrix::Zero(this->value.rows(), this->value.cols())) {}

  void ZeroGrad() { grad.setZero(value.rows(), value.cols()); }
  // Plain SGD: value -= learning_rate * grad.
  void SgdStep(double learning_rate) { value -= learning_rate * grad; }

  std::string name;
  Matrix value;
  Matrix grad;
};

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_PARAMETER_H_
