#include "vemesh/comm/nccl/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "vemesh/comm/nccl/internal/nccl_api.h"
#include "vemesh/base/log.h"
#include "vemesh/base/status_macros.h"

namespace vemesh {
namespace {

// CUDA's answers when this process has no usable GPU (no device, a driver
// too old for the runtime, a device number that does not exist).
bool IsNoDevice(cudaError_t code) {
  return code == cudaErrorNoDevice || code == cudaErrorInsufficientDriver ||
         code == cudaErrorInvalidDevice;
}

absl::Status CudaStatus(cudaError_t code, absl::string_view call) {
  if (code == cudaSuccess) return absl::OkStatus();
  Nccl().cudaGetLastError();  // clear a non-sticky error so later calls start clean
  std::string text = absl::StrCat(call, " failed: ", Nccl().cudaGetErrorName(code),
                                  ": ", Nccl().cudaGetErrorString(code));
  return IsNoDevice(code) ? absl::FailedPreconditionError(text)
                          : absl::InternalError(text);
}

// ncclInProgress is not an error here: the caller polls it to the end.
absl::Status NcclStatus(ncclResult_t code, absl::string_view call) {
  if (code == ncclSuccess || code == ncclInProgress) return absl::OkStatus();
  // The argument of ncclGetLastError is unused (NCCL's documentation); null
  // also keeps it safe after an abort freed the communicator.
  const char* last = Nccl().ncclGetLastError(nullptr);
  std::string text =
      absl::StrCat(call, " failed: ", Nccl().ncclGetErrorString(code),
                   last != nullptr && *last != '\0' ? ": " : "",
                   last != nullptr ? last : "");
  switch (code) {
    case ncclRemoteError:  // a peer exited or the network failed
    case ncclSystemError:  // a socket or other system call failed
      return absl::UnavailableError(text);
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(text);
    default:
      return absl::InternalError(text);
  }
}

ncclDataType_t NcclDataType(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kInt8:
      return ncclInt8;
    case DataType::kUInt8:
      return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t NcclReduceOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kProd:
      return ncclProd;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kAvg:
      return ncclAvg;  // the base refuses avg of integers before this
  }
  return ncclSum;
}

// Makes `device` current for a scope and puts the caller's device back:
// abort() and the destructor may run on any thread, which must not find
// its current device changed.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (Nccl().cudaGetDevice(&previous_) != cudaSuccess) {
      Nccl().cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != device) {
      status_ = CudaStatus(Nccl().cudaSetDevice(device), "cudaSetDevice");
      changed_ = status_.ok();
    }
  }
  ~DeviceGuard() {
    if (changed_ && previous_ >= 0 && Nccl().cudaSetDevice(previous_) != cudaSuccess) {
      Nccl().cudaGetLastError();
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  bool changed_ = false;
  absl::Status status_;
};

// Between two looks at something NCCL finishes in the background: spin a
// little (enqueues usually end within microseconds), then sleep so that a
// long wait leaves the CPU to NCCL's own threads.
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

// Polls a communicator that is not shared yet (being created or split off)
// until NCCL finished with it, or the deadline.
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

// NCCL takes device memory only; a host pointer would crash inside NCCL, so
// say so up front.
absl::Status CheckDeviceBuffer(absl::string_view op, absl::string_view what,
                               const void* data, size_t count) {
  if (count == 0 || data == nullptr) return absl::OkStatus();
  cudaPointerAttributes attributes;
  cudaError_t code = Nccl().cudaPointerGetAttributes(&attributes, data);
  if (code != cudaSuccess) {
    Nccl().cudaGetLastError();
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": the ", what, " buffer is not CUDA memory (",
                     Nccl().cudaGetErrorString(code), ")"));
  }
  if (attributes.type != cudaMemoryTypeDevice &&
      attributes.type != cudaMemoryTypeManaged) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": the NCCL backend needs device or managed memory; the ", what,
        " buffer is host memory"));
  }
  return absl::OkStatus();
}

size_t Sum(const std::vector<size_t>& counts) {
  size_t total = 0;
  for (size_t c : counts) total += c;
  return total;
}

