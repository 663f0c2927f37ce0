#include "vemesh/comm/backend.h"

#include "absl/strings/str_cat.h"

namespace vemesh {

absl::string_view BackendName(Backend backend) {
  switch (backend) {
    case Backend::kMpi:
      return "mpi";
    case Backend::kGloo:
      return "gloo";
    case Backend::kNccl:
      return "nccl";
  }
  return "unknown";
}

absl::StatusOr<Backend> ParseBackend(absl::string_view name,
                                     absl::string_view what) {
  for (Backend b : {Backend::kMpi, Backend::kGloo, Backend::kNccl}) {
    if (name == BackendName(b)) return b;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " '", name, "': expected 'mpi', 'gloo' or 'nccl'"));
}

}  // namespace vemesh
