#include "vemesh/elastic/internal/quorum_round.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "vemesh/elastic/internal/epoch_gate.h"

namespace vemesh {
namespace {
constexpr absl::Duration kQuorumReprobe = absl::Milliseconds(25);
}  // namespace

QuorumRound::QuorumRound(const ControlPlane& control, MembershipRecord failed,
                         int me, uint64_t incarnation,
                         absl::Duration probe_timeout,
                         std::set<uint64_t> reachable,
                         std::set<std::string> reachable_hosts)
    : control_(control),
      failed_(std::move(failed)),
      me_(me),
      incarnation_(incarnation),
      probe_timeout_(probe_timeout),
      reachable_(std::move(reachable)),
      reachable_hosts_(std::move(reachable_hosts)) {}

absl::Status QuorumRound::Post() {
  return control_.store()->set(control_.AliveKey(failed_.epoch, me_),
                               absl::StrCat(absl::Hex(incarnation_)));
}

absl::StatusOr<std::optional<std::vector<int>>> QuorumRound::Poll() {
  std::vector<int> posted;
  bool silent = false;
  for (int id : failed_.members) {
    const uint64_t inc = failed_.incarnation_of(id);
    auto value = control_.store()->get(control_.AliveKey(failed_.epoch, id));
    if (!value.ok() && !absl::IsNotFound(value.status())) {
      return value.status();
    }
    uint64_t seen = 0;
    if (value.ok() && absl::SimpleHexAtoi(*value, &seen) && seen == inc) {
      posted.push_back(id);
      continue;
    }
    if (gone_.count(id) != 0) continue;
    if (auto a = answered_.find(id);
        a != answered_.end() && absl::Now() - a->second < kQuorumReprobe) {
      silent = true;
      continue;
    }
    // Silent: its ranks' ports say whether its processes still exist.
    auto probe = control_.Probe(id, inc, probe_timeout_);
    if (!probe.ok()) return probe.status();
    const Liveness v = probe->liveness;
    if (v == Liveness::kListening) reachable_.insert(inc);
    if (v == Liveness::kGone &&
        (reachable_.count(inc) != 0 ||
         reachable_hosts_.count(HostOfAddress(probe->address)) != 0)) {
      gone_.insert(id);
      continue;
    }
    answered_[id] = absl::Now();
    silent = true;
  }
  if (silent) return std::optional<std::vector<int>>();
  return std::optional<std::vector<int>>(std::move(posted));
}

}  // namespace vemesh
