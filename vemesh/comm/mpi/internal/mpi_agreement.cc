#include "vemesh/comm/mpi/internal/mpi_agreement.h"

#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/base/fnv1a.h"
#include "vemesh/base/log.h"
#include "vemesh/comm/agreement.h"

namespace vemesh {
namespace {

uint64_t MpiHashCounts(const std::vector<size_t>& counts) {
  uint64_t h = kFnv1aOffset;
  for (size_t c : counts) h = Fnv1aWord(c, h);
  return h;
}

bool MpiSame(const MpiOpSummary& a, const MpiOpSummary& b) {
  return std::memcmp(&a, &b, sizeof(MpiOpSummary)) == 0;
}

bool MpiReduces(OpKind k) {
  return k == OpKind::kAllReduce || k == OpKind::kReduce ||
         k == OpKind::kReduceScatter || k == OpKind::kReduceScatterV;
}

bool MpiRooted(OpKind k) {
  return k == OpKind::kBroadcast || k == OpKind::kReduce ||
         k == OpKind::kGather || k == OpKind::kScatter;
}

std::string MpiSummaryText(const MpiOpSummary& s) {
  const auto kind = static_cast<OpKind>(s.kind);
  std::string out(OpKindName(kind));
  if (kind == OpKind::kBarrier) return out;
  absl::StrAppend(&out, " of ", s.count, " ",
                  DataTypeName(static_cast<DataType>(s.type)));
  std::vector<std::string> details;
  if (s.counts_hash != 0) details.push_back("its own count list");
  if (MpiReduces(kind)) {
    details.push_back(
        absl::StrCat("op ", ReduceOpName(static_cast<ReduceOp>(s.op))));
  }
  if (MpiRooted(kind)) details.push_back(absl::StrCat("root ", s.root));
  if (!details.empty()) {
    absl::StrAppend(&out, " (", absl::StrJoin(details, ", "), ")");
  }
  return out;
}

}  // namespace

bool IsCheckedCollective(const Operation& op) {
  return op.kind != OpKind::kBatch;
}

MpiOpSummary SummarizeOp(const Operation& op) {
  MpiOpSummary s;
  s.kind = static_cast<uint32_t>(op.kind);
  if (op.kind == OpKind::kBarrier) return s;
  s.type = static_cast<uint32_t>(op.type);
  if (MpiReduces(op.kind)) s.op = static_cast<uint32_t>(op.op);
  if (MpiRooted(op.kind)) s.root = op.root;
  switch (op.kind) {
    case OpKind::kReduceScatterV:
    case OpKind::kAllGatherV:
      s.count = std::accumulate(op.recv_counts.begin(), op.recv_counts.end(),
                                size_t{0});
      s.counts_hash = MpiHashCounts(op.recv_counts);
      break;
    case OpKind::kAllToAllV:
      break;  // each rank holds its own row of the count matrix
    default:
      s.count = op.count;
      break;
  }
  return s;
}

absl::Status MpiAgreementVerdict(const Operation& op,
                                 absl::Span<const MpiOpSummary> all) {
  for (size_t r = 1; r < all.size(); ++r) {
    if (MpiSame(all[r], all[0])) continue;
    std::string hint = "the same operation, count, type, op and root";
    if (all[r].counts_hash != 0 && all[0].counts_hash != 0 &&
        all[r].kind == all[0].kind) {
      hint = "the same count list";
    }
    return absl::InvalidArgumentError(DisagreementMessage(
        absl::StrCat(op.Name(), " (every rank of the group must pass ", hint,
                     ")"),
        static_cast<int>(r), MpiSummaryText(all[r]), 0,
        MpiSummaryText(all[0])));
  }
  return absl::OkStatus();
}

bool CollectiveCheckDefault() {
  static const bool on = [] {
    const char* v = std::getenv("VEMESH_COLLECTIVE_CHECK");
    if (v == nullptr || *v == '\0') return true;
    const std::string s = absl::AsciiStrToLower(v);
    if (s == "0" || s == "off") return false;
    if (s != "1" && s != "on") {
      LogWarning(absl::StrCat("VEMESH_COLLECTIVE_CHECK='", v,
                              "' is not 1, on, 0 or off: the check stays on"));
    }
    return true;
  }();
  return on;
}

}  // namespace vemesh
