// libFuzzer target: the start of a safetensors shard file (vemesh/
// checkpoint/safetensors.h): the 8-byte header length, then the JSON
// header. The input is the file's first bytes; the file's size is the
// input's size plus a few bytes the last input byte gives (so that data
// offsets past the header can be in range).
//
// Invariants checked on every input:
//   - a rejected header is InvalidArgument with a non-empty message, and a
//     header length beyond the file or the cap is refused from the first 8
//     bytes (nothing sized by it is allocated);
//   - an accepted one starts its data at 8 + length <= file size, and every
//     tensor's data_offsets lie inside the data, their span the shape's
//     bytes; writing the tensors back with SafetensorsHeaderBytes parses to
//     the same tensors.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "fuzz_check.h"
#include "vemesh/checkpoint/safetensors.h"

namespace {

using vemesh::checkpoint::DTypeSize;
using vemesh::checkpoint::ParseSafetensors;
using vemesh::checkpoint::SafetensorsHeaderBytes;

constexpr size_t kMaxInput = 64 * 1024;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput || size == 0) return 0;
  const uint64_t file_size = size + data[size - 1];
  absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto h = ParseSafetensors(bytes, file_size, "fuzz.safetensors");
  if (!h.ok()) {
    FUZZ_CHECK(h.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(!h.status().message().empty());
    return 0;
  }
  FUZZ_CHECK(h->data_start >= 8 && h->data_start <= file_size);
  for (const auto& t : h->tensors) {
    FUZZ_CHECK(t.begin <= t.end && t.end <= file_size - h->data_start);
    unsigned __int128 n = DTypeSize(t.dtype);
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    FUZZ_CHECK(n == t.end - t.begin);
  }
  const std::string again = SafetensorsHeaderBytes(h->tensors, h->metadata);
  auto back = ParseSafetensors(
      again, again.size() + (file_size - h->data_start), "again");
  FUZZ_CHECK(back.ok());
  FUZZ_CHECK(back->tensors.size() == h->tensors.size());
  return 0;
}
