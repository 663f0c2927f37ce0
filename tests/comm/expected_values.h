// The element values the communicator tests (MPI, Gloo) send and check
// against: what rank `r` contributes at index `i`, from a formula every rank
// evaluates on its own, and the reduction of those contributions over a
// group as the backends define it. The inputs are small integers, so that
// every result is exact in every element type (bfloat16's 8 significant bits
// and int8 included) for groups of up to 8 ranks, and can be compared with ==.
#ifndef TESTS_COMM_EXPECTED_VALUES_H_
#define TESTS_COMM_EXPECTED_VALUES_H_

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "vemesh/comm/communicator.h"

namespace vemesh::testing {

template <typename T>
constexpr bool kHalf =
    std::is_same_v<T, BFloat16> || std::is_same_v<T, Float16>;

// An element of type T holding `v`, and back (16-bit floats through float).
template <typename T>
T From(double v) {
  if constexpr (kHalf<T>) {
    return T(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}
template <typename T>
double To(T v) {
  if constexpr (kHalf<T>) {
    return static_cast<float>(v);
  } else {
    return static_cast<double>(v);
  }
}

// Equality of element values: the 16-bit types compare by value; `want` is
// an element or a double.
#define EXPECT_VALUE(got, want) \
  EXPECT_EQ(::vemesh::testing::To(got), ::vemesh::testing::To(want))

// What rank `r` contributes at index `i`: small integers (mixed signs where
// the type has them), so that sums over 8 ranks are exact in every type.
template <typename T>
double Value(int r, size_t i) {
  const int v = (r * 7 + static_cast<int>(i) * 3) % 11;
  return std::is_unsigned_v<T> ? v : v - 5;
}
// For prod: magnitudes 1 or 2 (2 for every second rank), negative for every
// third where the type has signs, so that a product over 8 ranks is at most
// 2^4 in magnitude: within int8, and exact everywhere.
template <typename T>
double ProdValue(int r, size_t i) {
  const int k = r + static_cast<int>(i);
  const double m = 1 + k % 2;
  return (!std::is_unsigned_v<T> && k % 3 == 0) ? -m : m;
}
template <typename T>
double Input(ReduceOp op, int r, size_t i) {
  return op == ReduceOp::kProd ? ProdValue<T>(r, i) : Value<T>(r, i);
}

// Rank `r`'s inputs to `op` at indices first, ..., first + n - 1.
template <typename T>
std::vector<T> Inputs(ReduceOp op, int r, size_t n, size_t first = 0) {
  std::vector<T> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = From<T>(Input<T>(op, r, first + i));
  return out;
}
// The same for every operation but prod: Value(r, first + k).
template <typename T>
std::vector<T> Values(int r, size_t n, size_t first = 0) {
  return Inputs<T>(ReduceOp::kSum, r, n, first);
}

// The reduction over `size` ranks at index `i`, as the backends define it:
// exact for these inputs; avg divides the (exact) sum in the precision the
// backends document (float for every type but double).
template <typename T>
double Expected(ReduceOp op, int size, size_t i) {
  double acc = Input<T>(op, 0, i);
  for (int r = 1; r < size; ++r) {
    const double v = Input<T>(op, r, i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += v;
        break;
      case ReduceOp::kProd:
        acc *= v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
    }
  }
  if (op != ReduceOp::kAvg) return acc;
  if constexpr (std::is_same_v<T, double>) {
    return acc / size;
  } else {
    return To(From<T>(static_cast<float>(acc) / static_cast<float>(size)));
  }
}

// Every operation the element type takes: avg only for floating point.
template <typename T>
std::vector<ReduceOp> OpsOf() {
  std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin,
                               ReduceOp::kMax};
  if (IsFloatingPoint(DataTypeOf<T>())) ops.push_back(ReduceOp::kAvg);
  return ops;
}

}  // namespace vemesh::testing

#endif  // TESTS_COMM_EXPECTED_VALUES_H_
