// vemesh/checkpoint/export.h
//
// A checkpoint out as plain tensors: every tensor of one checkpoint, whole,
// under its name, in one safetensors file that any reader opens without
// vemesh (the Python `safetensors` package, torch, numpy, or 20 lines of
// struct and json: tests/checkpoint/read_export_test.py).
//
//   absl::StatusOr<ExportResult> r =
//       ExportSafetensors("/ckpt", "/out/model.safetensors");
//   // r->step, r->tensors, r->bytes; `vemesh checkpoint export DIR OUT`
//
// The file: the tensors in name order, each row-major little-endian at the
// data_offsets its header entry gives; "__metadata__" holds the
// checkpoint's metadata, plus "format": "pt" and "vemesh.step",
// "vemesh.job", "vemesh.mesh", "vemesh.source" (the step directory).
// Not collective: one process reads the checkpoint (every chunk's CRC32C
// checked) in windows of 64 MiB, so memory stays bounded whatever the
// tensors' sizes, and writes <out>.tmp, fsyncs it and renames it to <out>.

#ifndef VEMESH_CHECKPOINT_EXPORT_H_
#define VEMESH_CHECKPOINT_EXPORT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace vemesh::checkpoint {

struct ExportResult {
  std::string path;  // the step directory read
  int64_t step = 0;
  int64_t tensors = 0;
  uint64_t bytes = 0;  // of tensor data written
};

// The checkpoint Load would read from `dir` (given `step`, the newest
// committed directory of that step), written to `out`. Errors name the
// file: no checkpoint, a damaged manifest or shard (a checksum mismatch
// names the tensor, piece and byte range), an output that cannot be
// written (nothing is left at `out` then).
absl::StatusOr<ExportResult> ExportSafetensors(
    const std::string& dir, const std::string& out,
    std::optional<int64_t> step = std::nullopt);

}  // namespace vemesh::checkpoint

#endif  // VEMESH_CHECKPOINT_EXPORT_H_
