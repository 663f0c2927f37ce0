#include "vemesh/comm/internal/host_reduce.h"

namespace vemesh {
namespace {

template <typename T>
HostCombineFn CombinerOf(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return &HostCombine<T, ReduceOp::kSum>;
    case ReduceOp::kProd:
      return &HostCombine<T, ReduceOp::kProd>;
    case ReduceOp::kMax:
      return &HostCombine<T, ReduceOp::kMax>;
    case ReduceOp::kMin:
      return &HostCombine<T, ReduceOp::kMin>;
  }
  return nullptr;
}

template <typename T>
void DivideAll(void* data, size_t count, int n) {
  T* x = static_cast<T*>(data);
  if constexpr (std::is_floating_point_v<T>) {
    for (size_t i = 0; i < count; ++i) x[i] /= static_cast<T>(n);
  } else if constexpr (kIsHalf<T>) {
    for (size_t i = 0; i < count; ++i) {
      x[i] = T(static_cast<float>(x[i]) / static_cast<float>(n));
    }
  }
}

}  // namespace

HostCombineFn HostCombiner(DataType type, ReduceOp op) {
  if (SizeOf(type) == 0) return nullptr;
  HostCombineFn out = nullptr;
  WithHostType(type, [&](auto zero) { out = CombinerOf<decltype(zero)>(op); });
  return out;
}

void HostDivide(void* data, size_t count, DataType type, int n) {
  if (SizeOf(type) == 0 || count == 0) return;
  WithHostType(type,
               [&](auto zero) { DivideAll<decltype(zero)>(data, count, n); });
}

}  // namespace vemesh