// Every buffer `op` touches on this rank, checked to be device memory.
absl::Status CheckDeviceBuffers(const Operation& op, int rank, int size) {
  const std::string name = op.Describe();
  const size_t n = static_cast<size_t>(size);
  const bool root = rank == op.root;
  auto check = [&](absl::string_view what, const void* data, size_t count) {
    return CheckDeviceBuffer(name, what, data, count);
  };
  absl::Status s;
  switch (op.kind) {
    case OpKind::kBarrier:
      break;
    case OpKind::kBroadcast:
      s = check("data", op.recv, op.count);
      break;
    case OpKind::kAllReduce:
    case OpKind::kReduce:
      s = check("send", op.send, op.count);
      if (s.ok() && (op.kind == OpKind::kAllReduce || root)) {
        s = check("recv", op.recv, op.count);
      }
      break;
    case OpKind::kAllGather:
      s = check("send", op.send, op.count);
      if (s.ok()) s = check("recv", op.recv, n * op.count);
      break;
    case OpKind::kAllGatherV:
      s = check("send", op.send, op.recv_counts[rank]);
      if (s.ok()) s = check("recv", op.recv, Sum(op.recv_counts));
      break;
    case OpKind::kReduceScatter:
      s = check("send", op.send, n * op.count);
      if (s.ok()) s = check("recv", op.recv, op.count);
      break;
    case OpKind::kReduceScatterV:
      s = check("send", op.send, Sum(op.recv_counts));
      if (s.ok()) s = check("recv", op.recv, op.recv_counts[rank]);
      break;
    case OpKind::kGather:
      s = check("send", op.send, op.count);
      if (s.ok() && root) s = check("recv", op.recv, n * op.count);
      break;
    case OpKind::kScatter:
      if (root) s = check("send", op.send, n * op.count);
      if (s.ok()) s = check("recv", op.recv, op.count);
      break;
    case OpKind::kAllToAll:
      s = check("send", op.send, n * op.count);
      if (s.ok()) s = check("recv", op.recv, n * op.count);
      break;
    case OpKind::kAllToAllV:
      s = check("send", op.send, Sum(op.send_counts));
      if (s.ok()) s = check("recv", op.recv, Sum(op.recv_counts));
      break;
    case OpKind::kBatch:
      for (const P2POp& p : op.p2p) {
        s = check(p.kind == P2POp::Kind::kSend ? "send" : "recv", p.data,
                  p.count);
        if (!s.ok()) break;
      }
      break;
  }
  return s;
}

// Makes this rank's stream and scratch buffer on `device` (current).
absl::Status MakeStream(cudaStream_t* stream, void** scratch) {
  absl::Status status = CudaStatus(
      Nccl().cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking),
      "cudaStreamCreateWithFlags");
  if (status.ok()) {
    status = CudaStatus(Nccl().cudaMalloc(scratch, sizeof(int32_t)), "cudaMalloc");
  }
  if (status.ok()) {
    status = CudaStatus(Nccl().cudaMemset(*scratch, 0, sizeof(int32_t)),
                        "cudaMemset");
  }
  return status;
}

void FreeStream(cudaStream_t stream, void* scratch) {
  if (scratch != nullptr) Nccl().cudaFree(scratch);
  if (stream != nullptr) Nccl().cudaStreamDestroy(stream);
}

ncclConfig_t NonBlockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

// NCCL builds the communicators of splits issued in one group concurrently
// from 2.27 on: the headers must have it and so must the library loaded.
bool CanGroupSplits() {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  int version = 0;
  return Nccl().ncclGetVersion(&version) == ncclSuccess &&
         version >= NCCL_VERSION(2, 27, 0);
#else
  return false;
#endif
}

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

