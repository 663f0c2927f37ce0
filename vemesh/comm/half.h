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

namespace vemesh {

uint16_t FloatToBFloat16Bits(float value);
float BFloat16BitsToFloat(uint16_t bits);
uint16_t FloatToFloat16Bits(float value);
float Float16BitsToFloat(uint16_t bits);

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

}  // namespace vemesh

#endif  // VEMESH_COMM_HALF_H_
