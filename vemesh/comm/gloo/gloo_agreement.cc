// GlooCommunicator's agreement check: every rank's operation, summarised
// and compared before the data, so that Gloo never sees a mismatch. It is
// the backend's own exchange (Gloo's messages), below Communicator, so it
// cannot call comm/agreement.h's AgreeAcrossRanks; its message is that
// file's DisagreementMessage, the one format of a disagreement.

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gloo/allgather.h"
#include "gloo/transport/unbound_buffer.h"
#include "vemesh/base/fnv1a.h"
#include "vemesh/comm/agreement.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/comm/gloo/internal/gloo_job.h"
#include "vemesh/comm/gloo/internal/shm_group.h"

namespace vemesh {

namespace {

// What one rank passes to a collective, in a fixed size, so that the
// exchange itself can never mismatch.
struct Summary {
  uint32_t kind = 0;
  uint32_t type = 0;
  uint32_t op = 0;
  int32_t root = 0;
  uint64_t count = 0;
  uint64_t counts_hash = 0;  // the V forms' count list
};
static_assert(sizeof(Summary) == 32);
static_assert(sizeof(Summary) == gloo_internal::ShmGroup::kSummaryBytes);

uint64_t HashCounts(const std::vector<size_t>& counts) {
  uint64_t h = kFnv1aOffset;  // FNV-1a over the 64-bit counts
  for (size_t c : counts) h = Fnv1aWord(c, h);
  return h;
}

Summary Summarize(const Operation& op) {
  Summary s;
  s.kind = static_cast<uint32_t>(op.kind);
  if (op.kind == OpKind::kBarrier) return s;
  s.type = static_cast<uint32_t>(op.type);
  switch (op.kind) {
    case OpKind::kAllReduce:
    case OpKind::kReduceScatter:
      s.op = static_cast<uint32_t>(op.op);
      s.count = op.count;
      break;
    case OpKind::kReduce:
      s.op = static_cast<uint32_t>(op.op);
      s.root = op.root;
      s.count = op.count;
      break;
    case OpKind::kBroadcast:
    case OpKind::kGather:
    case OpKind::kScatter:
      s.root = op.root;
      s.count = op.count;
      break;
    case OpKind::kReduceScatterV:
      s.op = static_cast<uint32_t>(op.op);
      [[fallthrough]];
    case OpKind::kAllGatherV:
      s.count = std::accumulate(op.recv_counts.begin(), op.recv_counts.end(),
                                size_t{0});
      s.counts_hash = HashCounts(op.recv_counts);
      break;
    case OpKind::kAllToAllV:
      break;  // pairwise: checked on the count lists themselves
    default:
      s.count = op.count;
      break;
  }
  return s;
}

bool operator==(const Summary& a, const Summary& b) {
  return std::memcmp(&a, &b, sizeof(Summary)) == 0;
}

std::string SummaryText(const Summary& s) {
  const auto kind = static_cast<OpKind>(s.kind);
  std::string out(OpKindName(kind));
  if (kind == OpKind::kBarrier) return out;
  absl::StrAppend(&out, " of ", s.count, " ",
                  DataTypeName(static_cast<DataType>(s.type)));
  std::vector<std::string> details;
  if (s.counts_hash != 0) details.push_back("its own count list");
  if (kind == OpKind::kAllReduce || kind == OpKind::kReduce ||
      kind == OpKind::kReduceScatter || kind == OpKind::kReduceScatterV) {
    details.push_back(
        absl::StrCat("op ", ReduceOpName(static_cast<ReduceOp>(s.op))));
  }
  if (kind == OpKind::kBroadcast || kind == OpKind::kReduce ||
      kind == OpKind::kGather || kind == OpKind::kScatter) {
    details.push_back(absl::StrCat("root ", s.root));
  }
  if (!details.empty())
    absl::StrAppend(&out, " (", absl::StrJoin(details, ", "), ")");
  return out;
}

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
  const Summary mine = Summarize(op);
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
  const Summary s = Summarize(op);
  std::memcpy(out, &s, sizeof(Summary));
}

absl::Status GlooCommunicator::CompareSummaries(
    const Operation& op, absl::FunctionRef<const void*(int)> summary_of) {
  Summary first;
  std::memcpy(&first, summary_of(0), sizeof(Summary));
  for (int r = 1; r < size_; ++r) {
    Summary other;
    std::memcpy(&other, summary_of(r), sizeof(Summary));
    if (other == first) continue;
    // Every rank holds the same list, so every rank reports alike.
    std::string hint = "the same operation, count, type, op and root";
    if (other.counts_hash != 0 && first.counts_hash != 0 &&
        other.kind == first.kind) {
      hint = "the same count list";
    }
    return absl::InvalidArgumentError(DisagreementMessage(
        absl::StrCat(op.Name(), " (every rank of the group must pass ", hint,
                     ")"),
        r, SummaryText(other), 0, SummaryText(first)));
  }
  return absl::OkStatus();
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
