// tools/checkpoint/checkpoint_command.h
//
// `vemesh checkpoint`: a checkpoint directory read in one process, no job.
//
//   vemesh checkpoint inspect DIR [--step S]
//       the owner, the step directories, the checkpoint's step, job, mesh,
//       metadata and tensors; every chunk's CRC32C verified (exit 1 naming
//       each bad chunk)
//   vemesh checkpoint export DIR OUT.safetensors [--step S]
//       every tensor whole, under its name, in one safetensors file
//
//   int code = RunCheckpointCommand({"inspect", "/ckpt"}, std::cout,
//                                   std::cerr);
//
// Library calls: vemesh/checkpoint/inspect.h and export.h.

#ifndef TOOLS_CHECKPOINT_CHECKPOINT_COMMAND_H_
#define TOOLS_CHECKPOINT_CHECKPOINT_COMMAND_H_

#include <ostream>
#include <string>

#include "absl/types/span.h"

namespace vemesh::checkpoint_tool {

inline constexpr int kExitOk = 0;
inline constexpr int kExitBad = 1;  // a damaged checkpoint or an I/O error
inline constexpr int kExitUsage = 2;

int RunCheckpointCommand(absl::Span<const std::string> args, std::ostream& out,
                         std::ostream& err);

}  // namespace vemesh::checkpoint_tool

#endif  // TOOLS_CHECKPOINT_CHECKPOINT_COMMAND_H_
