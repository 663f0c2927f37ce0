// libFuzzer target: the store handshake's field parser (ParseHelloFields,
// vemesh/rendezvous/tcp/wire.h), which reads HELLO/AUTH fields from any
// client before it is authenticated, and SHA-256/HMAC on arbitrary bytes.
//
// The input is split at '\n' into fields. Invariants checked on every input
// (a violation aborts, which libFuzzer reports as a crash):
//   - a refusal says why; an accepted set of fields has hex-only, bounded
//     claim/nonce/proof/owner and a rank in [-1, 2^24];
//   - HelloFields of what was parsed parses back to the same fields (the
//     client's encoder and the server's parser agree);
//   - SHA-256 and HMAC give 32 bytes, the same twice, and a proof compares
//     equal to itself and unequal to itself with one bit flipped.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "fuzz_check.h"
#include "vemesh/rendezvous/tcp/sha256.h"
#include "vemesh/rendezvous/tcp/wire.h"

namespace {

bool IsHex(absl::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return s.size() <= 128;
}

bool Same(const vemesh::StoreHello& a, const vemesh::StoreHello& b) {
  return a.job == b.job && a.rank == b.rank && a.claim == b.claim &&
         a.nonce == b.nonce && a.proof == b.proof && a.owner == b.owner &&
         a.refused == b.refused;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  const std::vector<std::string> fields = absl::StrSplit(bytes, '\n');
  const auto parsed = vemesh::ParseHelloFields(fields);
  if (!parsed.ok()) {
    FUZZ_CHECK(!parsed.status().message().empty());
  } else {
    FUZZ_CHECK(IsHex(parsed->claim) && IsHex(parsed->nonce) &&
               IsHex(parsed->proof) && IsHex(parsed->owner));
    FUZZ_CHECK(parsed->rank >= -1 && parsed->rank <= (int64_t{1} << 24));
    const auto again = vemesh::ParseHelloFields(vemesh::HelloFields(*parsed));
    FUZZ_CHECK(again.ok());
    FUZZ_CHECK(Same(*parsed, *again));
  }
  const absl::string_view key = bytes.substr(0, bytes.size() / 2);
  const absl::string_view message = bytes.substr(bytes.size() / 2);
  const std::string digest = vemesh::Sha256(bytes);
  FUZZ_CHECK(digest.size() == vemesh::kSha256Bytes);
  FUZZ_CHECK(digest == vemesh::Sha256(bytes));
  std::string mac = vemesh::HmacSha256(key, message);
  FUZZ_CHECK(mac.size() == vemesh::kSha256Bytes);
  FUZZ_CHECK(vemesh::ConstantTimeEquals(mac, vemesh::HmacSha256(key, message)));
  const std::string same = mac;
  mac[size % mac.size()] ^= 1;
  FUZZ_CHECK(!vemesh::ConstantTimeEquals(mac, same));
  return 0;
}
