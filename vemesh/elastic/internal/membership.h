// vemesh/elastic/internal/membership.h
//
// One epoch of an elastic job: which replicas train together, in DP rank
// order, and which are waiting to join. The control plane holds exactly one
// record; every membership change replaces it by compare-and-set, so each
// epoch has one agreed member list however many ranks race to change it.
//
//   MembershipRecord r{.epoch = 4, .members = {0, 2}, .pending = {1},
//                      .incarnations = {{0, 0x1f}, {2, 0x2a}, {1, 0x3c}}};
//   std::string text = EncodeMembership(r);
//       // "e=4;m=0,2;p=1;i=0:1f,1:3c,2:2a" (incarnations by replica)
//   absl::StatusOr<MembershipRecord> back = ParseMembership(text);
//
// A replica id names a slot; an incarnation (a random 64-bit number each
// process of the replica shares, hex in the text) names the launch that
// fills it, so a relaunched replica, or a stopped one that wakes up after
// it was replaced, is never taken for the launch the record admitted. The
// `i=` field is left out when no replica has one (incarnation 0).
//
// Epoch 0 is "not formed yet" (the empty text parses to it). Member order is
// admission order: survivors keep their relative order and newcomers are
// appended, so DP rank 0 is always a replica that has trained (the source
// of the state a newcomer receives).
//
// The text comes from the network: ParseMembership bounds everything
// (replica ids in [0, kMaxReplicas), at most kMaxReplicas entries, no
// replica twice) and names what is wrong.

#ifndef VEMESH_ELASTIC_INTERNAL_MEMBERSHIP_H_
#define VEMESH_ELASTIC_INTERNAL_MEMBERSHIP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vemesh {

inline constexpr int kMaxReplicas = 1024;

struct MembershipRecord {
  int64_t epoch = 0;
  std::vector<int> members;  // DP rank order
  std::vector<int> pending;  // asked to join, not admitted yet
  // Incarnation of each listed replica (absent = 0); ordered, so that the
  // text of a record is one string.
  absl::btree_map<int, uint64_t> incarnations;

  uint64_t incarnation_of(int replica) const;
  // Listed as a member, by this incarnation.
  bool admits(int replica, uint64_t incarnation) const;
  bool has_member(int replica) const;
  bool has_pending(int replica) const;
  // DP rank of `replica`, or -1.
  int dp_rank_of(int replica) const;
  bool operator==(const MembershipRecord&) const = default;
};

std::string EncodeMembership(const MembershipRecord& record);
absl::StatusOr<MembershipRecord> ParseMembership(absl::string_view text);
// "epoch 4, DP=2 [0, 2], pending [1]".
std::string MembershipText(const MembershipRecord& record);

}  // namespace vemesh

#endif  // VEMESH_ELASTIC_INTERNAL_MEMBERSHIP_H_
