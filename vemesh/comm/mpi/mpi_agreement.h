// vemesh/comm/mpi/mpi_agreement.h
//
// Checks that every rank of a communicator is about to make the same
// collective call with the same arguments, before that call can hang or
// build a wrong mesh:
//
//   absl::Status s = CheckAgreement(
//       MPI_COMM_WORLD, "init_device_mesh",
//       {{"device type", "cpu"}, {"shape", "(2, 2, 2)"}},
//       absl::Now() + absl::Seconds(5));
//
// Every rank gets the same answer: OK, InvalidArgument naming the first rank
// that disagrees with rank 0 and both values of each field that differ, or
// DeadlineExceeded when some rank did not arrive before `deadline`.
//
// Cost: one non-blocking MPI_Iallreduce of a 64-bit fingerprint when the
// ranks agree, polled so the deadline holds; four more small non-blocking
// collectives only when they do not.
//
// DeadlineExceeded leaves a collective pending on `comm` that can never be
// cancelled: MPI cannot be trusted afterwards (its buffers are deliberately
// leaked so a late rank cannot write into freed memory). Report the error
// and end the job.

#ifndef VEMESH_COMM_MPI_MPI_AGREEMENT_H_
#define VEMESH_COMM_MPI_MPI_AGREEMENT_H_

#include <mpi.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace vemesh {

struct AgreementField {
  std::string name;   // "shape"
  std::string value;  // "(2, 2, 2)": compared in full, shown shortened
};

absl::Status CheckAgreement(MPI_Comm comm, absl::string_view operation,
                            absl::Span<const AgreementField> fields,
                            absl::Time deadline);

}  // namespace vemesh

#endif  // VEMESH_COMM_MPI_MPI_AGREEMENT_H_
