// libFuzzer target: ParseMembership on arbitrary text (the elastic control
// plane's record, read back from a store anyone on the network can write).
//
// Invariants checked on every input (a violation aborts, which libFuzzer
// reports as a crash with the input saved):
//   - a rejected record is InvalidArgument with a non-empty message whose
//     length is bounded by the input's plus a constant (it quotes at most
//     the offending part);
//   - an accepted record has a non-negative epoch, at most kMaxReplicas
//     entries, every id in [0, kMaxReplicas), no id twice (checked here
//     independently of the parser);
//   - the empty text is epoch 0 with nobody;
//   - has_member / has_pending / dp_rank_of agree with the lists;
//   - EncodeMembership then ParseMembership gives an equal record, and the
//     encoding is a fixed point (encoding that again gives the same text).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "fuzz_check.h"
#include "vemesh/elastic/internal/membership.h"

namespace {

// Past any valid record (kMaxReplicas ids of at most 4 digits, separators,
// a 19-digit epoch): longer inputs only cost time.
constexpr size_t kMaxInput = 16 * 1024;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return 0;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto record = vemesh::ParseMembership(text);
  if (!record.ok()) {
    FUZZ_CHECK(record.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(!record.status().message().empty());
    FUZZ_CHECK(record.status().message().size() <= size + 300);
    return 0;
  }

  if (text.empty()) FUZZ_CHECK(*record == vemesh::MembershipRecord{});
  FUZZ_CHECK(record->epoch >= 0);
  const size_t total = record->members.size() + record->pending.size();
  FUZZ_CHECK(total <= static_cast<size_t>(vemesh::kMaxReplicas));
  std::vector<int> where(vemesh::kMaxReplicas, -1);  // -1: nowhere
  for (size_t i = 0; i < record->members.size(); ++i) {
    const int id = record->members[i];
    FUZZ_CHECK(id >= 0 && id < vemesh::kMaxReplicas);
    FUZZ_CHECK(where[id] == -1);
    where[id] = static_cast<int>(i);
  }
  for (int id : record->pending) {
    FUZZ_CHECK(id >= 0 && id < vemesh::kMaxReplicas);
    FUZZ_CHECK(where[id] == -1);
    where[id] = -2;  // pending
  }
  // The queries, for every id that appears and a few that cannot.
  for (int id : {-1, vemesh::kMaxReplicas, 0, vemesh::kMaxReplicas - 1}) {
    const bool in_range = id >= 0 && id < vemesh::kMaxReplicas;
    const int at = in_range ? where[id] : -1;
    FUZZ_CHECK(record->has_member(id) == (at >= 0));
    FUZZ_CHECK(record->dp_rank_of(id) == (at >= 0 ? at : -1));
    FUZZ_CHECK(record->has_pending(id) == (at == -2));
  }
  for (size_t i = 0; i < record->members.size(); ++i) {
    FUZZ_CHECK(record->dp_rank_of(record->members[i]) == static_cast<int>(i));
    FUZZ_CHECK(!record->has_pending(record->members[i]));
  }
  for (int id : record->pending) {
    FUZZ_CHECK(record->has_pending(id));
    FUZZ_CHECK(!record->has_member(id));
  }

  const std::string encoded = vemesh::EncodeMembership(*record);
  auto again = vemesh::ParseMembership(encoded);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(*again == *record);
  FUZZ_CHECK(vemesh::EncodeMembership(*again) == encoded);
  FUZZ_CHECK(!vemesh::MembershipText(*record).empty());
  return 0;
}
