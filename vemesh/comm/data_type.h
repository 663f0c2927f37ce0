// vemesh/comm/data_type.h
//
// What a communicator's buffers hold, and how reductions combine them.
//
//   static_assert(DataTypeOf<BFloat16>() == DataType::kBFloat16);
//   size_t bytes = 1024 * SizeOf(DataType::kFloat32);        // 4096
//   absl::string_view name = DataTypeName(DataType::kInt8);  // "int8"
//   bool avg_ok = IsFloatingPoint(DataType::kInt32);         // false
//   absl::string_view op = ReduceOpName(ReduceOp::kAvg);     // "avg"
//
// Every backend carries every type: float32/64, int32/64, int8, uint8, and
// the 16-bit floats bfloat16 and float16 (half.h); the CPU backends reduce
// 16-bit floats in fp32 and round once per combining step. Reductions: sum,
// prod, min, max, avg (floating types only).

#ifndef VEMESH_COMM_DATA_TYPE_H_
#define VEMESH_COMM_DATA_TYPE_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "absl/strings/string_view.h"
#include "vemesh/comm/half.h"

namespace vemesh {

enum class DataType {
  kFloat32,
  kFloat64,
  kInt32,
  kInt64,
  kBFloat16,
  kFloat16,
  kInt8,
  kUInt8,
};
enum class ReduceOp { kSum, kProd, kMin, kMax, kAvg };

// Bytes per element; 0 for a value outside the enum.
size_t SizeOf(DataType type);
// "float32", "bfloat16", ...; "unknown" outside the enum.
absl::string_view DataTypeName(DataType type);
// "sum", "avg", ...; "unknown" outside the enum.
absl::string_view ReduceOpName(ReduceOp op);
bool IsFloatingPoint(DataType type);

// The DataType of a C++ element type, at compile time. Integers are
// matched by width and signedness, not by spelling: `long long`, `long` and
// `int64_t` are all kInt64 on LP64 (as torch's int64 is), `int` is kInt32,
// `signed char` kInt8, `unsigned char` kUInt8. Character types (plain
// `char`, whose signedness differs between platforms, `wchar_t`, `charN_t`),
// bool and unsigned integers wider than a byte have no DataType. const and
// volatile are ignored.
template <typename Element>
constexpr DataType DataTypeOf() {
  using T = std::remove_cv_t<Element>;
  constexpr bool kCharacter =
      std::is_same_v<T, char> || std::is_same_v<T, wchar_t> ||
      std::is_same_v<T, char8_t> || std::is_same_v<T, char16_t> ||
      std::is_same_v<T, char32_t>;
  constexpr bool kInteger =
      std::is_integral_v<T> && !std::is_same_v<T, bool> && !kCharacter;
  constexpr bool kSigned = std::is_signed_v<T>;
  if constexpr (std::is_same_v<T, float>) {
    return DataType::kFloat32;
  } else if constexpr (std::is_same_v<T, double>) {
    return DataType::kFloat64;
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return DataType::kBFloat16;
  } else if constexpr (std::is_same_v<T, Float16>) {
    return DataType::kFloat16;
  } else if constexpr (kInteger && kSigned && sizeof(T) == 8) {
    return DataType::kInt64;
  } else if constexpr (kInteger && kSigned && sizeof(T) == 4) {
    return DataType::kInt32;
  } else if constexpr (kInteger && kSigned && sizeof(T) == 1) {
    return DataType::kInt8;
  } else if constexpr (kInteger && !kSigned && sizeof(T) == 1) {
    return DataType::kUInt8;
  } else {
    static_assert(sizeof(T) == 0,
                  "vemesh communicators carry float, double, BFloat16, "
                  "Float16 and the signed integers of 1, 4 and 8 bytes "
                  "(int8_t, int32_t, int64_t, long long, ...) and uint8_t; "
                  "not char (its signedness is the platform's: use int8_t "
                  "or uint8_t), bool or wider unsigned integers");
    return DataType::kFloat32;
  }
}

}  // namespace vemesh

#endif  // VEMESH_COMM_DATA_TYPE_H_
