// Every mesh shape of 1 to 3 dimensions and at most 48 ranks (sizes up to 6,
// the third up to 4): the shapes exhaustive layout and placement tests walk.
#ifndef TESTS_COMMON_SMALL_SHAPES_H_
#define TESTS_COMMON_SMALL_SHAPES_H_

#include <cstdint>
#include <vector>

namespace vemesh::testing {

inline std::vector<std::vector<int64_t>> SmallShapes() {
  std::vector<std::vector<int64_t>> out;
  for (int64_t a = 1; a <= 6; ++a) {
    out.push_back({a});
    for (int64_t b = 1; b <= 6; ++b) {
      out.push_back({a, b});
      for (int64_t c = 1; c <= 4; ++c) {
        if (a * b * c <= 48) out.push_back({a, b, c});
      }
    }
  }
  return out;
}

}  // namespace vemesh::testing

#endif  // TESTS_COMMON_SMALL_SHAPES_H_
