#include "vemesh/comm/half.h"

#include <cstring>

namespace vemesh {
namespace {

uint32_t BitsOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float FloatOf(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

}  // namespace

uint16_t FloatToBFloat16Bits(float value) {
  const uint32_t bits = BitsOf(value);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    // NaN: keep the sign, force a quiet NaN (truncation could make it inf).
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // Round to nearest even on the 16 bits dropped.
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float BFloat16BitsToFloat(uint16_t bits) {
  return FloatOf(static_cast<uint32_t>(bits) << 16);
}

uint16_t FloatToFloat16Bits(float value) {
  const uint32_t bits = BitsOf(value);
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
    const float scaled = FloatOf(magnitude) + 0.5f;
    return static_cast<uint16_t>(sign | (BitsOf(scaled) - BitsOf(0.5f)));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits.
  const uint32_t rebased = magnitude - ((127u - 15u) << 23);
  const uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rebased + rounding) >> 13));
}

float Float16BitsToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) {  // inf or NaN
    return FloatOf(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return FloatOf(sign | ((exponent + 127u - 15u) << 23) | (mantissa << 13));
}

}  // namespace vemesh
