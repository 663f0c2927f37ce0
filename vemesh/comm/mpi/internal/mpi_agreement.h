// vemesh/comm/mpi/internal/mpi_agreement.h
//
// The MPI backend's check that every rank passes the same collective
// (the Gloo backend's check, on the same summary: comm/internal/
// op_summary.h): each rank's operation is summarised in 32 bytes, the summaries
// are all-gathered before the data moves, and a difference is InvalidArgument
// on every rank, naming the first rank that differs from rank 0 and what each
// passed. MPI then never sees a mismatch: Open MPI reports one from inside its
// non-blocking collectives on MPI_COMM_WORLD, whose handler ends the job.
//
//   MpiOpSummary mine = SummarizeOp(op);
//   std::vector<MpiOpSummary> all(size);       // MPI_Iallgather of `mine`
//   absl::Status s = MpiAgreementVerdict(op, all);
//
// all_to_all_v's per-pair counts are not in the summary (each rank holds
// only its own row): only its kind and type are compared.
//
// Internal to the MPI backend and its tests.

#ifndef VEMESH_COMM_MPI_INTERNAL_MPI_AGREEMENT_H_
#define VEMESH_COMM_MPI_INTERNAL_MPI_AGREEMENT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "vemesh/comm/internal/op_summary.h"
#include "vemesh/comm/operation.h"

namespace vemesh {

// The summary is comm/internal/op_summary.h's, shared with Gloo.
using MpiOpSummary = OpSummary;

// Whether `op` is checked: every collective (not point to point).
bool IsCheckedCollective(const Operation& op);

// OK when every summary equals all[0]; otherwise InvalidArgument naming
// the first rank that differs (the same text on every rank).
absl::Status MpiAgreementVerdict(const Operation& op,
                                 absl::Span<const MpiOpSummary> all);

// The check's default for new communicators: on, unless the environment
// variable VEMESH_COLLECTIVE_CHECK is "0" or "off" (read once).
bool CollectiveCheckDefault();

}  // namespace vemesh

#endif  // VEMESH_COMM_MPI_INTERNAL_MPI_AGREEMENT_H_
