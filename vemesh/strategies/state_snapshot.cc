#include "vemesh/strategies/state_snapshot.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "vemesh/base/status_macros.h"

namespace vemesh::strategies {

absl::Status StateSnapshot::Save(TrainingState& state) {
  // Listed on every Save (a few closures; the optimizers behind them can be
  // replaced between steps, so a kept list could point at freed ones).
  // Not restorable until this copy is whole: a failure midway must not
  // leave a mix of two steps to Restore.
  saved_ = false;
  VEMESH_ASSIGN_OR_RETURN(std::vector<ElasticStateEntry> entries,
                          state.elastic_state());
  names_.resize(entries.size());
  bytes_.resize(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const ElasticStateEntry& e = entries[i];
    if (names_[i] != e.name) names_[i] = e.name;
    if (e.bytes) {
      // assign() keeps the buffer when it is large enough: no allocation
      // once the copy has the state's sizes.
      absl::Span<char> live = e.bytes();
      bytes_[i].assign(live.data(), live.size());
    } else {
      VEMESH_ASSIGN_OR_RETURN(bytes_[i], e.state_dict());
    }
  }
  saved_ = true;
  return absl::OkStatus();
}

absl::Status StateSnapshot::Restore(TrainingState& state) const {
  if (!saved_) {
    return absl::FailedPreconditionError(
        "StateSnapshot: Restore before any Save");
  }
  VEMESH_ASSIGN_OR_RETURN(const std::vector<ElasticStateEntry> entries,
                          state.elastic_state());
  // Every size checked before anything is written.
  bool same = entries.size() == names_.size();
  for (size_t i = 0; same && i < entries.size(); ++i) {
    const ElasticStateEntry& e = entries[i];
    same = e.name == names_[i] &&
           (!e.bytes || e.bytes().size() == bytes_[i].size());
  }
  if (!same) {
    return absl::InvalidArgumentError(
        absl::StrCat("StateSnapshot: the state changed shape since Save (",
                     names_.size(), " entries saved, ", entries.size(),
                     " now, or a buffer of another size): nothing restored"));
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    const ElasticStateEntry& e = entries[i];
    if (e.bytes) {
      absl::Span<char> live = e.bytes();
      if (!live.empty()) {
        std::memcpy(live.data(), bytes_[i].data(), live.size());
      }
    } else {
      VEMESH_RETURN_IF_ERROR(e.load_state_dict(bytes_[i]));
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
