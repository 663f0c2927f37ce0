// Splitting an NCCL communicator: the host twin first, then every
// ncclCommSplit (in one NCCL group from 2.27 on), the children polled
// together until all are ready (nccl_communicator.h).

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/nccl/internal/cuda_resources.h"
#include "vemesh/comm/nccl/internal/nccl_api.h"
#include "vemesh/comm/nccl/internal/nccl_poll.h"
#include "vemesh/comm/nccl/internal/nccl_status.h"
#include "vemesh/comm/nccl/nccl_communicator.h"

namespace vemesh {
namespace {

// The config of one ncclCommSplit: non-blocking like its parent, named
// after the group (NCCL keeps the pointer during the split: `name` must
// outlive it), sharing the parent's resources when asked. Fields newer than
// the headers are left out.
ncclConfig_t SplitConfig([[maybe_unused]] const std::string& name,
                         [[maybe_unused]] const NcclOptions& options) {
  ncclConfig_t config = NonBlockingConfig();
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
  config.splitShare = options.split_share ? 1 : 0;
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  if (!name.empty()) config.commName = name.c_str();
#endif
  return config;
}

// "ncclCommSplit of 'TP' (color 1, key 0)", for errors.
std::string SplitCall(const SplitRequest& request, size_t index) {
  return absl::StrCat("ncclCommSplit of ", SplitRequestName(request, index),
                      " (color ", request.color, ", key ", request.key, ")");
}

}  // namespace

absl::StatusOr<std::shared_ptr<Communicator>> NcclCommunicator::split(int color,
                                                                      int key) {
  const SplitRequest request{color, key, ""};
  VEMESH_ASSIGN_OR_RETURN(auto groups,
                          split_many(absl::MakeConstSpan(&request, 1)));
  return std::move(groups[0]);
}

absl::StatusOr<std::vector<std::shared_ptr<Communicator>>>
NcclCommunicator::split_many(absl::Span<const SplitRequest> requests,
                             absl::Time deadline) {
  const size_t n = requests.size();
  // The host side first: one twin split per request, in order, on every
  // rank. The twins answer ranks() and carry later bootstraps.
  std::vector<std::shared_ptr<Communicator>> twins;
  twins.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    auto twin = twin_->split(requests[i].color, requests[i].key);
    if (!twin.ok()) {
      return absl::Status(
          twin.status().code(),
          absl::StrCat("split ", SplitRequestName(requests[i], i),
                       " of the host twin: ", twin.status().message()));
    }
    twins.push_back(*std::move(twin));
  }
  if (n == 0) return std::vector<std::shared_ptr<Communicator>>();
  if (aborted()) return AbortedError("split");
  DeviceGuard guard(device_);
  if (!guard.status().ok()) return guard.status();
  deadline = std::min(deadline, DeadlineAfter(timeout()));

  // NCCL writes child i into children[i]: both vectors are sized once and
  // outlive the splits (a failure aborts the parent, which ends NCCL's
  // background work, before they go).
  std::vector<ncclComm_t> children(n, nullptr);
  std::vector<ncclConfig_t> configs;
  configs.reserve(n);
  for (const SplitRequest& r : requests) {
    configs.push_back(SplitConfig(r.name, options_));
  }
  // One ncclCommSplit on the parent (comm_mu_ held).
  auto issue = [&](size_t i) {
    const SplitRequest& r = requests[i];
    return NcclStatus(
        Nccl().ncclCommSplit(comm_, r.color < 0 ? NCCL_SPLIT_NOCOLOR : r.color,
                             r.key, &children[i], &configs[i]),
        SplitCall(r, i));
  };
  absl::Status status;
  // Children that share the parent's resources are built one at a time:
  // NCCL 2.28.9 builds grouped splits on concurrent threads, and with
  // splitShare those race on the shared stream ("host threads racing to
  // launch NCCL on same device", ncclInvalidUsage; seen on an H200).
  // Grouped splits are built concurrently from NCCL 2.27 on.
  if (options_.group_splits && !options_.split_share && NcclAtLeast227()) {
    // Every split in one group: the calls only record the splits, and
    // ncclGroupEnd hands them to NCCL together (ncclInProgress: the
    // non-blocking parent builds them in the background).
    {
      std::lock_guard<std::mutex> lock(comm_mu_);
      if (comm_ == nullptr) {
        status = AbortedError("split");
      } else {
        status = NcclStatus(Nccl().ncclGroupStart(), "ncclGroupStart");
        if (status.ok()) {
          for (size_t i = 0; i < n && status.ok(); ++i) status = issue(i);
          // Always closed, also after a failed split.
          const absl::Status ended =
              NcclStatus(Nccl().ncclGroupEnd(), "ncclGroupEnd");
          if (status.ok()) status = ended;
        }
      }
    }
    if (status.ok()) status = AwaitSplits(requests, children, 0, deadline);
  } else {
    // One split at a time, each ready before the next is issued.
    for (size_t i = 0; i < n && status.ok(); ++i) {
      {
        std::lock_guard<std::mutex> lock(comm_mu_);
        status = comm_ == nullptr ? AbortedError("split") : issue(i);
      }
      if (status.ok()) {
        status = AwaitSplits(requests.subspan(i, 1),
                             absl::MakeConstSpan(children).subspan(i, 1), i,
                             deadline);
      }
    }
  }

