// vemesh/checkpoint/inspect.h
//
// What a checkpoint directory holds, and whether every byte of a checkpoint
// is what its manifest says: `vemesh checkpoint inspect DIR`.
//
//   std::ostringstream report;
//   absl::Status s = InspectCheckpoint("/ckpt", std::nullopt, report);
//   // report: the owner, every step directory (step, committed, job,
//   // which `latest` names), then the chosen checkpoint's step, job, mesh,
//   // world size, metadata and tensors (dtype, shape, pieces), and one
//   // line per bad chunk or shard; s: OK when every CRC32C matched.
//
// Not collective. Every piece is read whole, chunk by chunk, in reads of at
// most 8 MiB (memory stays bounded), and each chunk's CRC32C compared with
// the manifest's: a mismatch is listed as
//   BAD chunk: tensor 'w' piece [4:8, 0:12] in 'shard-1.safetensors' bytes
//   [2048, +192): CRC32C 123, the manifest says 456
// and the status is DataLoss naming the first such chunk (and how many).

#ifndef VEMESH_CHECKPOINT_INSPECT_H_
#define VEMESH_CHECKPOINT_INSPECT_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace vemesh::checkpoint {

// Lists `dir` and verifies the checkpoint Load would read (given `step`,
// the newest committed directory of that step) into `out`. NotFound when
// there is none; the manifest's error for a damaged one; DataLoss when a
// shard is missing, truncated or has a chunk whose CRC32C differs (each
// listed in `out`).
absl::Status InspectCheckpoint(const std::string& dir,
                               std::optional<int64_t> step, std::ostream& out);

}  // namespace vemesh::checkpoint

#endif  // VEMESH_CHECKPOINT_INSPECT_H_
