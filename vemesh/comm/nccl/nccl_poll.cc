#include "vemesh/comm/nccl/internal/nccl_poll.h"

#include <sched.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "vemesh/comm/nccl/internal/nccl_api.h"
#include "vemesh/comm/nccl/internal/nccl_status.h"

namespace vemesh {

void Backoff(int polls) {
  if (polls < 64) {
    sched_yield();
  } else {
    absl::SleepFor(absl::Microseconds(50));
  }
}

absl::Time DeadlineAfter(absl::Duration timeout) {
  return timeout == absl::InfiniteDuration() ? absl::InfiniteFuture()
                                             : absl::Now() + timeout;
}

absl::Status AwaitReady(ncclComm_t comm, absl::string_view call,
                        absl::Time deadline) {
  for (int polls = 0;; ++polls) {
    ncclResult_t state = ncclInProgress;
    ncclResult_t code = Nccl().ncclCommGetAsyncError(comm, &state);
    if (code != ncclSuccess) return NcclStatus(code, "ncclCommGetAsyncError");
    if (state != ncclInProgress) return NcclStatus(state, call);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          call, " did not finish before the deadline (a peer never joined?)"));
    }
    Backoff(polls);
  }
}

ncclConfig_t NonBlockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

}  // namespace vemesh
