// vemesh/bootstrap/mpi/internal/arrival_report.h
//
// Who never arrived, asked only once a deadline has passed. A pending MPI
// collective cannot say which rank is missing, and finding out beforehand
// would cost every call that succeeds; so nothing happens on the success
// path. At its deadline, each rank that arrived sends a small report (its
// host identity) point-to-point on the communicator of the abandoned
// collective, under a reserved tag, to the two collectors, ranks 0 and 1;
// each collects reports for a short grace and answers every reporter with
// its verdict. A reporter takes rank 0's answer, or rank 1's when rank 0's
// does not come (rank 0 may be the missing one):
//
//   std::string verdict = ReportArrival(comm, rank, size, HostIdentity(),
//                                       ArrivalGrace(timeout));
//   // "ranks 3, 7 never arrived (the ranks that did: node0: 0-2;
//   //  node1: 4-6)"
//
// A rank that gets no answer says what it knows instead. Every wait is
// bounded: a collector listens for `grace` and gives its answers grace / 2
// to leave; a reporter waits at most 2 x grace + 0.5 s. Point-to-point
// messages never match a pending collective (MPI keeps them apart), and the
// buffers of anything left pending are kept for the life of the process, as
// the bootstrap's own are. A rank that arrived, but whose deadline came more
// than the grace after the collector's, is counted as missing: the verdict
// is what the collector heard.
//
// Only for the moment MPI is being abandoned (AbandonMpi): it uses two tags
// (32766, 32767: every MPI allows them) on `comm`, which is the program's
// own communicator when the first collective of a bootstrap (its private
// MPI_Comm_idup) is the one that timed out.

#ifndef VEMESH_BOOTSTRAP_MPI_INTERNAL_ARRIVAL_REPORT_H_
#define VEMESH_BOOTSTRAP_MPI_INTERNAL_ARRIVAL_REPORT_H_

#include <mpi.h>

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace vemesh {

// How long rank 0 collects reports: a tenth of the operation's timeout,
// between 1 and 5 seconds.
absl::Duration ArrivalGrace(absl::Duration timeout);

// Run at a deadline by every rank that arrived (see the file comment).
std::string ReportArrival(MPI_Comm comm, int rank, int size,
                          absl::string_view host, absl::Duration grace);

// The verdict's text, from rank 0's view: `hosts[r]` for each rank that
// reported (rank 0 included), empty for the others. Pure, for tests.
//   {"a", "", "a", "b"} -> "rank 1 never arrived (the ranks that did:
//                           a: 0, 2; b: 3)"
// Long lists are cut: the first 32 ranges of missing ranks, the first 8
// hosts.
std::string ArrivalVerdict(const std::vector<std::string>& hosts);

// "3", "3-5", "0, 2-3, 7": ascending ranks as ranges.
std::string RankRanges(const std::vector<int>& ranks);

}  // namespace vemesh

#endif  // VEMESH_BOOTSTRAP_MPI_INTERNAL_ARRIVAL_REPORT_H_
