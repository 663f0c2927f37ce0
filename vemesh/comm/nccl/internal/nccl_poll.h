// vemesh/comm/nccl/internal/nccl_poll.h
//
// Waiting on a non-blocking NCCL communicator (ncclConfig_t::blocking = 0):
// no NCCL call waits for a peer inside vemesh; its calls return at once and
// the communicator is polled until NCCL is done, the deadline passes or
// the caller gives up.
//
//   ncclConfig_t config = NonBlockingConfig();
//   ... ncclCommInitRankConfig(&comm, n, id, rank, &config) ...
//   VEMESH_RETURN_IF_ERROR(AwaitReady(comm, "ncclCommInitRankConfig",
//                                     DeadlineAfter(timeout)));
//
//   for (int polls = 0; !done(); ++polls) Backoff(polls);
//
// Internal to the NCCL backend (needs nccl.h).

#ifndef VEMESH_COMM_NCCL_INTERNAL_NCCL_POLL_H_
#define VEMESH_COMM_NCCL_INTERNAL_NCCL_POLL_H_

#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace vemesh {

// Between two looks at something NCCL finishes in the background: spin a
// little (enqueues usually end within microseconds), then sleep so that a
// long wait leaves the CPU to NCCL's own threads.
void Backoff(int polls);

// Now + `timeout`; InfiniteFuture for an infinite timeout.
absl::Time DeadlineAfter(absl::Duration timeout);

// Polls a communicator that is not shared yet (being created or split off)
// until NCCL finished with it, or the deadline (DeadlineExceeded).
absl::Status AwaitReady(ncclComm_t comm, absl::string_view call,
                        absl::Time deadline);

// NCCL's default config, non-blocking.
ncclConfig_t NonBlockingConfig();

}  // namespace vemesh

#endif  // VEMESH_COMM_NCCL_INTERNAL_NCCL_POLL_H_
