#include "vemesh/comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/comm/mpi/mpi_environment.h"

namespace vemesh {
namespace {

absl::Status CudaStatus(cudaError_t code, absl::string_view call) {
  if (code == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, " failed: ",
                                          cudaGetErrorName(code), ": ",
                                          cudaGetErrorString(code)));
}

absl::Status NcclStatus(ncclResult_t code, absl::string_view call,
                        ncclComm_t comm = nullptr) {
  if (code == ncclSuccess) return absl::OkStatus();
  const char* last = ncclGetLastError(comm);
  return absl::InternalError(absl::StrCat(call, " failed: ",
                                          ncclGetErrorString(code),
                                          last && *last ? ": " : "",
                                          last ? last : ""));
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
  }
  return ncclFloat32;
}

ncclRedOp_t NcclReduceOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

// NCCL takes device memory only; a host pointer would crash inside NCCL,
// so say so up front.
absl::Status CheckDeviceBuffer(absl::string_view op, const void* data,
                               size_t count) {
  if (count == 0) return absl::OkStatus();
  if (data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, " got a null buffer for ", count, " elements"));
  }
  cudaPointerAttributes attributes;
  cudaError_t code = cudaPointerGetAttributes(&attributes, data);
  if (code != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": buffer is not CUDA memory (", cudaGetErrorString(code), ")"));
  }
  if (attributes.type != cudaMemoryTypeDevice &&
      attributes.type != cudaMemoryTypeManaged) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": the NCCL backend needs device or managed memory; the buffer "
            "is host memory"));
  }
  return absl::OkStatus();
}

// Makes this rank's stream and scratch buffer on `device`.
absl::Status MakeStream(int device, cudaStream_t* stream, void** scratch) {
  absl::Status status = CudaStatus(cudaSetDevice(device), "cudaSetDevice");
  if (status.ok()) {
    status = CudaStatus(
        cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking),
        "cudaStreamCreateWithFlags");
  }
  if (status.ok()) {
    status = CudaStatus(cudaMalloc(scratch, sizeof(int32_t)), "cudaMalloc");
  }
  if (status.ok()) {
    status = CudaStatus(cudaMemset(*scratch, 0, sizeof(int32_t)),
                        "cudaMemset");
  }
  return status;
}

void FreeStream(int device, cudaStream_t stream, void* scratch) {
  if (stream == nullptr && scratch == nullptr) return;
  cudaSetDevice(device);
  if (scratch != nullptr) cudaFree(scratch);
  if (stream != nullptr) cudaStreamDestroy(stream);
}

}  // namespace

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  cudaError_t code = cudaGetDeviceCount(&count);
  if (code != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "cudaGetDeviceCount: ", cudaGetErrorName(code), ": ",
        cudaGetErrorString(code)));
  }
  if (count == 0) {
    return absl::FailedPreconditionError("cudaGetDeviceCount found 0 devices");
  }
  return count;
}

absl::StatusOr<std::shared_ptr<Communicator>> CreateNcclCommunicator(
    std::shared_ptr<Communicator> twin, int device) {
  auto comm = NcclCommunicator::Create(std::move(twin), device);
  if (!comm.ok()) return comm.status();
  return std::shared_ptr<Communicator>(*std::move(comm));
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<Communicator> twin,
                                   int device, ncclComm* comm,
                                   CUstream_st* stream)
    : twin_(std::move(twin)), device_(device), comm_(comm), stream_(stream) {}

