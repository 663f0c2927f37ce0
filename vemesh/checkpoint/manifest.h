// vemesh/checkpoint/manifest.h
//
// manifest.json, a checkpoint's table of contents and its commit point: the
// step, the saving world's size, the owning job, the saving mesh, the
// metadata, each shard file's size, and for each tensor its dtype, global
// shape and pieces (box, file, byte range in the file, one CRC32C per
// `chunk_bytes` of the piece's bytes).
//
//   {"format": "vemesh-checkpoint", "version": 2, "step": 100,
//    "world_size": 4, "chunk_bytes": 1048576, "job": "pretrain-7b",
//    "mesh": "DP=2,TP=2", "metadata": {"k": "v"},
//    "files": {"shard-0.safetensors": 1096},
//    "tensors": {"w": {"dtype": "F32", "shape": [16, 16], "pieces": [
//      {"offsets": [0, 0], "lengths": [4, 16], "file": "shard-0.safetensors",
//       "key": "w@0,0", "offset": 72, "length": 256, "crc32c": [123]}]}},
//    "manifest_crc32c": 3735928559}
//
//   absl::StatusOr<Manifest> m = ParseManifest(text, "step-100/manifest.json");
//   std::string again = ManifestToJson(*m);
//
// A manifest cannot lie (version 2): its last member, "manifest_crc32c", is
// the CRC32C of every byte of the file before the ",\n" that precedes it,
// so one flipped bit anywhere is refused; a key repeated in one object, a
// key the format does not define, and pieces that do not tile their tensor
// exactly (two that overlap, or elements none holds) are refused before any
// shard byte is read. Version 1 manifests (no checksum, job or mesh) still
// parse, with every other check.

#ifndef VEMESH_CHECKPOINT_MANIFEST_H_
#define VEMESH_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "vemesh/checkpoint/box.h"
#include "vemesh/checkpoint/dtype.h"

namespace vemesh::checkpoint {

// Larger manifests are refused before they are read.
inline constexpr uint64_t kMaxManifestBytes = uint64_t{256} << 20;
inline constexpr uint64_t kDefaultChunkBytes = uint64_t{1} << 20;

struct ManifestPiece {
  Box box;
  std::string file;              // a shard file's name, in the step directory
  std::string key;               // its name in that file's safetensors header
  uint64_t offset = 0;           // from the start of the file
  uint64_t length = 0;           // BoxNumel(box) * DTypeSize(dtype)
  std::vector<uint32_t> crc32c;  // one per chunk_bytes of [offset, +length)
};

struct ManifestTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<ManifestPiece> pieces;
};

struct Manifest {
  int64_t version = 2;  // what ParseManifest read; ManifestToJson writes 2
  int64_t step = 0;
  int64_t world_size = 1;
  uint64_t chunk_bytes = kDefaultChunkBytes;
  std::string job;   // the job that saved it (printable ASCII); "" in v1
  std::string mesh;  // the saving mesh, as the job described it, or ""
  std::map<std::string, std::string> metadata;
  std::map<std::string, uint64_t> files;  // name -> size in bytes
  std::map<std::string, ManifestTensor> tensors;
};

// Version 2 text, "manifest_crc32c" last.
std::string ManifestToJson(const Manifest& manifest);
// Parses and checks: the manifest's own CRC32C (version 2; required there),
// no repeated or unknown keys, every box inside its tensor's shape, the
// pieces of each tensor tiling it exactly, every piece's length its box's
// bytes, its byte range inside its file's size and apart from every other
// piece's, its file listed (a plain name, no '/'), as many checksums as
// chunks. Errors are InvalidArgument naming `what` and the tensor.
absl::StatusOr<Manifest> ParseManifest(absl::string_view text,
                                       absl::string_view what = "manifest");

}  // namespace vemesh::checkpoint

#endif  // VEMESH_CHECKPOINT_MANIFEST_H_
