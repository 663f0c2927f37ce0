// libFuzzer target: a checkpoint's manifest.json (vemesh/checkpoint/
// manifest.h), the file every rank reads back before any shard.
//
// Invariants checked on every input:
//   - a rejected manifest is InvalidArgument with a non-empty message;
//   - an accepted one has, for every piece, a box inside its tensor's shape,
//     a length equal to the box's bytes, a byte range inside its file's
//     listed size, one CRC32C per chunk; and it survives ManifestToJson and
//     a second parse unchanged in its counts.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "fuzz_check.h"
#include "vemesh/checkpoint/manifest.h"

namespace {

using vemesh::checkpoint::BoxNumel;
using vemesh::checkpoint::CheckBox;
using vemesh::checkpoint::DTypeSize;
using vemesh::checkpoint::Manifest;
using vemesh::checkpoint::ParseManifest;

constexpr size_t kMaxInput = 64 * 1024;

void CheckAccepted(const Manifest& m) {
  FUZZ_CHECK(m.chunk_bytes >= 1);
  for (const auto& [name, t] : m.tensors) {
    for (const auto& p : t.pieces) {
      FUZZ_CHECK(CheckBox(p.box, t.shape).ok());
      FUZZ_CHECK(static_cast<uint64_t>(BoxNumel(p.box)) * DTypeSize(t.dtype) ==
                 p.length);
      auto file = m.files.find(p.file);
      FUZZ_CHECK(file != m.files.end());
      FUZZ_CHECK(p.offset <= file->second &&
                 p.length <= file->second - p.offset);
      FUZZ_CHECK(p.crc32c.size() ==
                 (p.length + m.chunk_bytes - 1) / m.chunk_bytes);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return 0;
  absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto m = ParseManifest(text, "fuzz manifest");
  if (!m.ok()) {
    FUZZ_CHECK(m.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(!m.status().message().empty());
    return 0;
  }
  CheckAccepted(*m);
  auto again = ParseManifest(vemesh::checkpoint::ManifestToJson(*m), "again");
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->step == m->step && again->files == m->files &&
             again->tensors.size() == m->tensors.size() &&
             again->metadata == m->metadata);
  return 0;
}
