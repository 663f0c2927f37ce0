#include "serial_mlp.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace train_nd {

SerialMlp::SerialMlp(const MlpShape& shape, uint64_t seed) : shape_(shape) {
  for (int l = 0; l < shape.layers; ++l) {
    layers_.emplace_back(absl::StrCat("layer", l),
                         InitialWeight(seed, l, shape, /*replica=*/0),
                         InitialBias(seed, l, shape, /*replica=*/0));
  }
}

double SerialMlp::TrainStep(const Batch& batch, double learning_rate) {
  // inputs[l] is layer l's input; the last entry is the model's output.
  std::vector<Matrix> inputs{batch.x};
  for (int l = 0; l < shape_.layers; ++l) {
    Matrix y = layers_[l].Forward(inputs.back());
    if (shape_.has_activation(l)) y = y.array().tanh().matrix();
    inputs.push_back(std::move(y));
  }
  const Matrix diff = inputs.back() - batch.y;
  const double count = static_cast<double>(diff.size());
  const double loss = diff.squaredNorm() / count;

  Matrix grad = (2.0 / count) * diff;
  for (int l = shape_.layers - 1; l >= 0; --l) {
    if (shape_.has_activation(l)) {
      // d tanh(z) = 1 - tanh(z)^2, and tanh(z) is the next layer's input.
      grad = (grad.array() * (1.0 - inputs[l + 1].array().square())).matrix();
    }
    grad = layers_[l].Backward(inputs[l], grad);
  }
  for (auto& layer : layers_) {
    for (vemesh::strategies::Parameter* p : layer.parameters()) {
      p->SgdStep(learning_rate);
      p->ZeroGrad();
    }
  }
  return loss;
}

}  // namespace train_nd
