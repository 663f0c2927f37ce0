// GlooCommunicator's agreement check: every rank's operation, summarised
// and exchanged before the data, so that Gloo never sees a mismatch. It is
// the backend's own collective (gloo::allgather), below Communicator, so it
// cannot call comm/agreement.h's AgreeAcrossRanks; its message is that
// file's DisagreementMessage, the one format of a disagreement.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gloo/allgather.h"
#include "vemesh/base/fnv1a.h"
#include "vemesh/comm/agreement.h"
#include "vemesh/comm/gloo/gloo_communicator.h"

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

}  // namespace

absl::Status GlooCommunicator::CheckAgreement(const Operation& op) {
  if (size_ == 1) return absl::OkStatus();
  const Summary mine = Summarize(op);
  std::vector<Summary> all(static_cast<size_t>(size_));
  {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(const_cast<Summary*>(&mine), 1);
    opts.setOutput(all.data(), all.size());
    opts.setTag(NextTag());
    gloo::allgather(opts);
  }
  for (int r = 1; r < size_; ++r) {
    if (all[r] == all[0]) continue;
    // Every rank holds the same list, so every rank reports alike.
    std::string hint = "the same operation, count, type, op and root";
    if (all[r].counts_hash != 0 && all[0].counts_hash != 0 &&
        all[r].kind == all[0].kind) {
      hint = "the same count list";
    }
    return absl::InvalidArgumentError(DisagreementMessage(
        absl::StrCat(op.Name(), " (every rank of the group must pass ", hint,
                     ")"),
        r, SummaryText(all[r]), 0, SummaryText(all[0])));
  }
  if (op.kind != OpKind::kAllToAllV) return absl::OkStatus();
  // all_to_all_v: what rank a sends to b must be what b expects from a.
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
