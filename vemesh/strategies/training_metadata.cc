#include "vemesh/strategies/training_metadata.h"

#include "absl/strings/str_cat.h"

namespace vemesh::strategies {

void SetTrainingMetadata(const std::map<std::string, std::string>& identity,
                         int64_t step, checkpoint::StateDict* dict) {
  for (const auto& [key, value] : identity) dict->SetMetadata(key, value);
  dict->SetMetadata("step", absl::StrCat(step));
  dict->SetMetadata("data_position", absl::StrCat(step));
}

absl::Status CheckResumable(const checkpoint::LoadResult& loaded,
                            const std::map<std::string, std::string>& identity,
                            int64_t steps) {
  const auto& metadata = loaded.metadata;
  for (const auto& [key, want] : identity) {
    auto it = metadata.find(key);
    if (it == metadata.end() || it->second != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint '", loaded.path,
          "' is of another model or training: its '", key, "' is ",
          it == metadata.end() ? std::string("missing")
                               : absl::StrCat("'", it->second, "'"),
          "; this run's is '", want, "'"));
    }
  }
  auto position = metadata.find("data_position");
  if (position == metadata.end() ||
      position->second != absl::StrCat(loaded.step)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint '", loaded.path, "' at step ", loaded.step,
                     " has data_position '",
                     position == metadata.end() ? "(none)" : position->second,
                     "'; expected ", loaded.step));
  }
  if (loaded.step >= steps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the run trains ", steps, " steps but checkpoint '", loaded.path,
        "' is at step ", loaded.step,
        ": nothing left to train; expected steps > ", loaded.step));
  }
  return absl::OkStatus();
}

}  // namespace vemesh::strategies
