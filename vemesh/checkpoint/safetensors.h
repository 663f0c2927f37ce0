// vemesh/checkpoint/safetensors.h
//
// The safetensors file format the shard files use, so that any safetensors
// reader opens them: 8 bytes of little-endian header length N, N bytes of
// JSON {"<name>": {"dtype": "F32", "shape": [4, 16], "data_offsets": [b, e]},
// "__metadata__": {"k": "v"}} (padded with spaces to a multiple of 8), then
// the raw little-endian data; offsets count from the end of the header.
//
//   std::vector<SafetensorsTensor> ts = {{"w", DType::kF32, {4, 16}, 0, 256}};
//   std::string head = SafetensorsHeaderBytes(ts, {{"format", "pt"}});
//   // write head, then the 256 bytes of w, to `path`; read it back:
//   absl::StatusOr<SafetensorsHeader> h = ReadSafetensorsHeader(path);
//   // h->data_start == head.size(), h->tensors[0].shape == {4, 16}
//   // (ParseSafetensors(bytes, file_size) parses bytes already read)

#ifndef VEMESH_CHECKPOINT_SAFETENSORS_H_
#define VEMESH_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "vemesh/checkpoint/dtype.h"

namespace vemesh::checkpoint {

// Larger headers are refused before anything is allocated (as the
// reference implementation does).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{100} << 20;

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // data_offsets, from the end of the header
  uint64_t end = 0;
};

struct SafetensorsHeader {
  uint64_t data_start = 0;                 // 8 + header length
  std::vector<SafetensorsTensor> tensors;  // in the JSON's key order
  std::map<std::string, std::string> metadata;
};

// The 8-byte length and the JSON header (space-padded to a multiple of 8)
// for `tensors`, whose offsets the caller chose.
std::string SafetensorsHeaderBytes(
    const std::vector<SafetensorsTensor>& tensors,
    const std::map<std::string, std::string>& metadata);

// Parses a file's start: `bytes` holds at least the 8-byte length and the
// header; `file_size` is the whole file's. InvalidArgument, naming `what`,
// for a length beyond the file or kMaxSafetensorsHeaderBytes, bad JSON, an
// unknown dtype, a shape whose byte size differs from its data_offsets, or
// offsets beyond the file.
absl::StatusOr<SafetensorsHeader> ParseSafetensors(
    absl::string_view bytes, uint64_t file_size,
    absl::string_view what = "safetensors file");
// Reads and parses the header of the file at `path` (the length is bounded
// by the file's size before the header is read).
absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(
    const std::string& path);

}  // namespace vemesh::checkpoint

#endif  // VEMESH_CHECKPOINT_SAFETENSORS_H_
