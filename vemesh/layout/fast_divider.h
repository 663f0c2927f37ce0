// vemesh/layout/fast_divider.h
//
// Division by a divisor fixed in advance, done as one multiplication: the
// rank -> coordinate map divides by each dimension's size, and a hardware
// 64-bit division costs tens of cycles per dimension.
//
//   FastDivider by_8(8);
//   by_8.quotient(45);   // 5
//
// Exact for every dividend and divisor in [1, 2^32): the multiplier is
// ceil(2^64 / d), and for 32-bit operands the high 64 bits of the 128-bit
// product are the quotient (Lemire, Kaser and Kurz, "Faster remainder by
// direct computation", 2019). MeshLayout uses it when the whole grid has
// fewer than 2^32 ranks, and plain division otherwise.

#ifndef VEMESH_LAYOUT_FAST_DIVIDER_H_
#define VEMESH_LAYOUT_FAST_DIVIDER_H_

#include <cstdint>

namespace vemesh {

class FastDivider {
 public:
  static constexpr uint64_t kMaxOperand = uint64_t{1} << 32;

  FastDivider() = default;
  // `divisor` must be in [1, 2^32).
  explicit FastDivider(uint64_t divisor)
      : divisor_(divisor),
        // ceil(2^64 / d); for d = 1 it would wrap to 0, so d = 1 is a
        // special case in quotient().
        multiplier_(divisor > 1 ? ~uint64_t{0} / divisor + 1 : 0) {}

  // `n` must be below 2^32.
  uint64_t quotient(uint64_t n) const {
    if (divisor_ == 1) return n;
    return static_cast<uint64_t>(
        (static_cast<unsigned __int128>(multiplier_) * n) >> 64);
  }
  uint64_t divisor() const { return divisor_; }

 private:
  uint64_t divisor_ = 1;
  uint64_t multiplier_ = 0;
};

}  // namespace vemesh

#endif  // VEMESH_LAYOUT_FAST_DIVIDER_H_
