// vemesh/comm/internal/op_summary.h
//
// The collective check's summary, shared by the CPU backends (Gloo and
// MPI): what one rank passes to a collective in 32 bytes, so that the
// exchange of summaries can itself never mismatch; its text; and the
// verdict over every rank's summary. Each backend moves the summaries its
// own way (Gloo: log-depth rounds or a shared-memory slot; MPI: an
// all-gather) and asks the same questions of them. Private: not installed.
//
//   OpSummary mine = SummarizeOp(op);
//   std::vector<OpSummary> all(size);       // every rank's, by the backend
//   absl::Status s = OpSummaryVerdict(
//       op, size, [&](int r) -> const OpSummary& { return all[r]; });
//
// all_to_all_v's per-pair counts are not in the summary (each rank holds
// only its own row): only its kind and type are compared.

#ifndef VEMESH_COMM_INTERNAL_OP_SUMMARY_H_
#define VEMESH_COMM_INTERNAL_OP_SUMMARY_H_

#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "vemesh/comm/operation.h"

namespace vemesh {

struct OpSummary {
  uint32_t kind = 0;
  uint32_t type = 0;
  uint32_t op = 0;
  int32_t root = 0;
  uint64_t count = 0;
  uint64_t counts_hash = 0;  // the V forms' count list
};
static_assert(sizeof(OpSummary) == 32);

// Whether operations of `kind` carry a reduce op, or a root.
bool OpKindReduces(OpKind kind);
bool OpKindRooted(OpKind kind);

OpSummary SummarizeOp(const Operation& op);

// "all_reduce of 4 float32 (op sum)": what a rank passed, for messages.
std::string OpSummaryText(const OpSummary& s);

// OK when the `size` summaries (summary_of(r), r < size) all equal rank
// 0's; otherwise InvalidArgument naming the first rank that differs and
// what each passed (the same text on every rank that holds the same list).
absl::Status OpSummaryVerdict(
    const Operation& op, int size,
    absl::FunctionRef<const OpSummary&(int)> summary_of);

}  // namespace vemesh

#endif  // VEMESH_COMM_INTERNAL_OP_SUMMARY_H_
