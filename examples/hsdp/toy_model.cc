#include "toy_model.h"

#include <cmath>
#include <random>
#include <string>

#include "vemesh/base/status_macros.h"

namespace hsdp {

using vemesh::strategies::FsdpUnit;
using vemesh::strategies::Linear;
using vemesh::strategies::Parameter;

namespace {

Matrix Uniform(int64_t rows, int64_t cols, double bound, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> d(-bound, bound);
  Matrix m(rows, cols);
  for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = d(rng);
  return m;
}

}  // namespace

std::vector<FsdpUnit> ToyModel::Units() {
  std::vector<FsdpUnit> units;
  for (size_t i = 0; i < layers.size(); ++i) {
    units.push_back({"net" + std::to_string(i + 1), layers[i].parameters()});
  }
  return units;
}

std::vector<Parameter*> ToyModel::parameters() {
  std::vector<Parameter*> all;
  for (Linear& l : layers)
    for (Parameter* p : l.parameters()) all.push_back(p);
  return all;
}

ToyModel MakeToyModel(const std::vector<int64_t>& dims, uint64_t seed) {
  ToyModel m;
  m.dims = dims;
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(dims[i]));
    Matrix w = Uniform(dims[i], dims[i + 1], bound, rng);
    Matrix b = Uniform(1, dims[i + 1], bound, rng);
    m.layers.emplace_back("net" + std::to_string(i + 1), std::move(w),
                          std::move(b));
  }
  return m;
}

Batch SyntheticBatch(const ToyModel& model, int step, int64_t rows) {
  std::mt19937_64 teacher_rng(12345);
  const Matrix teacher =
      Uniform(model.dims.front(), model.dims.back(), 1.0, teacher_rng);
  std::mt19937_64 rng(1000 + static_cast<uint64_t>(step));
  Batch b;
  b.x = Uniform(rows, model.dims.front(), 1.0, rng);
  b.y = b.x * teacher + 0.01 * Uniform(rows, model.dims.back(), 1.0, rng);
  return b;
}

absl::StatusOr<double> ForwardBackward(
    ToyModel& model, vemesh::strategies::FullyShardedDataParallel* fsdp,
    const Matrix& x, const Matrix& y) {
  const size_t n = model.layers.size();
  std::vector<Matrix> in(n), pre(n);
  Matrix h = x;
  for (size_t l = 0; l < n; ++l) {
    if (fsdp) VEMESH_RETURN_IF_ERROR(fsdp->PreForward(l));
    in[l] = h;
    pre[l] = model.layers[l].Forward(h);
    h = l + 1 < n ? Matrix(pre[l].cwiseMax(0.0)) : pre[l];
    if (fsdp) VEMESH_RETURN_IF_ERROR(fsdp->PostForward(l));
  }
  const Matrix diff = h - y;
  const double rows = static_cast<double>(x.rows());
  Matrix dy = diff / rows;
  for (size_t l = n; l-- > 0;) {
    if (fsdp) VEMESH_RETURN_IF_ERROR(fsdp->PreBackward(l));
    if (l + 1 < n) {
      dy = dy.cwiseProduct((pre[l].array() > 0).cast<double>().matrix());
    }
    dy = model.layers[l].Backward(in[l], dy);
    if (fsdp) VEMESH_RETURN_IF_ERROR(fsdp->PostBackward(l));
  }
  return 0.5 * diff.squaredNorm() / rows;
}

}  // namespace hsdp
