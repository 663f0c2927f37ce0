// vemesh/checkpoint/checkpoint.cc

#include "vemesh/checkpoint/checkpoint.h"

namespace vemesh::checkpoint {

absl::Status Save(const StateDict&, int64_t, const std::string&, Communicator&,
                  const SaveOptions&) {
  return absl::UnimplementedError("checkpoint::Save: not yet");
}

absl::StatusOr<LoadResult> Load(StateDict&, const std::string&, Communicator&,
                                std::optional<int64_t>) {
  return absl::UnimplementedError("checkpoint::Load: not yet");
}

absl::StatusOr<std::optional<int64_t>> LatestStep(const std::string&) {
  return absl::UnimplementedError("checkpoint::LatestStep: not yet");
}

}  // namespace vemesh::checkpoint
