#include "vemesh/comm/mpi/mpi_request.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "vemesh/comm/mpi/mpi_environment.h"

namespace vemesh {

absl::Status WaitForMpiRequest(MPI_Request* request, absl::Time deadline,
                               absl::string_view call) {
  // Back to back for the first 100 ms: a sleeping rank does not drive MPI's
  // progress, so a sleep in a step of a many-round collective (an idup's
  // context-id allreduces at 64 oversubscribed ranks take tens of ms) adds
  // up to the sleep to every round (issue 32). Later, sleeps spare the core
  // while a late rank is awaited.
  // The clock is read once per test (not twice), and only from the
  // 33rd test on: at low load most requests complete within a few tests,
  // and each read is a library call (issue 32: ~2 us per creation). A
  // deadline is thus noticed at most 32 tests (microseconds) late.
  constexpr int kTestsBeforeClock = 32;
  int tests = 0;
  absl::Time spin_until = absl::InfiniteFuture();
  auto pause = std::chrono::microseconds(20);
  while (true) {
    int done = 0;
    absl::Status status =
        MpiStatus(MPI_Test(request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (!status.ok() || done) return status;
    if (tests < kTestsBeforeClock) {
      ++tests;
      continue;
    }
    const absl::Time now = absl::Now();
    if (tests == kTestsBeforeClock) {
      ++tests;
      spin_until = now + absl::Milliseconds(100);
    }
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "waited past the deadline for the other ranks to arrive (", call,
          " did not complete). Some rank never made this call; a collective "
          "is left pending, so MPI is unusable now: end the job (return from "
          "main or exit: vemesh skips the MPI_Finalize that would wait for "
          "the missing ranks)."));
    }
    // MPI_Test drives MPI's progress, and Open MPI yields the core inside
    // it when the host is oversubscribed (mpi_yield_when_idle): a yield of
    // our own here made every step slower than MPI_Wait on shared cores.
    if (now < spin_until) continue;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

absl::StatusOr<MPI_Comm> BoundedCommIdup(MPI_Comm comm, absl::Time deadline) {
  // MPI writes the new handle when the copy completes, which may be after
  // an abandoned wait (a late rank comes): the handle outlives this call.
  auto held = std::make_unique<MPI_Comm>(MPI_COMM_NULL);
  MPI_Request request = MPI_REQUEST_NULL;
  absl::Status status =
      MpiStatus(MPI_Comm_idup(comm, held.get(), &request), "MPI_Comm_idup");
  if (status.ok())
    status = WaitForMpiRequest(&request, deadline, "MPI_Comm_idup");
  if (absl::IsDeadlineExceeded(status)) {
    held.release();  // kept for the life of the process
  }
  if (!status.ok()) return status;
  return *held;
}

}  // namespace vemesh
