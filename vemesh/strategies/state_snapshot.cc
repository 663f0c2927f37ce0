#include "vemesh/strategies/state_snapshot.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "vemesh/base/status_macros.h"

namespace vemesh::strategies {

absl::Status StateSnapshot::Save(TrainingState& state) {
  VEMESH_ASSIGN_OR_RETURN(std::vector<ElasticStateEntry> entries,
                          state.elastic_state());
  std::vector<std::string> names;
  std::vector<std::string> bytes;
  names.reserve(entries.size());
  bytes.reserve(entries.size());
  for (const ElasticStateEntry& e : entries) {
    names.push_back(e.name);
    if (e.bytes) {
      absl::Span<char> live = e.bytes();
      bytes.emplace_back(live.data(), live.size());
    } else {
      VEMESH_ASSIGN_OR_RETURN(std::string b, e.state_dict());
      bytes.push_back(std::move(b));
    }
  }
  names_ = std::move(names);
  bytes_ = std::move(bytes);
  saved_ = true;
  return absl::OkStatus();
}

absl::Status StateSnapshot::Restore(TrainingState& state) const {
  if (!saved_) {
    return absl::FailedPreconditionError(
        "StateSnapshot: Restore before any Save");
  }
  VEMESH_ASSIGN_OR_RETURN(std::vector<ElasticStateEntry> entries,
                          state.elastic_state());
  // Every size checked before anything is written.
  bool same = entries.size() == names_.size();
  for (size_t i = 0; same && i < entries.size(); ++i) {
    same = entries[i].name == names_[i] &&
           (!entries[i].bytes || entries[i].bytes().size() == bytes_[i].size());
  }
  if (!same) {
    return absl::InvalidArgumentError(
        absl::StrCat("StateSnapshot: the state changed shape since Save (",
                     names_.size(), " entries saved, ", entries.size(),
                     " now, or a buffer of another size): nothing restored"));
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].bytes) {
      absl::Span<char> live = entries[i].bytes();
      if (!live.empty()) {
        std::memcpy(live.data(), bytes_[i].data(), live.size());
      }
    } else {
      VEMESH_RETURN_IF_ERROR(entries[i].load_state_dict(bytes_[i]));
    }
  }
  return absl::OkStatus();
}

size_t StateSnapshot::bytes() const {
  size_t n = 0;
  for (const std::string& b : bytes_) n += b.size();
  return n;
}

}  // namespace vemesh::strategies
