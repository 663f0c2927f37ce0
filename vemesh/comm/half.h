// vemesh/comm/half.h
//
// The two 16-bit floating-point element types of mixed-precision training,
// as host values: `BFloat16` (8 exponent bits, as fp32; 7 mantissa bits) and
// `Float16` (IEEE binary16). They only store bits and convert to and from
// float; arithmetic is done in float. Conversions round to nearest, ties to
// even, and keep NaN a NaN (as CUDA's __float2bfloat16 / __float2half).
//
//   std::vector<BFloat16> grad(n, BFloat16(0.5f));
//   comm->all_reduce(absl::MakeSpan(grad), ReduceOp::kSum);   // fp32 inside
//   float g = static_cast<float>(grad[0]);

#ifndef VEMESH_COMM_HALF_H_
#define VEMESH_COMM_HALF_H_

#include <cstdint>
#include <cstring>

namespace vemesh {

// Bits <-> float, rounding to nearest even (defined inline below, so that
// reduction loops over 16-bit buffers vectorise).
inline uint16_t FloatToBFloat16Bits(float value);
inline float BFloat16BitsToFloat(uint16_t bits);
inline uint16_t FloatToFloat16Bits(float value);
inline float Float16BitsToFloat(uint16_t bits);

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float value) : bits(FloatToBFloat16Bits(value)) {}
  explicit operator float() const { return BFloat16BitsToFloat(bits); }
  static BFloat16 FromBits(uint16_t b) {
    BFloat16 x;
    x.bits = b;
    return x;
  }
};

struct Float16 {
  uint16_t bits = 0;
  Float16() = default;
  explicit Float16(float value) : bits(FloatToFloat16Bits(value)) {}
  explicit operator float() const { return Float16BitsToFloat(bits); }
  static Float16 FromBits(uint16_t b) {
    Float16 x;
    x.bits = b;
    return x;
  }
};

static_assert(sizeof(BFloat16) == 2 && sizeof(Float16) == 2);

// -- Implementation -----------------------------------------------------------

namespace half_internal {

inline uint32_t BitsOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float FloatOf(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

}  // namespace half_internal

inline uint16_t FloatToBFloat16Bits(float value) {
  const uint32_t bits = half_internal::BitsOf(value);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    // NaN: keep the sign, force a quiet NaN (truncation could make it inf).
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // Round to nearest even on the 16 bits dropped.
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

inline float BFloat16BitsToFloat(uint16_t bits) {
  return half_internal::FloatOf(static_cast<uint32_t>(bits) << 16);
}

inline uint16_t FloatToFloat16Bits(float value) {
  const uint32_t bits = half_internal::BitsOf(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {  // inf or NaN
    return magnitude == 0x7f800000u ? static_cast<uint16_t>(sign | 0x7c00u)
                                    : static_cast<uint16_t>(sign | 0x7e00u);
  }
  // 65520 and above round to infinity in binary16.
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (magnitude < 0x38800000u) {
    // Below the smallest normal (2^-14): a subnormal, rounded to a multiple
    // of 2^-24. Adding 0.5 makes the FPU do the round-to-nearest-even.
    const float scaled = half_internal::FloatOf(magnitude) + 0.5f;
    return static_cast<uint16_t>(
        sign | (half_internal::BitsOf(scaled) - half_internal::BitsOf(0.5f)));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits.
  const uint32_t rebased = magnitude - ((127u - 15u) << 23);
  const uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rebased + rounding) >> 13));
}

inline float Float16BitsToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) {  // inf or NaN
    return half_internal::FloatOf(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return half_internal::FloatOf(sign | ((exponent + 127u - 15u) << 23) |
                                (mantissa << 13));
}

}  // namespace vemesh

#endif  // VEMESH_COMM_HALF_H_
