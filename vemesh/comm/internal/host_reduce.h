// vemesh/comm/internal/host_reduce.h
//
// Reduction arithmetic on host buffers: the one home of what the CPU
// backends compute themselves (Gloo for every type, MPI for the 16-bit
// floats, which MPI cannot reduce natively).
//
//   HostCombineFn combine = HostCombiner(DataType::kBFloat16, ReduceOp::kSum);
//   combine(out, a, b, n);                  // out[i] = a[i] + b[i]
//   HostDivide(out, n, DataType::kBFloat16, group_size);  // avg's last step
//
// avg combines as sum; the division by the group size comes once, at the
// end (HostDivide). Integers wrap around as two's complement instead of
// overflowing. 16-bit floats combine in float and round back once per
// step, so every CPU backend gives the same bits.

#ifndef VEMESH_COMM_INTERNAL_HOST_REDUCE_H_
#define VEMESH_COMM_INTERNAL_HOST_REDUCE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "vemesh/comm/data_type.h"
#include "vemesh/comm/half.h"

namespace vemesh {

// c[i] = a[i] op b[i] for i < n (c may alias a or b): Gloo's reduction
// signature.
using HostCombineFn = void (*)(void* c, const void* a, const void* b, size_t n);

// The combining function of `op` on elements of `type` (avg: sum's); null
// for a type or op outside the enums.
HostCombineFn HostCombiner(DataType type, ReduceOp op);

// Divides `count` elements of `type` at `data` by `n` (in float for the
// 16-bit types); integers are left alone (avg of integers is refused before
// any backend runs).
void HostDivide(void* data, size_t count, DataType type, int n);

// Calls `f(T{})` with the C++ element type of `type`; std::invalid_argument
// for a value outside the enum.
template <typename F>
void WithHostType(DataType type, F&& f) {
  switch (type) {
    case DataType::kFloat32:
      return f(float{});
    case DataType::kFloat64:
      return f(double{});
    case DataType::kInt32:
      return f(int32_t{});
    case DataType::kInt64:
      return f(int64_t{});
    case DataType::kBFloat16:
      return f(BFloat16{});
    case DataType::kFloat16:
      return f(Float16{});
    case DataType::kInt8:
      return f(int8_t{});
    case DataType::kUInt8:
      return f(uint8_t{});
  }
  throw std::invalid_argument("unknown vemesh DataType");
}

template <typename T>
constexpr bool kIsHalf =
    std::is_same_v<T, BFloat16> || std::is_same_v<T, Float16>;

// One combining step, x op y (kOp is never kAvg: avg combines as kSum).
template <typename T, ReduceOp kOp>
T HostCombineOne(T x, T y) {
  if constexpr (kIsHalf<T>) {
    return T(HostCombineOne<float, kOp>(static_cast<float>(x),
                                        static_cast<float>(y)));
  } else if constexpr (kOp == ReduceOp::kMin) {
    return std::min(x, y);
  } else if constexpr (kOp == ReduceOp::kMax) {
    return std::max(x, y);
  } else if constexpr (std::is_integral_v<T>) {
    // Unsigned int at least, so that no operand is promoted to signed int.
    using U = std::common_type_t<std::make_unsigned_t<T>, unsigned int>;
    const U a = static_cast<U>(x);
    const U b = static_cast<U>(y);
    return static_cast<T>(kOp == ReduceOp::kProd ? a * b : a + b);
  } else {
    return kOp == ReduceOp::kProd ? x * y : x + y;
  }
}

// A HostCombineFn for one element type and op.
template <typename T, ReduceOp kOp>
void HostCombine(void* c, const void* a, const void* b, size_t n) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = HostCombineOne<T, kOp>(x[i], y[i]);
}

}  // namespace vemesh

#endif  // VEMESH_COMM_INTERNAL_HOST_REDUCE_H_
