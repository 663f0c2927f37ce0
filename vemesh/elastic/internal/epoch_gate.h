// vemesh/elastic/internal/epoch_gate.h
//
// Before a new epoch's DP group connects, each rank waits here for its
// peers' advertisements (the `<prefix>/vemesh_host/<dp rank>` key every
// member sets before it builds the group) instead of leaving a member that
// died while the epoch formed (a joiner killed as it is admitted, a second
// kill during a recovery) to Gloo's rendezvous, which waits out the whole
// op_timeout. Meanwhile the replica's leader probes the silent members'
// liveness ports (liveness_probe.h): a refused port that is trusted (its
// incarnation, or its host, answered this leader before) means gone; the
// leader posts it on the epoch's gone key and every rank of every member
// gives up at once (Unavailable), so the recovery retries into an epoch
// without it, decided by the quorum round.
//
//   EpochGate gate(control, record, GroupPrefix(epoch, inner_rank),
//                  GroupPrefix(epoch, 0) + "/vemesh_gone",
//                  inner_rank == 0 ? &reachable : nullptr);
//   absl::Status s = gate.Await(absl::Now() + op_timeout);

#ifndef VEMESH_ELASTIC_INTERNAL_EPOCH_GATE_H_
#define VEMESH_ELASTIC_INTERNAL_EPOCH_GATE_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "vemesh/elastic/internal/control_plane.h"
#include "vemesh/elastic/internal/membership.h"

namespace vemesh {

// Whose liveness port may be trusted when it refuses: incarnations whose
// port answered, and hosts where some port answered (a refusal from a host
// that answers is no wrong address: nobody listens there).
struct Reachable {
  std::set<uint64_t> incarnations;
  std::set<std::string> hosts;
  // Records an answer of `incarnation` at `address` ("HOST:PORT").
  void Answered(uint64_t incarnation, const std::string& address);
  bool Trusts(uint64_t incarnation, const std::string& address) const;
};

// The host part of "HOST:PORT" (or of "[V6]:PORT").
std::string HostOfAddress(const std::string& address);

class EpochGate {
 public:
  // `judge`: the leader's reachability (updated with the answers it sees),
  // or null on the other ranks, which only read the gone key.
  EpochGate(const ControlPlane& control, MembershipRecord record,
            std::string prefix, std::string gone_key, Reachable* judge);

  // OK once every member advertised; Unavailable naming the member once
  // one is gone; DeadlineExceeded naming the silent members at `deadline`.
  absl::Status Await(absl::Time deadline);

 private:
  const ControlPlane& control_;
  const MembershipRecord record_;
  const std::string prefix_;
  const std::string gone_key_;
  Reachable* judge_;
  std::map<int, absl::Time> probed_;  // member -> its last probe
};

}  // namespace vemesh

#endif  // VEMESH_ELASTIC_INTERNAL_EPOCH_GATE_H_
