// vemesh/comm/backend.h
//
// The communication backends by name: the enum that code compares, and the
// strings that options and messages carry ("mpi", "gloo", "nccl", as
// PyTorch names them).
//
//   VEMESH_ASSIGN_OR_RETURN(Backend b, ParseBackend(options.backend));
//   if (b == Backend::kNccl) ...;
//   absl::string_view name = BackendName(b);  // "nccl"
//
// Options at the API boundary stay strings (MeshOptions::backend); they are
// parsed once, where they enter.

#ifndef VEMESH_COMM_BACKEND_H_
#define VEMESH_COMM_BACKEND_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vemesh {

enum class Backend { kMpi, kGloo, kNccl };

// "mpi", "gloo" or "nccl" ("unknown" outside the enum).
absl::string_view BackendName(Backend backend);

// The backend named `name` (exactly, lower case). InvalidArgument naming the
// value and the accepted ones otherwise: "<what> '<name>': expected 'mpi',
// 'gloo' or 'nccl'", where `what` says where the name came from
// ("MeshOptions.backend").
absl::StatusOr<Backend> ParseBackend(absl::string_view name,
                                     absl::string_view what = "backend");

}  // namespace vemesh

#endif  // VEMESH_COMM_BACKEND_H_
