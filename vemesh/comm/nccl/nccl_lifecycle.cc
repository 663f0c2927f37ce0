// An NCCL communicator's life: made over its host twin (the unique id
// broadcast over it, every rank agreeing first that its GPU is ready),
// destroyed or aborted (ncclCommAbort, from any thread), and its state
// looked at in between.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/base/log.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/nccl/internal/cuda_resources.h"
#include "vemesh/comm/nccl/internal/nccl_api.h"
#include "vemesh/comm/nccl/internal/nccl_poll.h"
#include "vemesh/comm/nccl/internal/nccl_status.h"
#include "vemesh/comm/nccl/nccl_communicator.h"

namespace vemesh {

absl::StatusOr<int> CudaDeviceCount() {
  // The first use of the backend loads libcudart and libnccl: every path
  // into it (ChooseCudaDeviceHere, NcclCommunicator::Create) comes here
  // first, so a missing library is Unavailable saying which and why.
  VEMESH_RETURN_IF_ERROR(LoadNccl().status());
  int count = 0;
  cudaError_t code = Nccl().cudaGetDeviceCount(&count);
  if (code != cudaSuccess) {
    Nccl().cudaGetLastError();
    // No device, or no driver (cudaErrorInsufficientDriver, 35: what a
    // machine without a GPU answers): both mean no GPU for this process.
    return absl::FailedPreconditionError(absl::StrCat(
        IsNoDevice(code) ? "no usable GPU: " : "",
        "cudaGetDeviceCount: ", Nccl().cudaGetErrorName(code), " (",
        static_cast<int>(code), "): ", Nccl().cudaGetErrorString(code)));
  }
  if (count == 0) {
    return absl::FailedPreconditionError(
        "no usable GPU: cudaGetDeviceCount found 0 devices");
  }
  return count;
}

absl::StatusOr<std::shared_ptr<Communicator>> CreateNcclCommunicator(
    std::shared_ptr<Communicator> twin, int device,
    const NcclOptions& options) {
  auto comm = NcclCommunicator::Create(std::move(twin), device, options);
  if (!comm.ok()) return comm.status();
  return std::shared_ptr<Communicator>(*std::move(comm));
}

absl::StatusOr<std::shared_ptr<Communicator>> CreateNcclCommunicator(
    std::shared_ptr<Communicator> twin, const CudaDeviceRequest& request,
    const NcclOptions& options) {
  auto comm = NcclCommunicator::Create(std::move(twin), request, options);
  if (!comm.ok()) return comm.status();
  return std::shared_ptr<Communicator>(*std::move(comm));
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<Communicator> twin,
                                   int device, const NcclOptions& options,
                                   ncclComm* comm, CUstream_st* stream,
                                   void* scratch)
    : twin_(std::move(twin)),
      device_(device),
      options_(options),
      comm_(comm),
      stream_(stream),
      scratch_(scratch) {}

absl::StatusOr<std::shared_ptr<NcclCommunicator>> NcclCommunicator::Create(
    std::shared_ptr<Communicator> twin, int device,
    const NcclOptions& options) {
  // An explicit device is a request for exactly that one; a negative one
  // must not fall back to the host-local rank.
  CudaDeviceRequest request;
  request.requested = device < 0 ? -2 : device;
  return Create(std::move(twin), request, options);
}

absl::StatusOr<std::shared_ptr<NcclCommunicator>> NcclCommunicator::Create(
    std::shared_ptr<Communicator> twin, const CudaDeviceRequest& request,
    const NcclOptions& options) {
  if (twin == nullptr) {
    return absl::InvalidArgumentError(
        "NcclCommunicator needs a host communicator as its twin (got null)");
  }
  // Everything that can fail locally happens before the first NCCL
  // collective, and the ranks agree on it: one rank failing must not leave
  // the others waiting in ncclCommInitRankConfig.
  std::optional<DeviceGuard> guard;
  const PreparedDevice prepared = PrepareDevice(request, &guard);
  const int device = prepared.device;
  absl::Status local = prepared.status;
  cudaStream_t stream = nullptr;
  void* scratch = nullptr;
  if (local.ok()) local = MakeStream(&stream, &scratch);
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (local.ok() && twin->rank() == 0) {
    local = NcclStatus(Nccl().ncclGetUniqueId(&id), "ncclGetUniqueId");
  }
  int ok = local.ok() ? 1 : 0;
  std::vector<int> oks(static_cast<size_t>(twin->size()));
  absl::Status agreed =
      twin->all_gather(absl::MakeConstSpan(&ok, 1), absl::MakeSpan(oks));
  std::vector<int> failed;
  for (size_t i = 0; agreed.ok() && i < oks.size(); ++i) {
    if (oks[i] == 0) failed.push_back(twin->ranks()[i]);
  }
  if (agreed.ok() && !failed.empty()) {
    // This rank's own reason keeps its code (InvalidArgument for a bad
    // "cuda:N"); the others learn that some rank failed.
    agreed = absl::Status(
        local.ok() ? absl::StatusCode::kFailedPrecondition : local.code(),
        absl::StrCat(
            "NCCL communicator not created: rank(s) ",
            absl::StrJoin(failed, ", "), " could not prepare their GPU",
            local.ok() ? "" : absl::StrCat("; this rank: ", local.message())));
  }
  static_assert(sizeof(ncclUniqueId) % sizeof(int32_t) == 0);
  if (agreed.ok()) {
    agreed =
        twin->broadcast(&id, sizeof(id) / sizeof(int32_t), DataType::kInt32, 0);
  }
  ncclComm_t comm = nullptr;
  if (agreed.ok()) {
    ncclConfig_t config = NonBlockingConfig();
    agreed = NcclStatus(Nccl().ncclCommInitRankConfig(&comm, twin->size(), id,
                                                      twin->rank(), &config),
                        "ncclCommInitRankConfig");
    if (agreed.ok()) {
      agreed = AwaitReady(comm, "ncclCommInitRankConfig",
                          DeadlineAfter(twin->timeout()));
    }
  }
  if (!agreed.ok()) {
    if (comm != nullptr) Nccl().ncclCommAbort(comm);
    FreeStream(stream, scratch);
    return agreed;
  }
  return std::shared_ptr<NcclCommunicator>(new NcclCommunicator(
      std::move(twin), device, options, comm, stream, scratch));
}

NcclCommunicator::~NcclCommunicator() {
  DeviceGuard guard(device_);
  std::lock_guard<std::mutex> lock(comm_mu_);
  if (comm_ != nullptr) {
    // A communicator with an error cannot flush: abort it, as NCCL asks.
    // After any abort (here or of a sibling) or a shrink, a destroy could
    // wait for peers that are gone: abort too (NCCL's rule).
    ncclResult_t state = ncclInternalError;
    const bool healthy =
        !lineage_aborted_->load(std::memory_order_acquire) &&
        Nccl().ncclCommGetAsyncError(comm_, &state) == ncclSuccess &&
        state == ncclSuccess;
    if (!healthy) lineage_aborted_->store(true, std::memory_order_release);
    const ncclResult_t code =
        healthy ? Nccl().ncclCommDestroy(comm_) : Nccl().ncclCommAbort(comm_);
    if (code != ncclSuccess) {
      LogWarning(absl::StrCat(healthy ? "ncclCommDestroy" : "ncclCommAbort",
                              " failed: ", Nccl().ncclGetErrorString(code)));
    }
    comm_ = nullptr;
  }
  FreeStream(stream_, scratch_);
}

size_t NcclCommunicator::MaxCount() const {
  // The byte length of the largest element type must still fit a size_t.
  return std::numeric_limits<size_t>::max() / sizeof(double);
}

void NcclCommunicator::OnAbort() {
  lineage_aborted_->store(true, std::memory_order_release);
  std::lock_guard<std::mutex> lock(comm_mu_);
  if (comm_ == nullptr) return;
  DeviceGuard guard(device_);
  // Stops the kernels and NCCL's threads, joins a pending enqueue, and
  // frees the communicator: nothing may use comm_ afterwards.
  const ncclResult_t code = Nccl().ncclCommAbort(comm_);
  comm_ = nullptr;
  if (code != ncclSuccess) {
    LogWarning(absl::StrCat("ncclCommAbort failed: ",
                            Nccl().ncclGetErrorString(code)));
  }
}

absl::Status NcclCommunicator::State(absl::string_view op, bool* in_progress) {
  *in_progress = false;
  std::lock_guard<std::mutex> lock(comm_mu_);
  if (comm_ == nullptr) return AbortedError(op);
  ncclResult_t state = ncclSuccess;
  const ncclResult_t code = Nccl().ncclCommGetAsyncError(comm_, &state);
  if (code != ncclSuccess) {
    return NcclStatus(code, absl::StrCat(op, ": ncclCommGetAsyncError"));
  }
  *in_progress = state == ncclInProgress;
  return NcclStatus(state, absl::StrCat(op, ": NCCL reported an error"));
}

NativeHandle NcclCommunicator::native_handle() const {
  std::lock_guard<std::mutex> lock(comm_mu_);
  return NativeHandle{BackendName(Backend::kNccl), comm_};
}

}  // namespace vemesh
