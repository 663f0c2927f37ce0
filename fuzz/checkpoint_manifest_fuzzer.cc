// libFuzzer target: a checkpoint's manifest.json (vemesh/checkpoint/
// manifest.h), the file every rank reads back before any shard.
//
// Two kinds of input:
//   - text: the input is parsed as a manifest;
//   - an edit (input starting with '!'): byte pairs (position, value) are
//     written into a valid version 2 manifest's body and the checksum is
//     recomputed, as a writer that lies consistently would; the edits that
//     still parse reach the checks behind the checksum.
// Invariants checked on every input:
//   - a rejected manifest is InvalidArgument with a non-empty message;
//   - an accepted one has, for every piece, a box inside its tensor's shape,
//     a length equal to the box's bytes, a byte range inside its file's
//     listed size, one CRC32C per chunk; the pieces of every tensor tile it
//     exactly (CheckTiling); version 2 carries a checksum that ManifestToJson
//     reproduces; and it survives ManifestToJson and a second parse
//     unchanged in its counts;
//   - an edit of the valid manifest's bytes without a recomputed checksum is
//     always refused.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "fuzz_check.h"
#include "vemesh/checkpoint/internal/crc32c.h"
#include "vemesh/checkpoint/manifest.h"

namespace {

using vemesh::checkpoint::Box;
using vemesh::checkpoint::BoxNumel;
using vemesh::checkpoint::CheckBox;
using vemesh::checkpoint::CheckTiling;
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
    std::vector<Box> boxes;
    for (const auto& p : t.pieces) boxes.push_back(p.box);
    FUZZ_CHECK(CheckTiling(boxes, t.shape).ok());
  }
}

// A valid manifest: w [4, 6] in three pieces (rows, then columns of the
// rest) over two files, a scalar and an empty tensor.
const std::string& ValidManifest() {
  static const std::string* text = [] {
    vemesh::checkpoint::Manifest m;
    m.step = 12;
    m.world_size = 2;
    m.job = "fuzz";
    m.mesh = "DP=2";
    m.metadata["data_position"] = "120";
    m.files["shard-0.safetensors"] = 400;
    m.files["shard-1.safetensors"] = 400;
    using vemesh::checkpoint::ManifestPiece;
    vemesh::checkpoint::ManifestTensor w;
    w.shape = {4, 6};
    w.pieces.push_back(ManifestPiece{
        Box{{0, 0}, {2, 6}}, "shard-0.safetensors", "w@0,0", 80, 48, {1}});
    w.pieces.push_back(ManifestPiece{
        Box{{2, 0}, {2, 3}}, "shard-1.safetensors", "w@2,0", 80, 24, {2}});
    w.pieces.push_back(ManifestPiece{
        Box{{2, 3}, {2, 3}}, "shard-1.safetensors", "w@2,3", 104, 24, {3}});
    m.tensors["w"] = w;
    vemesh::checkpoint::ManifestTensor s;
    s.pieces.push_back(
        ManifestPiece{Box{}, "shard-0.safetensors", "s@", 128, 4, {4}});
    m.tensors["s"] = s;
    vemesh::checkpoint::ManifestTensor e;
    e.shape = {0, 3};
    m.tensors["e"] = e;
    return new std::string(vemesh::checkpoint::ManifestToJson(m));
  }();
  return *text;
}

constexpr char kChecksumLine[] = ",\n \"manifest_crc32c\"";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return 0;
  absl::string_view text(reinterpret_cast<const char*>(data), size);
  std::string edited;
  if (size > 0 && data[0] == '!') {
    const std::string& valid = ValidManifest();
    const size_t body = valid.rfind(kChecksumLine);
    edited = valid.substr(0, body);
    for (size_t i = 1; i + 1 < size; i += 2) {
      edited[(data[i] * 7919u + i) % body] = static_cast<char>(data[i + 1]);
    }
    // Unsealed: always refused (unless no byte changed).
    const std::string unsealed = edited + valid.substr(body);
    if (unsealed != valid) {
      FUZZ_CHECK(!ParseManifest(unsealed, "unsealed").ok());
    }
    const uint32_t crc =
        vemesh::checkpoint::internal::Crc32c(edited.data(), edited.size());
    edited = absl::StrCat(edited, kChecksumLine, ": ", crc, "\n}\n");
    text = edited;
  }
  auto m = ParseManifest(text, "fuzz manifest");
  if (!m.ok()) {
    FUZZ_CHECK(m.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(!m.status().message().empty());
    return 0;
  }
  CheckAccepted(*m);
  FUZZ_CHECK(m->version == 1 || m->version == 2);
  auto again = ParseManifest(vemesh::checkpoint::ManifestToJson(*m), "again");
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->step == m->step && again->files == m->files &&
             again->tensors.size() == m->tensors.size() &&
             again->metadata == m->metadata);
  return 0;
}