absl::StatusOr<std::shared_ptr<NcclCommunicator>> NcclCommunicator::Create(
    std::shared_ptr<Communicator> twin, int device) {
  if (twin == nullptr) {
    return absl::InvalidArgumentError("NcclCommunicator needs a host communicator as its twin (got null)");
  }
  // Everything that can fail locally happens before the first NCCL
  // collective, and the ranks agree on it: one rank failing must not leave
  // the others waiting in ncclCommInitRank.
  absl::Status local = absl::OkStatus();
  auto count = CudaDeviceCount();
  if (!count.ok()) {
    local = count.status();
  } else if (device < 0 || device >= *count) {
    local = absl::FailedPreconditionError(absl::StrCat(
        "CUDA device ", device, " does not exist: this process sees ", *count,
        " device(s) (more ranks on this host than GPUs?)"));
  }
  cudaStream_t stream = nullptr;
  void* scratch = nullptr;
  if (local.ok()) local = MakeStream(device, &stream, &scratch);
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (local.ok() && twin->rank() == 0) {
    local = NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId");
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
    agreed = absl::FailedPreconditionError(absl::StrCat(
        "NCCL communicator not created: rank(s) ", absl::StrJoin(failed, ", "),
        " could not prepare their GPU",
        local.ok() ? "" : absl::StrCat("; this rank: ", local.message())));
  }
  if (agreed.ok()) {
    agreed = twin->broadcast(reinterpret_cast<char*>(&id), sizeof(id) / 4,
                             DataType::kInt32, 0);
  }
  ncclComm_t comm = nullptr;
  if (agreed.ok()) {
    agreed = NcclStatus(ncclCommInitRank(&comm, twin->size(), id, twin->rank()),
                        "ncclCommInitRank");
  }
  if (!agreed.ok()) {
    FreeStream(device, stream, scratch);
    return agreed;
  }
  auto result = std::shared_ptr<NcclCommunicator>(
      new NcclCommunicator(std::move(twin), device, comm, stream));
  result->scratch_ = scratch;
  return result;
}

NcclCommunicator::~NcclCommunicator() {
  if (cudaSetDevice(device_) != cudaSuccess) cudaGetLastError();
  if (comm_ != nullptr) {
    ncclResult_t code = ncclCommDestroy(comm_);
    if (code != ncclSuccess) {
      std::fprintf(stderr, "vemesh: ncclCommDestroy failed: %s\n",
                   ncclGetErrorString(code));
    }
  }
  FreeStream(device_, stream_, scratch_);
}

template <typename Enqueue>
absl::Status NcclCommunicator::Run(absl::string_view op, Enqueue enqueue) {
  absl::Status status = CudaStatus(cudaSetDevice(device_), "cudaSetDevice");
  if (status.ok()) status = NcclStatus(enqueue(), op, comm_);
  if (status.ok()) {
    status = CudaStatus(cudaStreamSynchronize(stream_),
                        absl::StrCat(op, ": cudaStreamSynchronize"));
  }
  return status;
}

absl::Status NcclCommunicator::CheckPeer(absl::string_view op,
                                         int peer) const {
  if (peer < 0 || peer >= size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": rank ", peer, " is outside the group of ", size(),
                     " ranks"));
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::barrier() {
  return Run("ncclAllReduce (barrier)", [&] {
    return ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_,
                         stream_);
  });
}

absl::Status NcclCommunicator::broadcast(void* data, size_t count,
                                         DataType type, int root) {
  absl::Status status = CheckDeviceBuffer("broadcast", data, count);
  if (status.ok()) status = CheckPeer("broadcast", root);
  if (!status.ok()) return status;
  return Run("ncclBroadcast", [&] {
    return ncclBroadcast(data, data, count, NcclDataType(type), root, comm_,
                         stream_);
  });
}

absl::Status NcclCommunicator::all_reduce(const void* send, void* recv,
                                          size_t count, DataType type,
                                          ReduceOp op) {
  absl::Status status = CheckDeviceBuffer("all_reduce", send, count);
  if (status.ok()) status = CheckDeviceBuffer("all_reduce", recv, count);
  if (!status.ok()) return status;
  return Run("ncclAllReduce", [&] {
    return ncclAllReduce(send, recv, count, NcclDataType(type),
                         NcclReduceOp(op), comm_, stream_);
  });
}

absl::Status NcclCommunicator::all_gather(const void* send, void* recv,
                                          size_t count, DataType type) {
  absl::Status status = CheckDeviceBuffer("all_gather", send, count);
  if (status.ok()) {
    status = CheckDeviceBuffer("all_gather", recv, count * size());
  }
  if (!status.ok()) return status;
  return Run("ncclAllGather", [&] {
    return ncclAllGather(send, recv, count, NcclDataType(type), comm_,
                         stream_);
  });
}

