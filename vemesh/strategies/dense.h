// vemesh/strategies/dense.h
//
// The dense types the strategies compute with: Eigen matrices of doubles.
//
//   Matrix x(batch, features);           // one sample per row
//   absl::Span<double> s = AsSpan(x);    // hand it to a Communicator
//
// Row-major on purpose: one sample is one contiguous row, so a batch split by
// rows (data parallel, micro-batches) is a plain sub-range of memory, and a
// whole matrix travels through a communicator as one span. Doubles on
// purpose: the strategies are checked against a serial reference to 1e-6
// relative, which float32 summation-order noise would blur.

#ifndef VEMESH_STRATEGIES_DENSE_H_
#define VEMESH_STRATEGIES_DENSE_H_

#include <Eigen/Dense>

#include "absl/types/span.h"

namespace vemesh::strategies {

using Matrix =
    Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

inline absl::Span<double> AsSpan(Matrix& m) {
  return absl::MakeSpan(m.data(), static_cast<size_t>(m.size()));
}
inline absl::Span<const double> AsConstSpan(const Matrix& m) {
  return absl::MakeConstSpan(m.data(), static_cast<size_t>(m.size()));
}

// y = x * weight + bias, with `bias` a 1 x out row added to every row.
inline Matrix AffineForward(const Matrix& x, const Matrix& weight,
                            const Matrix& bias) {
  Matrix y = x * weight;
  y.rowwise() += bias.row(0);
  return y;
}

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_DENSE_H_
