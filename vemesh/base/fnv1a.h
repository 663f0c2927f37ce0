// vemesh/base/fnv1a.h
//
// FNV-1a, 64 bits: a hash that is the same on every process and host, for
// comparing small things across ranks in one number (names, shapes, count
// lists). absl::Hash cannot serve: it is seeded per process.
//
//   uint64_t h = Fnv1a("layer0.weight");
//   h = Fnv1aWord(rows, h);
//
// It goes one byte at a time (a few hundred MB/s): large buffers are
// hashed by vemesh/elastic/replica_state.h's Fingerprint64 instead.

#ifndef VEMESH_BASE_FNV1A_H_
#define VEMESH_BASE_FNV1A_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace vemesh {

inline constexpr uint64_t kFnv1aOffset = 1469598103934665603ull;
inline constexpr uint64_t kFnv1aPrime = 1099511628211ull;

// `bytes` folded into `h` (the offset basis for a fresh hash).
inline uint64_t Fnv1a(absl::string_view bytes, uint64_t h = kFnv1aOffset) {
  for (unsigned char c : bytes) h = (h ^ c) * kFnv1aPrime;
  return h;
}

// The eight bytes of `value`, least significant first (the same on hosts of
// either byte order).
inline uint64_t Fnv1aWord(uint64_t value, uint64_t h = kFnv1aOffset) {
  for (int i = 0; i < 8; ++i)
    h = (h ^ ((value >> (8 * i)) & 0xff)) * kFnv1aPrime;
  return h;
}

}  // namespace vemesh

#endif  // VEMESH_BASE_FNV1A_H_