// One enqueued operation: done when the event recorded after it completed
// on the device; failed when NCCL reports an asynchronous error.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<Communicator> owner, std::string name,
           NcclCommunicator* comm, cudaEvent_t event)
      : Work(std::move(owner), std::move(name)), comm_(comm), event_(event) {}
  ~NcclWork() override {
    DeviceGuard guard(comm_->device_);
    if (Nccl().cudaEventDestroy(event_) != cudaSuccess) Nccl().cudaGetLastError();
  }

 protected:
  std::optional<absl::Status> Poll() override {
    const cudaError_t done = Nccl().cudaEventQuery(event_);
    if (done != cudaSuccess && done != cudaErrorNotReady) {
      absl::Status failed =
          CudaStatus(done, absl::StrCat(name(), ": cudaEventQuery"));
      comm_->abort(failed.message());
      return failed;
    }
    // After an abort the kernels quit early and the event completes: the
    // state says whether the result can be trusted.
    bool in_progress = false;
    absl::Status state = comm_->State(name(), &in_progress);
    if (!state.ok()) {
      if (!absl::IsAborted(state)) comm_->abort(state.message());
      return state;
    }
    if (done == cudaSuccess) return absl::OkStatus();
    return std::nullopt;
  }

 private:
  NcclCommunicator* comm_;  // kept alive by the Work's owner
  cudaEvent_t event_;
};

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
        IsNoDevice(code) ? "no usable GPU: " : "", "cudaGetDeviceCount: ",
        Nccl().cudaGetErrorName(code), " (", static_cast<int>(code), "): ",
        Nccl().cudaGetErrorString(code)));
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
  absl::Status local = absl::OkStatus();
  auto chosen = ChooseCudaDeviceHere(request);
  const int device = chosen.ok() ? *chosen : -1;
  if (!chosen.ok()) local = chosen.status();
  std::optional<DeviceGuard> guard;
  if (local.ok()) {
    guard.emplace(device);
    local = guard->status();
  }
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
  absl::Status agreed = twin->all_gather(absl::MakeConstSpan(&ok, 1),
                                         absl::MakeSpan(oks));
  std::vector<int> failed;
  for (size_t i = 0; agreed.ok() && i < oks.size(); ++i) {
    if (oks[i] == 0) failed.push_back(twin->ranks()[i]);
  }
  if (agreed.ok() && !failed.empty()) {
    // This rank's own reason keeps its code (InvalidArgument for a bad
    // "cuda:N"); the others learn that some rank failed.
    agreed = absl::Status(
        local.ok() ? absl::StatusCode::kFailedPrecondition : local.code(),
        absl::StrCat("NCCL communicator not created: rank(s) ",
                     absl::StrJoin(failed, ", "), " could not prepare their GPU",
                     local.ok() ? "" : absl::StrCat("; this rank: ", local.message())));
  }
  static_assert(sizeof(ncclUniqueId) % sizeof(int32_t) == 0);
  if (agreed.ok()) {
    agreed = twin->broadcast(&id, sizeof(id) / sizeof(int32_t),
                             DataType::kInt32, 0);
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
    ncclResult_t state = ncclInternalError;
    const bool healthy = Nccl().ncclCommGetAsyncError(comm_, &state) == ncclSuccess &&
                         state == ncclSuccess;
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

absl::Status NcclCommunicator::State(absl::string_view op,
                                     bool* in_progress) {
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

absl::Status NcclCommunicator::WaitEnqueued(absl::string_view op) {
  const absl::Time deadline = DeadlineAfter(timeout());
  for (int polls = 0;; ++polls) {
    bool in_progress = false;
    absl::Status state = State(op, &in_progress);
    if (!state.ok() || !in_progress) return state;
    if (aborted()) return AbortedError(op);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          op, " on an nccl communicator: NCCL did not take it within ",
          absl::FormatDuration(timeout()),
          "; the communicator is aborted (a peer never joined or is stuck)"));
    }
    Backoff(polls);
  }
}

