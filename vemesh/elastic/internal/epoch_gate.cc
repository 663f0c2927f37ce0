#include "vemesh/elastic/internal/epoch_gate.h"

#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vemesh {
namespace {
constexpr absl::Duration kGateProbeTimeout = absl::Milliseconds(20);
constexpr absl::Duration kGateReprobe = absl::Milliseconds(10);
// Fast polls while a formation is normally completing, then slower.
constexpr absl::Duration kFastPoll = absl::Milliseconds(1);
constexpr absl::Duration kFastFor = absl::Milliseconds(100);
constexpr absl::Duration kSlowPoll = absl::Milliseconds(10);
}  // namespace

std::string HostOfAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return address;
  return address.substr(0, colon);
}

void Reachable::Answered(uint64_t incarnation, const std::string& address) {
  incarnations.insert(incarnation);
  hosts.insert(HostOfAddress(address));
}

bool Reachable::Trusts(uint64_t incarnation, const std::string& address) const {
  return incarnations.count(incarnation) != 0 ||
         hosts.count(HostOfAddress(address)) != 0;
}

EpochGate::EpochGate(const ControlPlane& control, MembershipRecord record,
                     std::string prefix, std::string gone_key, Reachable* judge)
    : control_(control),
      record_(std::move(record)),
      prefix_(std::move(prefix)),
      gone_key_(std::move(gone_key)),
      judge_(judge) {}

absl::Status EpochGate::Await(absl::Time deadline) {
  const int n = static_cast<int>(record_.members.size());
  const absl::Time start = absl::Now();
  std::vector<int> silent;
  while (true) {
    auto gone = control_.store()->get(gone_key_);
    if (gone.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "replica ", *gone, " of epoch ", record_.epoch,
          " is gone (its liveness port refuses) before its DP group formed"));
    }
    if (!absl::IsNotFound(gone.status())) return gone.status();
    silent.clear();
    for (int j = 0; j < n; ++j) {
      auto host =
          control_.store()->get(absl::StrCat(prefix_, "/vemesh_host/", j));
      if (host.ok()) continue;
      if (!absl::IsNotFound(host.status())) return host.status();
      silent.push_back(j);
    }
    if (silent.empty()) return absl::OkStatus();
    if (judge_ != nullptr) {
      for (int j : silent) {
        const int id = record_.members[j];
        const uint64_t inc = record_.incarnation_of(id);
        if (auto p = probed_.find(id);
            p != probed_.end() && absl::Now() - p->second < kGateReprobe) {
          continue;
        }
        probed_[id] = absl::Now();
        // No port advertised (or a store error): Gloo decides.
        auto probe = control_.Probe(id, inc, kGateProbeTimeout);
        if (!probe.ok()) continue;
        const Liveness v = probe->liveness;
        if (v == Liveness::kListening) judge_->Answered(inc, probe->address);
        if (v == Liveness::kGone && judge_->Trusts(inc, probe->address)) {
          (void)control_.store()->set(gone_key_, absl::StrCat(id));
          return absl::UnavailableError(
              absl::StrCat("replica ", id, " of epoch ", record_.epoch,
                           " is gone (a liveness port of it, ", probe->address,
                           ", refuses) before its DP group formed"));
        }
      }
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) break;
    absl::SleepFor(std::min(deadline - now,
                            now - start < kFastFor ? kFastPoll : kSlowPoll));
  }
  std::vector<std::string> names;
  for (int j : silent) {
    names.push_back(
        absl::StrCat("DP rank ", j, " (replica ", record_.members[j], ")"));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("epoch ", record_.epoch, ": ", absl::StrJoin(names, ", "),
                   " did not advertise within the op timeout"));
}

}  // namespace vemesh
