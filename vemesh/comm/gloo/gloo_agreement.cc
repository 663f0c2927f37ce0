// GlooCommunicator's agreement check: every rank's operation, summarised
// and compared before the data, so that Gloo never sees a mismatch. It is
// the backend's own exchange (Gloo's messages), below Communicator, so it
// cannot call comm/agreement.h's AgreeAcrossRanks; its message is that
// file's DisagreementMessage, the one format of a disagreement. The
// summary, its text and the verdict are comm/internal/op_summary.h's
// (the MPI backend's check uses the same).

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gloo/allgather.h"
#include "gloo/transport/unbound_buffer.h"
#include "vemesh/comm/agreement.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/comm/gloo/internal/gloo_job.h"
#include "vemesh/comm/gloo/internal/shm_group.h"
#include "vemesh/comm/internal/op_summary.h"

namespace vemesh {

namespace {

using Summary = OpSummary;  // comm/internal/op_summary.h
static_assert(sizeof(Summary) == gloo_internal::ShmGroup::kSummaryBytes);

// The smallest and the largest summary (bytewise) among the ranks heard
// from so far: the group agrees exactly when they are equal.
struct SummaryRange {
  Summary low;
  Summary high;
};
static_assert(sizeof(SummaryRange) == 64);

void Widen(SummaryRange& into, const SummaryRange& other) {
  if (std::memcmp(&other.low, &into.low, sizeof(Summary)) < 0)
    into.low = other.low;
  if (std::memcmp(&other.high, &into.high, sizeof(Summary)) > 0)
    into.high = other.high;
}

// Slots of the agreement's rounds: prefix 0x7d (Gloo's collectives use
// 0x01..0x08, point to point 0x7e), the round, the collective's tag.
uint64_t RangeSlot(uint32_t tag, int round) {
  return (uint64_t{0x7d} << 56) | (uint64_t(round) << 32) | tag;
}

}  // namespace

// Dissemination (Hensgen et al.): in round k every rank sends its range to
// rank + 2^k and widens it by the one from rank - 2^k; after ceil(log2 n)
// rounds every rank's range covers all n summaries (min and max are
// idempotent, so a summary counted twice changes nothing). 3 rounds of 64
// bytes at 8 ranks where the all-gather it replaces (Gloo's ring) took 7
// hops one after the other, and no round waits for more than one peer.
// Every rank ends with the same range, so all take the slow path alike.
bool GlooCommunicator::SummariesAgree(const void* summary, uint32_t tag) {
  int rounds = 0;
  while ((1 << rounds) < size_) ++rounds;
  // One slot per round's value: a send's buffer is never rewritten while
  // Gloo may still be reading it.
  std::vector<SummaryRange> sent(static_cast<size_t>(rounds));
  std::vector<SummaryRange> heard(static_cast<size_t>(rounds));
  SummaryRange range;
  std::memcpy(&range.low, summary, sizeof(Summary));
  range.high = range.low;
  // Declared before the guards: unregistered before they are freed.
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sends, recvs;
  std::vector<std::optional<Interruptible>> guards(2 * rounds);
  for (int k = 0; k < rounds; ++k) {
    const int step = 1 << k;
    const int to = (rank_ + step) % size_;
    const int from = (rank_ - step % size_ + size_) % size_;
    sent[k] = range;
    auto out = context_->createUnboundBuffer(&sent[k], sizeof(SummaryRange));
    guards[2 * k].emplace(*this, out.get());
    out->send(to, RangeSlot(tag, k));
    sends.push_back(std::move(out));
    recvs.push_back(
        context_->createUnboundBuffer(&heard[k], sizeof(SummaryRange)));
    guards[2 * k + 1].emplace(*this, recvs.back().get());
    recvs.back()->recv(from, RangeSlot(tag, k));
    WaitRecv(*recvs.back());
    Widen(range, heard[k]);
  }
  for (auto& out : sends) WaitSend(*out);
  guards.clear();
  return std::memcmp(&range.low, &range.high, sizeof(Summary)) == 0;
}

absl::Status GlooCommunicator::CheckAgreement(const Operation& op) {
  if (size_ == 1) return absl::OkStatus();
  const Summary mine = SummarizeOp(op);
  if (SummariesAgree(&mine, NextTag())) {
    if (op.kind != OpKind::kAllToAllV) return absl::OkStatus();
    return CheckAllToAllCounts(op);
  }
  // Someone disagrees: every rank learns who, to say it alike.
  std::vector<Summary> all(static_cast<size_t>(size_));
  {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(const_cast<Summary*>(&mine), 1);
    opts.setOutput(all.data(), all.size());
    opts.setTag(NextTag());
    gloo::allgather(opts);
  }
  absl::Status agreed =
      CompareSummaries(op, [&](int r) -> const void* { return &all[r]; });
  if (!agreed.ok() || op.kind != OpKind::kAllToAllV) return agreed;
  return CheckAllToAllCounts(op);
}

void GlooCommunicator::SummarizeInto(const Operation& op, void* out) {
  const Summary s = SummarizeOp(op);
  std::memcpy(out, &s, sizeof(Summary));
}

absl::Status GlooCommunicator::CompareSummaries(
    const Operation& op, absl::FunctionRef<const void*(int)> summary_of) {
  // Copied out: a slot's bytes need not be aligned for the struct.
  std::vector<Summary> all(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    std::memcpy(&all[r], summary_of(r), sizeof(Summary));
  }
  // Every rank holds the same list, so every rank reports alike.
  return OpSummaryVerdict(op, size_,
                          [&](int r) -> const Summary& { return all[r]; });
}

// all_to_all_v: what rank a sends to b must be what b expects from a.
absl::Status GlooCommunicator::CheckAllToAllCounts(const Operation& op) {
  const size_t n = static_cast<size_t>(size_);
  std::vector<uint64_t> counts(2 * n);
  for (size_t i = 0; i < n; ++i) {
    counts[i] = op.send_counts[i];
    counts[n + i] = op.recv_counts[i];
  }
  std::vector<uint64_t> every(2 * n * n);
  {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(counts.data(), counts.size());
    opts.setOutput(every.data(), every.size());
    opts.setTag(NextTag());
    gloo::allgather(opts);
  }
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = 0; b < n; ++b) {
      const uint64_t sent = every[a * 2 * n + b];
      const uint64_t expected = every[b * 2 * n + n + a];
      if (sent == expected) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          op.Name(), ": rank ", a, " sends ", sent, " elements to rank ", b,
          ", which expects ", expected,
          ": send_counts[b] of rank a must equal recv_counts[a] of rank b"));
    }
  }
  return absl::OkStatus();
}

}  // namespace vemesh
