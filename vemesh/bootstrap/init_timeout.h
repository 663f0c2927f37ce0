// vemesh/bootstrap/init_timeout.h
//
// How long a mesh's creation waits for every rank when the program did not
// say (MeshOptions::timeout left unset): 60 s, or VEMESH_INIT_TIMEOUT from
// the launch script, so that a job whose rank never arrives fails within
// the bound the script chose instead of the built-in minute.
//
//   VEMESH_INIT_TIMEOUT=10 torchrun ... ./train    # seconds ("10", "2.5")
//   VEMESH_INIT_TIMEOUT=2m mpirun -n 8 ./train     # or a duration ("90s")
//
//   absl::StatusOr<absl::Duration> t = DefaultInitTimeout();
//
// A timeout set in code (MeshOptions::timeout) wins over the variable.

#ifndef VEMESH_BOOTSTRAP_INIT_TIMEOUT_H_
#define VEMESH_BOOTSTRAP_INIT_TIMEOUT_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace vemesh {

// The built-in default: 60 s.
inline constexpr absl::Duration kBuiltinInitTimeout = absl::Seconds(60);

// The variable's name: "VEMESH_INIT_TIMEOUT".
inline constexpr absl::string_view kInitTimeoutVariable = "VEMESH_INIT_TIMEOUT";

// VEMESH_INIT_TIMEOUT when set and not empty (a positive number of seconds, or
// a positive absl duration such as "90s" or "2m"), else kBuiltinInitTimeout. A
// value that is neither is InvalidArgument naming the variable, its value and
// what was expected.
absl::StatusOr<absl::Duration> DefaultInitTimeout();

// The same rule for a given text (what the variable holds).
absl::StatusOr<absl::Duration> ParseInitTimeout(absl::string_view text);

}  // namespace vemesh

#endif  // VEMESH_BOOTSTRAP_INIT_TIMEOUT_H_
