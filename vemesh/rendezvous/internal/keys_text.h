// vemesh/rendezvous/internal/keys_text.h
//
// Private to the rendezvous floor: how a store names several keys in an
// error text (the TCP and Redis stores say the same thing the same way).

#ifndef VEMESH_RENDEZVOUS_INTERNAL_KEYS_TEXT_H_
#define VEMESH_RENDEZVOUS_INTERNAL_KEYS_TEXT_H_

#include <cstddef>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"

namespace vemesh::rendezvous_internal {

// At most this many keys are named; the rest are counted.
inline constexpr size_t kKeysNamed = 8;

// "a, b, c" or "k0, ..., k7, ... (20 keys)".
inline std::string KeysText(absl::Span<const std::string> keys) {
  if (keys.size() <= kKeysNamed) return absl::StrJoin(keys, ", ");
  return absl::StrCat(absl::StrJoin(keys.subspan(0, kKeysNamed), ", "),
                      ", ... (", keys.size(), " keys)");
}

}  // namespace vemesh::rendezvous_internal

#endif  // VEMESH_RENDEZVOUS_INTERNAL_KEYS_TEXT_H_
