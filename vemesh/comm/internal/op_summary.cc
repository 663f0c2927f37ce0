#include "vemesh/comm/internal/op_summary.h"

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/base/fnv1a.h"
#include "vemesh/comm/agreement.h"

namespace vemesh {
namespace {

uint64_t HashCounts(const std::vector<size_t>& counts) {
  uint64_t h = kFnv1aOffset;  // FNV-1a over the 64-bit counts
  for (size_t c : counts) h = Fnv1aWord(c, h);
  return h;
}

bool Same(const OpSummary& a, const OpSummary& b) {
  return std::memcmp(&a, &b, sizeof(OpSummary)) == 0;
}

}  // namespace

bool OpKindReduces(OpKind k) {
  return k == OpKind::kAllReduce || k == OpKind::kReduce ||
         k == OpKind::kReduceScatter || k == OpKind::kReduceScatterV;
}

bool OpKindRooted(OpKind k) {
  return k == OpKind::kBroadcast || k == OpKind::kReduce ||
         k == OpKind::kGather || k == OpKind::kScatter;
}

OpSummary SummarizeOp(const Operation& op) {
  OpSummary s;
  s.kind = static_cast<uint32_t>(op.kind);
  if (op.kind == OpKind::kBarrier) return s;
  s.type = static_cast<uint32_t>(op.type);
  if (OpKindReduces(op.kind)) s.op = static_cast<uint32_t>(op.op);
  if (OpKindRooted(op.kind)) s.root = op.root;
  switch (op.kind) {
    case OpKind::kReduceScatterV:
    case OpKind::kAllGatherV:
      s.count = std::accumulate(op.recv_counts.begin(), op.recv_counts.end(),
                                size_t{0});
      s.counts_hash = HashCounts(op.recv_counts);
      break;
    case OpKind::kAllToAllV:
      break;  // pairwise: each rank holds its own row of the count matrix
    default:
      s.count = op.count;
      break;
  }
  return s;
}

std::string OpSummaryText(const OpSummary& s) {
  const auto kind = static_cast<OpKind>(s.kind);
  std::string out(OpKindName(kind));
  if (kind == OpKind::kBarrier) return out;
  absl::StrAppend(&out, " of ", s.count, " ",
                  DataTypeName(static_cast<DataType>(s.type)));
  std::vector<std::string> details;
  if (s.counts_hash != 0) details.push_back("its own count list");
  if (OpKindReduces(kind)) {
    details.push_back(
        absl::StrCat("op ", ReduceOpName(static_cast<ReduceOp>(s.op))));
  }
  if (OpKindRooted(kind)) details.push_back(absl::StrCat("root ", s.root));
  if (!details.empty()) {
    absl::StrAppend(&out, " (", absl::StrJoin(details, ", "), ")");
  }
  return out;
}

absl::Status OpSummaryVerdict(
    const Operation& op, int size,
    absl::FunctionRef<const OpSummary&(int)> summary_of) {
  const OpSummary& first = summary_of(0);
  for (int r = 1; r < size; ++r) {
    const OpSummary& other = summary_of(r);
    if (Same(other, first)) continue;
    std::string hint = "the same operation, count, type, op and root";
    if (other.counts_hash != 0 && first.counts_hash != 0 &&
        other.kind == first.kind) {
      hint = "the same count list";
    }
    return absl::InvalidArgumentError(DisagreementMessage(
        absl::StrCat(op.Name(), " (every rank of the group must pass ", hint,
                     ")"),
        r, OpSummaryText(other), 0, OpSummaryText(first)));
  }
  return absl::OkStatus();
}

}  // namespace vemesh
