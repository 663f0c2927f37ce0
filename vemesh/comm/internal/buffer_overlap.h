// vemesh/comm/internal/buffer_overlap.h
//
// Private to the comm floor: whether two byte ranges share memory (the
// argument checks refuse an operation whose send and receive buffers
// overlap where it cannot run in place; the Gloo backend decides when to
// stage a copy).

#ifndef VEMESH_COMM_INTERNAL_BUFFER_OVERLAP_H_
#define VEMESH_COMM_INTERNAL_BUFFER_OVERLAP_H_

#include <cstddef>
#include <cstdint>

namespace vemesh::comm_internal {

// True when [a, a + a_bytes) and [b, b + b_bytes) share a byte; an empty or
// null range overlaps nothing.
inline bool BuffersOverlap(const void* a, size_t a_bytes, const void* b,
                           size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return a != nullptr && b != nullptr && a_bytes > 0 && b_bytes > 0 &&
         x < y + b_bytes && y < x + a_bytes;
}

}  // namespace vemesh::comm_internal

#endif  // VEMESH_COMM_INTERNAL_BUFFER_OVERLAP_H_
