#include "serial_mlp.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "vemesh/strategies/expert_parallel.h"

namespace train_nd {

SerialMlp::SerialMlp(const MlpShape& shape, uint64_t seed,
                     const vemesh::strategies::OptimizerOptions& optimizer)
    : shape_(shape), seed_(seed), optimizer_options_(optimizer) {
  const int64_t width = shape.out_features(MlpShape::kMoeLayer);
  for (int e = 0; e < shape.experts; ++e) {
    experts_.emplace_back(absl::StrCat("moe.expert", e),
                          InitialExpertWeight(seed, e, width),
                          InitialExpertBias(seed, e, width));
  }
  for (int l = 0; l < shape.layers; ++l) {
    layers_.emplace_back(absl::StrCat("layer", l),
                         InitialWeight(seed, l, shape, /*replica=*/0),
                         InitialBias(seed, l, shape, /*replica=*/0));
  }
}

absl::StatusOr<double> SerialMlp::TrainStep(const Batch& batch) {
  if (!optimizer_.has_value()) {
    std::vector<vemesh::strategies::Parameter*> params;
    for (auto& layer : experts_) {
      for (vemesh::strategies::Parameter* p : layer.parameters()) {
        params.push_back(p);
      }
    }
    for (auto& layer : layers_) {
      for (vemesh::strategies::Parameter* p : layer.parameters()) {
        params.push_back(p);
      }
    }
    absl::StatusOr<vemesh::strategies::Optimizer> opt =
        vemesh::strategies::Optimizer::Create(optimizer_options_,
                                              std::move(params));
    if (!opt.ok()) return opt.status();
    optimizer_.emplace(*std::move(opt));
  }
  // inputs[l] is layer l's input; the last entry is the model's output.
  std::vector<Matrix> inputs{batch.x};
  // The MoE block's input and routing (h; the next layer gets h + moe(h)).
  Matrix moe_in;
  std::vector<int> route;
  for (int l = 0; l < shape_.layers; ++l) {
    Matrix y = layers_[l].Forward(inputs.back());
    if (shape_.has_activation(l)) y = y.array().tanh().matrix();
    if (shape_.has_moe(l)) {
      std::vector<int64_t> ids(static_cast<size_t>(y.rows()));
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
      route = vemesh::strategies::RouteByHash(ids, shape_.experts, seed_);
      moe_in = y;
      for (int64_t i = 0; i < y.rows(); ++i) {
        y.row(i) += experts_[route[i]].Forward(moe_in.row(i));
      }
    }
    inputs.push_back(std::move(y));
  }
  const Matrix diff = inputs.back() - batch.y;
  const double count = static_cast<double>(diff.size());
  const double loss = diff.squaredNorm() / count;

  Matrix grad = (2.0 / count) * diff;
  for (int l = shape_.layers - 1; l >= 0; --l) {
    if (shape_.has_moe(l)) {
      // d(h + expert(h)) = grad + grad W_e^T, row by row.
      Matrix through = grad;
      for (int64_t i = 0; i < grad.rows(); ++i) {
        through.row(i) +=
            experts_[route[i]].Backward(moe_in.row(i), grad.row(i));
      }
      grad = std::move(through);
    }
    if (shape_.has_activation(l)) {
      // d tanh(z) = 1 - tanh(z)^2, and tanh(z) is the next layer's input
      // (the MoE block's input when there is one).
      const Matrix& t = shape_.has_moe(l) ? moe_in : inputs[l + 1];
      grad = (grad.array() * (1.0 - t.array().square())).matrix();
    }
    grad = layers_[l].Backward(inputs[l], grad);
  }
  if (absl::Status s = optimizer_->Step(); !s.ok()) return s;
  optimizer_->ZeroGrad();
  return loss;
}

}  // namespace train_nd
