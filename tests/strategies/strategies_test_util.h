// Shared helpers of the strategy tests: registry set-up, deterministic
// matrices (the same on every rank) and a relative comparison.
#ifndef TESTS_STRATEGIES_STRATEGIES_TEST_UTIL_H_
#define TESTS_STRATEGIES_STRATEGIES_TEST_UTIL_H_

#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "job_world.h"
#include "vemesh/registry/ve_device_mesh.h"
#include "vemesh/strategies/dense.h"

namespace vemesh::strategies::testing {

inline int WorldSize() { return vemesh::testing::JobSize(); }
inline int WorldRank() { return vemesh::testing::JobRank(); }

// (Re-)initialises VESCALE_DEVICE_MESH; every rank calls it alike.
inline ::testing::AssertionResult InitMesh(std::vector<int64_t> shape,
                                           std::vector<std::string> names) {
  absl::StatusOr<DeviceMesh> mesh =
      VESCALE_DEVICE_MESH.init_device_mesh("cpu", shape, names);
  if (mesh.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << mesh.status();
}

// A rows x cols matrix of smooth, distinct values fixed by `salt`.
inline Matrix Deterministic(int64_t rows, int64_t cols, double salt) {
  Matrix m(rows, cols);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      m(i, j) = std::sin(salt + 0.37 * i + 0.91 * j + 0.013 * i * j);
    }
  }
  return m;
}

// |got - want| <= rel * max|want| element-wise (max|want| floored at 1e-12).
inline ::testing::AssertionResult Close(const Matrix& got, const Matrix& want,
                                        double rel = 1e-6) {
  if (got.rows() != want.rows() || got.cols() != want.cols()) {
    return ::testing::AssertionFailure()
           << "shape " << got.rows() << "x" << got.cols() << " vs "
           << want.rows() << "x" << want.cols();
  }
  if (want.size() == 0) return ::testing::AssertionSuccess();  // no max of none
  const double scale = std::max(want.cwiseAbs().maxCoeff(), 1e-12);
  const double diff = (got - want).cwiseAbs().maxCoeff();
  if (diff <= rel * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "max difference " << diff << " > " << rel << " * " << scale;
}

}  // namespace vemesh::strategies::testing

#endif  // TESTS_STRATEGIES_STRATEGIES_TEST_UTIL_H_
