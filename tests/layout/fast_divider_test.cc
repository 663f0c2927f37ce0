#include "vemesh/layout/fast_divider.h"

#include <random>

#include "gtest/gtest.h"

namespace vemesh {
namespace {

TEST(FastDividerTest, MatchesHardwareDivision) {
  std::mt19937_64 rng(1);
  std::vector<uint64_t> divisors;
  for (uint64_t d = 1; d <= 2048; ++d) divisors.push_back(d);
  for (int i = 0; i < 2000; ++i) divisors.push_back(1 + rng() % 0xFFFFFFFFull);
  divisors.push_back(0xFFFFFFFFull);
  divisors.push_back(1ull << 31);
  for (uint64_t d : divisors) {
    const FastDivider div(d);
    for (uint64_t n : std::vector<uint64_t>{
             0, 1, d - 1, d, d + 1, 2 * d - 1, 0xFFFFFFFFull, 0xFFFFFFFEull,
             (0xFFFFFFFFull / d) * d, (0xFFFFFFFFull / d) * d - 1}) {
      if (n > 0xFFFFFFFFull) continue;
      ASSERT_EQ(div.quotient(n), n / d) << n << " / " << d;
    }
    for (int i = 0; i < 200; ++i) {
      const uint64_t n = rng() & 0xFFFFFFFFull;
      ASSERT_EQ(div.quotient(n), n / d) << n << " / " << d;
    }
  }
}

}  // namespace
}  // namespace vemesh
