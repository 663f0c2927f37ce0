// vemesh/elastic/internal/quorum_round.h
//
// The survivors' agreement after a failed epoch, without waiting for a dead
// replica's lease to expire. Each replica's leader that reaches the recovery
// posts "alive after epoch E" (its incarnation) to the store; a member that
// has not posted is probed on its liveness port (liveness_probe.h). The
// round is decided once every member of epoch E has either posted or is
// gone (its port refuses): the next epoch is the members that posted.
// A member that is silent but alive (slow, stopped, busy in a long step)
// is waited for; the lease remains the backstop that decides for it (a
// stopped or hung replica) after the TTL. So a live replica is never left
// out by the round itself, and every leader proposes by compare-and-set on
// the one record: one proposal wins, the others read it.
//
//   QuorumRound round(control, rec, me, incarnation, absl::Milliseconds(20),
//                     /*reachable=*/{0x1f, 0x2a});
//   if (absl::Status s = round.Post(); !s.ok()) return s;
//   auto alive = round.Poll();   // nullopt while a member is silent
//   if (alive.ok() && alive->has_value()) { /* propose NextEpoch(**alive) */ }

#ifndef VEMESH_ELASTIC_INTERNAL_QUORUM_ROUND_H_
#define VEMESH_ELASTIC_INTERNAL_QUORUM_ROUND_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "vemesh/elastic/internal/control_plane.h"
#include "vemesh/elastic/internal/membership.h"

namespace vemesh {

class QuorumRound {
 public:
  // `failed`: the record of the epoch that failed (this replica a member).
  // `reachable`: the incarnations whose port this replica has seen answer,
  // `reachable_hosts`: the hosts where some port answered it; a refused
  // port counts as gone only for them (an address that never answered may
  // be wrong from here, e.g. another host's loopback; a refusal from a host
  // that answers means nobody listens: a joiner killed as it was admitted).
  // A port that answers during the round is trusted from then on.
  QuorumRound(const ControlPlane& control, MembershipRecord failed, int me,
              uint64_t incarnation, absl::Duration probe_timeout,
              std::set<uint64_t> reachable,
              std::set<std::string> reachable_hosts = {});

  // Posts this replica's "alive after epoch E".
  absl::Status Post();
  // The members that posted (in DP order) once each member posted or is
  // gone; nullopt while one is silent and not known gone.
  absl::StatusOr<std::optional<std::vector<int>>> Poll();
  // The members found gone so far.
  const std::set<int>& gone() const { return gone_; }

 private:
  const ControlPlane& control_;
  const MembershipRecord failed_;
  const int me_;
  const uint64_t incarnation_;
  const absl::Duration probe_timeout_;
  std::set<uint64_t> reachable_;
  const std::set<std::string> reachable_hosts_;
  std::set<int> gone_;
  // When each silent member's port last answered: probed again only after
  // kReprobe (a stopped process's backlog is not to be filled).
  std::map<int, absl::Time> answered_;
};

}  // namespace vemesh

#endif  // VEMESH_ELASTIC_INTERNAL_QUORUM_ROUND_H_
