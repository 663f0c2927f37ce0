#include "vemesh/elastic/internal/membership.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace vemesh {
namespace {

bool Contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

absl::Status ParseList(absl::string_view field, absl::string_view text,
                       std::vector<int>& out) {
  if (text.empty()) return absl::OkStatus();
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    if (out.size() >= static_cast<size_t>(kMaxReplicas)) {
      return absl::InvalidArgumentError(
          absl::StrCat("membership field '", field, "' lists more than ",
                       kMaxReplicas, " replicas"));
    }
    int id = -1;
    if (!absl::SimpleAtoi(item, &id) || id < 0 || id >= kMaxReplicas) {
      return absl::InvalidArgumentError(absl::StrCat(
          "membership field '", field, "' holds replica '", item.substr(0, 40),
          "': expected an integer in [0, ", kMaxReplicas, ")"));
    }
    out.push_back(id);
  }
  return absl::OkStatus();
}

}  // namespace

bool MembershipRecord::has_member(int replica) const {
  return Contains(members, replica);
}
bool MembershipRecord::has_pending(int replica) const {
  return Contains(pending, replica);
}
uint64_t MembershipRecord::incarnation_of(int replica) const {
  auto it = incarnations.find(replica);
  return it == incarnations.end() ? 0 : it->second;
}
bool MembershipRecord::admits(int replica, uint64_t incarnation) const {
  return has_member(replica) && incarnation_of(replica) == incarnation;
}
int MembershipRecord::dp_rank_of(int replica) const {
  auto it = std::find(members.begin(), members.end(), replica);
  return it == members.end() ? -1 : static_cast<int>(it - members.begin());
}

std::string EncodeMembership(const MembershipRecord& r) {
  std::string text =
      absl::StrCat("e=", r.epoch, ";m=", absl::StrJoin(r.members, ","),
                   ";p=", absl::StrJoin(r.pending, ","));
  std::vector<std::string> incs;
  for (const auto& [id, inc] : r.incarnations) {
    if (inc != 0) incs.push_back(absl::StrCat(id, ":", absl::Hex(inc)));
  }
  if (!incs.empty()) absl::StrAppend(&text, ";i=", absl::StrJoin(incs, ","));
  return text;
}

std::string MembershipText(const MembershipRecord& r) {
  return absl::StrCat("epoch ", r.epoch, ", DP=", r.members.size(), " [",
                      absl::StrJoin(r.members, ", "), "], pending [",
                      absl::StrJoin(r.pending, ", "), "]");
}

absl::StatusOr<MembershipRecord> ParseMembership(absl::string_view text) {
  MembershipRecord r;
  if (text.empty()) return r;
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ';');
  if (parts.size() < 3 || parts.size() > 4 ||
      !absl::StartsWith(parts[0], "e=") || !absl::StartsWith(parts[1], "m=") ||
      !absl::StartsWith(parts[2], "p=") ||
      (parts.size() == 4 && !absl::StartsWith(parts[3], "i="))) {
    return absl::InvalidArgumentError(
        absl::StrCat("membership record '", text.substr(0, 200),
                     "': expected 'e=EPOCH;m=IDS;p=IDS[;i=ID:HEX,...]'"));
  }
  if (!absl::SimpleAtoi(parts[0].substr(2), &r.epoch) || r.epoch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("membership epoch '", parts[0].substr(2, 40),
                     "': expected a non-negative integer"));
  }
  if (absl::Status s = ParseList("m", parts[1].substr(2), r.members); !s.ok()) {
    return s;
  }
  if (absl::Status s = ParseList("p", parts[2].substr(2), r.pending); !s.ok()) {
    return s;
  }
  if (r.members.size() + r.pending.size() > static_cast<size_t>(kMaxReplicas)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "membership record lists ", r.members.size() + r.pending.size(),
        " replicas: at most ", kMaxReplicas));
  }
  absl::flat_hash_set<int> seen;
  for (const std::vector<int>* list : {&r.members, &r.pending}) {
    for (int id : *list) {
      if (!seen.insert(id).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("membership record lists replica ", id,
                         " twice: each replica is a member or pending, once"));
      }
    }
  }
  if (parts.size() == 4 && parts[3].size() > 2) {
    for (absl::string_view item : absl::StrSplit(parts[3].substr(2), ',')) {
      const std::vector<absl::string_view> kv = absl::StrSplit(item, ':');
      int id = -1;
      uint64_t inc = 0;
      if (kv.size() != 2 || !absl::SimpleAtoi(kv[0], &id) || kv[1].empty() ||
          kv[1].size() > 16 || !absl::SimpleHexAtoi(kv[1], &inc) || inc == 0 ||
          !seen.contains(id) || r.incarnations.contains(id)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "membership incarnation '", item.substr(0, 40),
            "': expected ID:HEX with a listed replica id, once, and a "
            "non-zero hexadecimal incarnation of at most 16 digits"));
      }
      r.incarnations[id] = inc;
    }
  }
  return r;
}

}  // namespace vemesh
