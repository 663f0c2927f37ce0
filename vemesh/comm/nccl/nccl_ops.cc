// The operations of the NCCL backend: each checked to touch device memory
// only, enqueued as one NCCL group on the caller's stream or the
// communicator's own, and finished by a Work that polls the CUDA event
// recorded after it (nccl_communicator.h says how each maps to NCCL).

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "vemesh/comm/nccl/internal/cuda_resources.h"
#include "vemesh/comm/nccl/internal/nccl_api.h"
#include "vemesh/comm/nccl/internal/nccl_poll.h"
#include "vemesh/comm/nccl/internal/nccl_status.h"
#include "vemesh/comm/nccl/nccl_communicator.h"

namespace vemesh {
namespace {

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

}  // namespace

// One enqueued operation: done when the event recorded after it completed
// on the device; failed when NCCL reports an asynchronous error.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<Communicator> owner, std::string name,
           NcclCommunicator* comm, cudaEvent_t event)
      : Work(std::move(owner), std::move(name)), comm_(comm), event_(event) {
    comm_->in_flight_.fetch_add(1, std::memory_order_acq_rel);
  }
  ~NcclWork() override {
    Finished();
    DeviceGuard guard(comm_->device_);
    if (Nccl().cudaEventDestroy(event_) != cudaSuccess)
      Nccl().cudaGetLastError();
  }

 protected:
  std::optional<absl::Status> Poll() override {
    std::optional<absl::Status> result = PollOnce();
    if (result.has_value()) Finished();
    return result;
  }

 private:
  // No longer in flight (once): shrink then needs no NCCL_SHRINK_ABORT.
  void Finished() {
    if (!counted_) return;
    counted_ = false;
    comm_->in_flight_.fetch_sub(1, std::memory_order_acq_rel);
  }
  std::optional<absl::Status> PollOnce() {
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

  bool counted_ = true;
  NcclCommunicator* comm_;  // kept alive by the Work's owner
  cudaEvent_t event_;
};

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
    return const_cast<char*>(static_cast<const char*>(base)) + offset * element;
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
        return Nccl().ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum,
                                    comm, stream);
      });
      break;
    case OpKind::kBroadcast:
      issue("ncclBroadcast", [&] {
        return Nccl().ncclBroadcast(op.recv, op.recv, op.count, type, op.root,
                                    comm, stream);
      });
      break;
    case OpKind::kAllReduce:
      issue("ncclAllReduce", [&] {
        return Nccl().ncclAllReduce(op.send, op.recv, op.count, type, reduce,
                                    comm, stream);
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
        return Nccl().ncclAllGather(op.send, op.recv, op.count, type, comm,
                                    stream);
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
            return Nccl().ncclBroadcast(source, block, c, type, i, comm,
                                        stream);
          });
        }
        offset += c;
      }
      break;
    }
    case OpKind::kReduceScatter:
      issue("ncclReduceScatter", [&] {
        return Nccl().ncclReduceScatter(op.send, op.recv, op.count, type,
                                        reduce, comm, stream);
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
            return Nccl().ncclReduce(block, out, c, type, reduce, i, comm,
                                     stream);
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
          return Nccl().ncclSend(op.send, op.count, type, op.root, comm,
                                 stream);
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
          return Nccl().ncclRecv(op.recv, op.count, type, op.root, comm,
                                 stream);
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
  status = CudaStatus(
      Nccl().cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
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

}  // namespace vemesh
