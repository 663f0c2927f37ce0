// vemesh/strategies/linear.h
//
// The serial linear layer y = x W + b: the reference every parallel layer is
// checked against, and the building block of serial models.
//
//   Linear fc("fc1", weight /* in x out */, bias /* 1 x out */);
//   Matrix y = fc.Forward(x);                  // x: batch x in
//   Matrix dx = fc.Backward(x, dy);            // accumulates fc.weight().grad
//
// Stateless between calls: Backward takes the forward input again instead of
// caching it, so a pipeline can keep several micro-batches in flight and own
// their activations itself.

#ifndef VEMESH_STRATEGIES_LINEAR_H_
#define VEMESH_STRATEGIES_LINEAR_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "vemesh/strategies/dense.h"
#include "vemesh/strategies/parameter.h"

namespace vemesh::strategies {

// OK when `bias` is 1 x out for an in x out `weight`; otherwise
// InvalidArgument naming the layer and both shapes. Every linear layer,
// serial or split, checks its full parameters with it.
absl::Status CheckLinearShapes(const std::string& name, const Matrix& weight,
                               const Matrix& bias);

class Linear {
 public:
  Linear(const std::string& name, Matrix weight, Matrix bias);

  Matrix Forward(const Matrix& x) const;
  // Adds dL/dW and dL/db to the gradients and returns dL/dx.
  Matrix Backward(const Matrix& x, const Matrix& grad_y);

  Parameter& weight() { return weight_; }
  Parameter& bias() { return bias_; }
  std::vector<Parameter*> parameters() { return {&weight_, &bias_}; }

 private:
  Parameter weight_;
  Parameter bias_;
};

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_LINEAR_H_
