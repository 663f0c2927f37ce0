// tools/plan/plan_command.h
//
// `vemesh plan` as a function: arguments in, text out, an exit code back.
// The executable's main only dispatches to it, so tests run the whole command
// without a process:
//
//   std::ostringstream out, err;
//   int code = RunPlanCommand({"--mesh", "PP=2,TP=4"}, out, err);
//
// Exit codes: 0 success; 2 bad input (the message on `err` names the bad
// value and what was expected); 1 the output could not be written (the
// --output file, or stdout when it is full or closed); 3 `--check FILE`
// found the job's placement differs from the plan (the differences on
// `out`).

#ifndef VEMESH_TOOLS_PLAN_PLAN_COMMAND_H_
#define VEMESH_TOOLS_PLAN_PLAN_COMMAND_H_

#include <ostream>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace vemesh::plan {

inline constexpr int kExitOk = 0;
inline constexpr int kExitIoError = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitMismatch = 3;

int RunPlanCommand(absl::Span<const std::string> args, std::ostream& out,
                   std::ostream& err);

// Writes `text` to `out` and flushes it: kExitOk, or kExitIoError with a
// message on `err` when the stream refuses it (`> /dev/full`, a closed
// stdout). Every subcommand's stdout goes through here.
int WriteToStream(absl::string_view text, std::ostream& out, std::ostream& err);

}  // namespace vemesh::plan

#endif  // VEMESH_TOOLS_PLAN_PLAN_COMMAND_H_