absl::Status NcclCommunicator::Enqueue(const Operation& op,
                                       CUstream_st* stream) {
  ncclComm_t comm = comm_;
  const ncclDataType_t type = NcclDataType(op.type);
  const ncclRedOp_t reduce = NcclReduceOp(op.op);
  const size_t element = SizeOf(op.type);
  const int n = size();
  const int me = rank();
  // Element `offset` of a buffer of op.type.
  auto at = [element](const void* base, size_t offset) -> void* {
    return const_cast<char*>(static_cast<const char*>(base)) +
           offset * element;
  };
  // The first failing call names the error; later calls are skipped, and
  // the group is always closed.
  ncclResult_t first = ncclSuccess;
  const char* failed_call = "";
  auto issue = [&](const char* call, auto&& enqueue) {
    if (first != ncclSuccess) return;
    const ncclResult_t code = enqueue();
    if (code != ncclSuccess && code != ncclInProgress) {
      first = code;
      failed_call = call;
    }
  };
  // A block to or from oneself in place (send and recv the same memory)
  // needs no copy.
  auto self_copy = [&](int peer, const void* send, const void* recv) {
    return peer == me && send == recv;
  };

  const ncclResult_t started = Nccl().ncclGroupStart();
  if (started != ncclSuccess) return NcclStatus(started, "ncclGroupStart");
  switch (op.kind) {
    case OpKind::kBarrier:
      // An all_reduce of one element completes on no rank before every
      // rank has entered it.
      issue("ncclAllReduce", [&] {
        return Nccl().ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm,
                             stream);
      });
      break;
    case OpKind::kBroadcast:
      issue("ncclBroadcast", [&] {
        return Nccl().ncclBroadcast(op.recv, op.recv, op.count, type, op.root, comm,
                             stream);
      });
      break;
    case OpKind::kAllReduce:
      issue("ncclAllReduce", [&] {
        return Nccl().ncclAllReduce(op.send, op.recv, op.count, type, reduce, comm,
                             stream);
      });
      break;
    case OpKind::kReduce:
      issue("ncclReduce", [&] {
        return Nccl().ncclReduce(op.send, me == op.root ? op.recv : nullptr,
                          op.count, type, reduce, op.root, comm, stream);
      });
      break;
    case OpKind::kAllGather:
      issue("ncclAllGather", [&] {
        return Nccl().ncclAllGather(op.send, op.recv, op.count, type, comm, stream);
      });
      break;
    case OpKind::kAllGatherV: {
      // One broadcast per block from its owner: NCCL's tree/ring per block
      // moves each element once per link, where send/recv pairs would make
      // every owner send its block size()-1 times.
      size_t offset = 0;
      for (int i = 0; i < n; ++i) {
        const size_t c = op.recv_counts[i];
        if (c > 0) {
          void* block = at(op.recv, offset);
          const void* source = i == me ? op.send : block;
          issue("ncclBroadcast", [&] {
            return Nccl().ncclBroadcast(source, block, c, type, i, comm, stream);
          });
        }
        offset += c;
      }
      break;
    }
    case OpKind::kReduceScatter:
      issue("ncclReduceScatter", [&] {
        return Nccl().ncclReduceScatter(op.send, op.recv, op.count, type, reduce,
                                 comm, stream);
      });
      break;
    case OpKind::kReduceScatterV: {
      // Block i reduced to its owner i.
      size_t offset = 0;
      for (int i = 0; i < n; ++i) {
        const size_t c = op.recv_counts[i];
        if (c > 0) {
          const void* block = at(op.send, offset);
          void* out = i == me ? op.recv : nullptr;
          issue("ncclReduce", [&] {
            return Nccl().ncclReduce(block, out, c, type, reduce, i, comm, stream);
          });
        }
        offset += c;
      }
      break;
    }
    case OpKind::kGather:
      if (op.count == 0) break;
      for (int i = 0; me == op.root && i < n; ++i) {
        void* block = at(op.recv, static_cast<size_t>(i) * op.count);
        if (self_copy(i, op.send, block)) continue;
        issue("ncclRecv", [&] {
          return Nccl().ncclRecv(block, op.count, type, i, comm, stream);
        });
      }
      if (!self_copy(op.root, op.send,
                     me == op.root
                         ? at(op.recv, static_cast<size_t>(me) * op.count)
                         : nullptr)) {
        issue("ncclSend", [&] {
          return Nccl().ncclSend(op.send, op.count, type, op.root, comm, stream);
        });
      }
      break;
    case OpKind::kScatter:
      if (op.count == 0) break;
      for (int i = 0; me == op.root && i < n; ++i) {
        const void* block = at(op.send, static_cast<size_t>(i) * op.count);
        if (self_copy(i, block, op.recv)) continue;
        issue("ncclSend", [&] {
          return Nccl().ncclSend(block, op.count, type, i, comm, stream);
        });
      }
      if (!self_copy(op.root,
                     me == op.root
                         ? at(op.send, static_cast<size_t>(me) * op.count)
                         : nullptr,
                     op.recv)) {
        issue("ncclRecv", [&] {
          return Nccl().ncclRecv(op.recv, op.count, type, op.root, comm, stream);
        });
      }
      break;
    case OpKind::kAllToAll:
      if (op.count == 0) break;
      for (int i = 0; i < n; ++i) {
        const size_t offset = static_cast<size_t>(i) * op.count;
        issue("ncclSend", [&] {
          return Nccl().ncclSend(at(op.send, offset), op.count, type, i, comm,
                          stream);
        });
        issue("ncclRecv", [&] {
          return Nccl().ncclRecv(at(op.recv, offset), op.count, type, i, comm,
                          stream);
        });
      }
      break;
    case OpKind::kAllToAllV: {
      size_t send_offset = 0;
      size_t recv_offset = 0;
      for (int i = 0; i < n; ++i) {
        const size_t s = op.send_counts[i];
        const size_t r = op.recv_counts[i];
        if (s > 0) {
          issue("ncclSend", [&] {
            return Nccl().ncclSend(at(op.send, send_offset), s, type, i, comm,
                            stream);
          });
        }
        if (r > 0) {
          issue("ncclRecv", [&] {
            return Nccl().ncclRecv(at(op.recv, recv_offset), r, type, i, comm,
                            stream);
          });
        }
        send_offset += s;
        recv_offset += r;
      }
      break;
    }
    case OpKind::kBatch:
      for (const P2POp& p : op.p2p) {
        if (p.count == 0) continue;
        const ncclDataType_t t = NcclDataType(p.type);
        if (p.kind == P2POp::Kind::kSend) {
          issue("ncclSend", [&] {
            return Nccl().ncclSend(p.data, p.count, t, p.peer, comm, stream);
          });
        } else {
          issue("ncclRecv", [&] {
            return Nccl().ncclRecv(p.data, p.count, t, p.peer, comm, stream);
          });
        }
      }
      break;
  }
  const ncclResult_t ended = Nccl().ncclGroupEnd();  // always close the group
  if (first != ncclSuccess) {
    return NcclStatus(first, absl::StrCat(op.Describe(), ": ", failed_call));
  }
  return NcclStatus(ended, absl::StrCat(op.Describe(), ": ncclGroupEnd"));
}

