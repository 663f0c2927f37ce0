// vemesh/rendezvous/tcp/sha256.h
//
// SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104), for the store's
// challenge-response: a shared token proves itself without crossing the
// wire.
//
//   std::string digest = Sha256("abc");               // 32 raw bytes
//   std::string mac = HmacSha256("key", "message");    // 32 raw bytes
//   bool same = ConstantTimeEquals(mac, received);     // no early exit
//   std::string text = HexText(mac);                   // 64 hex digits

#ifndef VEMESH_RENDEZVOUS_TCP_SHA256_H_
#define VEMESH_RENDEZVOUS_TCP_SHA256_H_

#include <string>

#include "absl/strings/string_view.h"

namespace vemesh {

inline constexpr size_t kSha256Bytes = 32;

std::string Sha256(absl::string_view data);
std::string HmacSha256(absl::string_view key, absl::string_view message);

// Compares every byte whatever the first difference, so that the time taken
// says nothing about how much of a proof was right.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// Lower-case hex of the bytes.
std::string HexText(absl::string_view bytes);

// `bytes` random bytes from the kernel (getrandom; /dev/urandom otherwise).
std::string RandomBytes(size_t bytes);

}  // namespace vemesh

#endif  // VEMESH_RENDEZVOUS_TCP_SHA256_H_