absl::Status NcclCommunicator::reduce_scatter(const void* send, void* recv,
                                              size_t count, DataType type,
                                              ReduceOp op) {
  absl::Status status =
      CheckDeviceBuffer("reduce_scatter", send, count * size());
  if (status.ok()) status = CheckDeviceBuffer("reduce_scatter", recv, count);
  if (!status.ok()) return status;
  return Run("ncclReduceScatter", [&] {
    return ncclReduceScatter(send, recv, count, NcclDataType(type),
                             NcclReduceOp(op), comm_, stream_);
  });
}

absl::Status NcclCommunicator::send(const void* data, size_t count,
                                    DataType type, int peer) {
  absl::Status status = CheckDeviceBuffer("send", data, count);
  if (status.ok()) status = CheckPeer("send", peer);
  if (status.ok() && peer == rank()) {
    status = absl::InvalidArgumentError(
        "send to oneself cannot complete alone in NCCL: use send_recv");
  }
  if (!status.ok()) return status;
  return Run("ncclSend", [&] {
    return ncclSend(data, count, NcclDataType(type), peer, comm_, stream_);
  });
}

absl::Status NcclCommunicator::recv(void* data, size_t count, DataType type,
                                    int peer) {
  absl::Status status = CheckDeviceBuffer("recv", data, count);
  if (status.ok()) status = CheckPeer("recv", peer);
  if (status.ok() && peer == rank()) {
    status = absl::InvalidArgumentError(
        "recv from oneself cannot complete alone in NCCL: use send_recv");
  }
  if (!status.ok()) return status;
  return Run("ncclRecv", [&] {
    return ncclRecv(data, count, NcclDataType(type), peer, comm_, stream_);
  });
}

absl::Status NcclCommunicator::send_recv(const void* send_data,
                                         size_t send_count, int dest,
                                         void* recv_data, size_t recv_count,
                                         int source, DataType type) {
  absl::Status status = CheckDeviceBuffer("send_recv", send_data, send_count);
  if (status.ok()) {
    status = CheckDeviceBuffer("send_recv", recv_data, recv_count);
  }
  if (status.ok()) status = CheckPeer("send_recv", dest);
  if (status.ok()) status = CheckPeer("send_recv", source);
  if (!status.ok()) return status;
  return Run("ncclSend/ncclRecv", [&] {
    ncclResult_t code = ncclGroupStart();
    if (code != ncclSuccess) return code;
    ncclResult_t send_code = ncclSend(send_data, send_count,
                                      NcclDataType(type), dest, comm_, stream_);
    ncclResult_t recv_code = ncclRecv(recv_data, recv_count,
                                      NcclDataType(type), source, comm_,
                                      stream_);
    code = ncclGroupEnd();  // always close the group
    if (send_code != ncclSuccess) return send_code;
    if (recv_code != ncclSuccess) return recv_code;
    return code;
  });
}

absl::StatusOr<std::shared_ptr<Communicator>> NcclCommunicator::split(
    int color, int key) {
  auto child_twin = twin_->split(color, key);
  if (!child_twin.ok()) return child_twin.status();
  absl::Status status = CudaStatus(cudaSetDevice(device_), "cudaSetDevice");
  ncclComm_t child = nullptr;
  if (status.ok()) {
    status = NcclStatus(
        ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key,
                      &child, nullptr),
        "ncclCommSplit", comm_);
  }
  if (!status.ok()) return status;
  if (color < 0 || child == nullptr) return std::shared_ptr<Communicator>();
  cudaStream_t stream = nullptr;
  void* scratch = nullptr;
  status = MakeStream(device_, &stream, &scratch);
  if (!status.ok()) {
    ncclCommDestroy(child);
    FreeStream(device_, stream, scratch);
    return status;
  }
  auto result = std::shared_ptr<NcclCommunicator>(
      new NcclCommunicator(*std::move(child_twin), device_, child, stream));
  result->scratch_ = scratch;
  return std::shared_ptr<Communicator>(std::move(result));
}

NativeHandle NcclCommunicator::native_handle() const {
  return NativeHandle{"nccl", comm_};
}

}  // namespace vemesh
