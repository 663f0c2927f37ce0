// libFuzzer target: ParseRequest and ParseReply (vemesh/rendezvous/tcp/
// wire.h) on arbitrary bytes, as a TcpStoreServer (requests) and a TcpStore
// (replies) receive them from the network.
//
// Invariants checked on every input (a violation aborts, which libFuzzer
// reports as a crash with the input saved):
//   - incomplete only while the announced frame is in bounds and not all
//     there; malformed always says why;
//   - a complete request is within the store's bounds (keys 1..4096 bytes,
//     at most 65536 of them, values at most 64 MiB), and encoding it again
//     gives exactly the bytes consumed (the encoding is canonical), so
//     nothing the parser accepts is refused by the client's encoder;
//   - any strict prefix of a complete frame is incomplete;
//   - the same for replies.
// AddressSanitizer catches any read past the input; an allocation sized by
// an unchecked length would exceed -rss_limit_mb / -malloc_limit_mb.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "fuzz_check.h"
#include "vemesh/rendezvous/store.h"
#include "vemesh/rendezvous/tcp/wire.h"

namespace {

using vemesh::kMaxStoreFrameBytes;
using vemesh::kStoreFrameHeaderBytes;

// The frame length the header announces; the oracle for kIncomplete.
void CheckIncomplete(absl::string_view bytes) {
  if (bytes.size() < kStoreFrameHeaderBytes) return;
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) {
    n |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  }
  FUZZ_CHECK(n > 0 && n <= kMaxStoreFrameBytes);
  FUZZ_CHECK(bytes.size() - kStoreFrameHeaderBytes < n);
}

void CheckRequest(absl::string_view bytes) {
  const vemesh::ParsedRequest p = vemesh::ParseRequest(bytes);
  switch (p.outcome) {
    case vemesh::ParsedRequest::kIncomplete:
      CheckIncomplete(bytes);
      return;
    case vemesh::ParsedRequest::kMalformed:
      FUZZ_CHECK(!p.error.empty());
      return;
    case vemesh::ParsedRequest::kComplete:
      break;
  }
  FUZZ_CHECK(p.consumed > kStoreFrameHeaderBytes && p.consumed <= bytes.size());
  FUZZ_CHECK(vemesh::CheckStoreKeys(p.message.keys).ok());
  FUZZ_CHECK(p.message.value.size() <= vemesh::kMaxStoreValueBytes);
  FUZZ_CHECK(p.message.expected.size() <= vemesh::kMaxStoreValueBytes);
  FUZZ_CHECK(p.message.timeout_ms >= 0);
  const absl::StatusOr<std::string> again = vemesh::EncodeRequest(p.message);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(*again == bytes.substr(0, p.consumed));
  FUZZ_CHECK(vemesh::ParseRequest(bytes.substr(0, p.consumed - 1)).outcome ==
             vemesh::ParsedRequest::kIncomplete);
}

void CheckReply(absl::string_view bytes) {
  const vemesh::ParsedReply p = vemesh::ParseReply(bytes);
  switch (p.outcome) {
    case vemesh::ParsedReply::kIncomplete:
      CheckIncomplete(bytes);
      return;
    case vemesh::ParsedReply::kMalformed:
      FUZZ_CHECK(!p.error.empty());
      return;
    case vemesh::ParsedReply::kComplete:
      break;
  }
  FUZZ_CHECK(p.consumed > kStoreFrameHeaderBytes && p.consumed <= bytes.size());
  FUZZ_CHECK(p.message.values.size() <= vemesh::kMaxStoreKeysPerCall);
  FUZZ_CHECK(p.message.message.size() <= vemesh::kMaxStoreMessageBytes);
  FUZZ_CHECK(vemesh::EncodeReply(p.message) == bytes.substr(0, p.consumed));
  FUZZ_CHECK(vemesh::ParseReply(bytes.substr(0, p.consumed - 1)).outcome ==
             vemesh::ParsedReply::kIncomplete);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  CheckRequest(bytes);
  CheckReply(bytes);
  return 0;
}
