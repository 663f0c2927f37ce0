// vemesh/comm/mpi/mpi_request.h
//
// Waiting on MPI's non-blocking calls with a deadline. MPI collectives cannot
// be abandoned, so a deadline is honoured by starting the non-blocking form
// and polling it:
//
//   MPI_Request request;
//   MPI_Ibarrier(comm, &request);
//   absl::Status s = WaitForMpiRequest(&request, deadline, "MPI_Ibarrier");
//
//   absl::StatusOr<MPI_Comm> copy = BoundedCommIdup(comm, deadline);
//
// A DeadlineExceeded here means some rank never made the call: the
// collective stays pending and MPI is unusable from then on (the caller
// says why with AbandonMpi).

#ifndef VEMESH_COMM_MPI_MPI_REQUEST_H_
#define VEMESH_COMM_MPI_MPI_REQUEST_H_

#include <mpi.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace vemesh {

// Polls `request` until it completes or `deadline` passes. For the first few
// milliseconds it tests back to back, as MPI_Wait does (ranks usually arrive
// together, and a sleep would add its whole length to start-up); then it
// sleeps a little longer each time, so that early ranks do not steal the CPU
// from late ones on oversubscribed cores. DeadlineExceeded names `call`.
absl::Status WaitForMpiRequest(MPI_Request* request, absl::Time deadline,
                               absl::string_view call);

// MPI_Comm_idup of `comm`, waited for until `deadline`. MPI writes the new
// handle when the copy completes, which may be after an abandoned wait (a
// late rank comes), so on DeadlineExceeded the handle's storage is kept for
// the life of the process. Errors come from MpiStatus or WaitForMpiRequest.
absl::StatusOr<MPI_Comm> BoundedCommIdup(MPI_Comm comm, absl::Time deadline);

}  // namespace vemesh

#endif  // VEMESH_COMM_MPI_MPI_REQUEST_H_