Communicator::WorkOr NcclCommunicator::Start(const Operation& op) {
  std::string name = op.Describe();
  DeviceGuard guard(device_);
  if (!guard.status().ok()) return guard.status();
  absl::Status status = CheckDeviceBuffers(op, rank(), size());
  if (!status.ok()) return status;
  cudaStream_t stream =
      op.stream != nullptr ? static_cast<cudaStream_t>(op.stream) : stream_;
  cudaEvent_t event = nullptr;
  status = CudaStatus(Nccl().cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                      "cudaEventCreateWithFlags");
  if (!status.ok()) return status;
  // The Work owns the event from here, whatever happens next.
  auto work = std::make_shared<NcclWork>(Self(), name, this, event);
  {
    std::lock_guard<std::mutex> lock(comm_mu_);
    status = comm_ == nullptr ? AbortedError(name) : Enqueue(op, stream);
  }
  if (status.ok()) status = WaitEnqueued(name);
  // Only once NCCL has the operation in hand may the stream get more work
  // (NCCL's rule for non-blocking communicators).
  if (status.ok()) {
    status = CudaStatus(Nccl().cudaEventRecord(event, stream),
                        absl::StrCat(name, ": cudaEventRecord"));
  }
  if (!status.ok()) {
    // Handed to NCCL and failed: the ranks are out of step, and NCCL
    // cannot use a communicator with an error again.
    if (!absl::IsAborted(status)) abort(status.message());
    return status;
  }
  return std::shared_ptr<Work>(std::move(work));
}

absl::StatusOr<std::shared_ptr<Communicator>> NcclCommunicator::split(
    int color, int key) {
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
  if (options_.group_splits && CanGroupSplits()) {
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
    if (children[i] != nullptr) status = MakeStream(&streams[i], &scratch[i]);
  }
  if (!status.ok()) {
    for (size_t i = 0; i < n; ++i) {
      if (children[i] != nullptr) Nccl().ncclCommAbort(children[i]);
      FreeStream(streams[i], scratch[i]);
    }
    // The other ranks are in the splits too: they must not wait for us.
    if (!absl::IsAborted(status)) abort(status.message());
    return status;
  }
  std::vector<std::shared_ptr<Communicator>> groups(n);
  for (size_t i = 0; i < n; ++i) {
    if (requests[i].color < 0) continue;
    groups[i] = std::shared_ptr<Communicator>(
        new NcclCommunicator(std::move(twins[i]), device_, options_,
                             children[i], streams[i], scratch[i]));
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
    if (pending.empty()) return absl::OkStatus();
    if (aborted()) return AbortedError("split");
    if (absl::Now() >= deadline) {
      std::vector<std::string> names;
      for (size_t i : pending) {
        names.push_back(SplitRequestName(requests[i], first + i));
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "ncclCommSplit of ", absl::StrJoin(names, ", "),
          " did not finish before the deadline (a peer never joined?)"));
    }
    Backoff(polls);
  }
}

NativeHandle NcclCommunicator::native_handle() const {
  std::lock_guard<std::mutex> lock(comm_mu_);
  return NativeHandle{"nccl", comm_};
}

}  // namespace vemesh