  std::vector<cudaStream_t> streams(n, nullptr);
  std::vector<void*> scratch(n, nullptr);
  for (size_t i = 0; i < n && status.ok(); ++i) {
    if (requests[i].color >= 0 && children[i] != nullptr) {
      status = MakeStream(&streams[i], &scratch[i]);
    }
  }
  if (!status.ok()) {
    for (size_t i = 0; i < n; ++i) {
      // A negative color's slot is NCCL's to write, never a communicator.
      if (requests[i].color >= 0 && children[i] != nullptr) {
        Nccl().ncclCommAbort(children[i]);
      }
      FreeStream(streams[i], scratch[i]);
    }
    // The other ranks are in the splits too: they must not wait for us.
    if (!absl::IsAborted(status)) abort(status.message());
    return status;
  }
  std::vector<std::shared_ptr<Communicator>> groups(n);
  for (size_t i = 0; i < n; ++i) {
    if (requests[i].color < 0) continue;
    auto* child = new NcclCommunicator(std::move(twins[i]), device_, options_,
                                       children[i], streams[i], scratch[i]);
    child->lineage_aborted_ = lineage_aborted_;
    groups[i] = std::shared_ptr<Communicator>(child);
  }
  return groups;
}

absl::Status NcclCommunicator::AwaitSplits(
    absl::Span<const SplitRequest> requests,
    absl::Span<ncclComm* const> children, size_t first, absl::Time deadline) {
  std::vector<bool> ready(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    ready[i] = requests[i].color < 0;  // no group, nothing to wait for
  }
  for (int polls = 0;; ++polls) {
    // The parent first: it reports a split that failed before making a
    // child, and says whether NCCL is still working on the splits.
    bool parent_busy = false;
    absl::Status parent = State("split", &parent_busy);
    if (!parent.ok()) return parent;
    std::vector<size_t> pending;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (ready[i]) continue;
      if (children[i] == nullptr) {
        if (!parent_busy) {
          return absl::InternalError(
              absl::StrCat(SplitCall(requests[i], first + i),
                           " gave no communicator for a non-negative color"));
        }
        pending.push_back(i);
        continue;
      }
      ncclResult_t state = ncclInProgress;
      const ncclResult_t code =
          Nccl().ncclCommGetAsyncError(children[i], &state);
      if (code != ncclSuccess) {
        return NcclStatus(code, absl::StrCat(SplitCall(requests[i], first + i),
                                             ": ncclCommGetAsyncError"));
      }
      if (state == ncclInProgress) {
        pending.push_back(i);
      } else if (state == ncclSuccess) {
        ready[i] = true;
      } else {
        return NcclStatus(state, SplitCall(requests[i], first + i));
      }
    }
    // Done when every child is ready *and* the parent is idle: NCCL's
    // background job of a split writes the caller's `newcomm` (also the null
    // of a negative color, which has no child to poll) and reads its config
    // until it ends, and both live in split_many's frame. Returning while
    // the parent is busy let that write land in freed memory (seen on an
    // H200, NCCL 2.28.9: a heap corruption after a one-rank split(-1)).
    if (pending.empty() && !parent_busy) return absl::OkStatus();
    // An abort from another thread is seen through State() above, which
    // answers Aborted only once OnAbort's ncclCommAbort has ended NCCL's
    // background work (comm_mu_): returning on the aborted flag alone,
    // set before that, could free the frame under NCCL's late write.
    if (absl::Now() >= deadline) {
      std::vector<std::string> names;
      for (size_t i : pending) {
        names.push_back(SplitRequestName(requests[i], first + i));
      }
      if (names.empty()) {
        for (size_t i = 0; i < requests.size(); ++i) {
          names.push_back(SplitRequestName(requests[i], first + i));
        }
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "ncclCommSplit of ", absl::StrJoin(names, ", "),
          " did not finish before the deadline (a peer never joined?)"));
    }
    Backoff(polls);
  }
}

}  // namespace vemesh
