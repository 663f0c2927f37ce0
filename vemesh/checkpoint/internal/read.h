// vemesh/checkpoint/internal/read.h
//
// The read side of Load without its collective part, for the tools that
// read a checkpoint in one process (export.h).
//
//   VEMESH_ASSIGN_OR_RETURN(CheckpointManifest found, ReadManifest(dir));
//   VEMESH_RETURN_IF_ERROR(FillFromManifest(state, found));

#ifndef VEMESH_CHECKPOINT_INTERNAL_READ_H_
#define VEMESH_CHECKPOINT_INTERNAL_READ_H_

#include <cstdint>

#include "absl/status/status.h"
#include "vemesh/checkpoint/checkpoint.h"
#include "vemesh/checkpoint/state_dict.h"

namespace vemesh::checkpoint::internal {

// Fills every piece of `state` from the checkpoint `found` (its manifest
// parsed and checked): each piece's chunks read once, CRC32C-checked,
// copied. Errors as Load's, on this process only.
absl::Status FillFromManifest(StateDict& state,
                              const CheckpointManifest& found);

// A collective load exchanges the chunks in rounds of about this many bytes
// per rank (default 16 MiB); 0 restores the default. For tests, which need
// many rounds from small tensors. Every rank must set the same value.
void SetLoadRoundBytes(uint64_t bytes_per_rank);

}  // namespace vemesh::checkpoint::internal

#endif  // VEMESH_CHECKPOINT_INTERNAL_READ_H_
