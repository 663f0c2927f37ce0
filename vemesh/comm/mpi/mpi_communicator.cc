#include "vemesh/comm/mpi/mpi_communicator.h"

#include <climits>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "vemesh/bootstrap/mpi/mpi_bootstrap.h"
#include "vemesh/comm/mpi/mpi_environment.h"
#include "vemesh/status_macros.h"

namespace vemesh {
namespace {

// vemesh owns its communicators, so one tag is enough for point to point.
constexpr int kTag = 0;

// Frees a communicator we made, on an error path.
void FreeQuietly(MPI_Comm* comm) {
  if (*comm != MPI_COMM_NULL && MpiIsUsable()) MPI_Comm_free(comm);
}

bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto x = reinterpret_cast<uintptr_t>(a);
  auto y = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

}  // namespace

MPI_Datatype MpiDataType(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return MPI_FLOAT;
    case DataType::kFloat64:
      return MPI_DOUBLE;
    case DataType::kInt32:
      return MPI_INT32_T;
    case DataType::kInt64:
      return MPI_INT64_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op MpiReduceOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return MPI_SUM;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  return MPI_OP_NULL;
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, int rank, int size,
                                 std::vector<int> ranks)
    : comm_(comm), rank_(rank), size_(size), ranks_(std::move(ranks)) {}

MpiCommunicator::~MpiCommunicator() {
  // After MPI_Finalize the communicator is already gone; calling MPI then
  // is an error, so only free while MPI is alive.
  if (comm_ == MPI_COMM_NULL || !MpiIsUsable()) return;
  // Under MPI_THREAD_FUNNELED / SINGLE a worker thread must not call MPI:
  // leave the communicator to MPI_Finalize rather than break that rule.
  absl::Status thread = CheckMpiThread("freeing an MPI communicator");
  if (!thread.ok()) {
    static std::once_flag warned;
    std::call_once(warned, [&thread] {
      std::fprintf(stderr,
                   "vemesh: warning: %s; it is left to MPI_Finalize. Let go "
                   "of MPI communicators (and meshes, and the registry's "
                   "reset) on the main thread.\n",
                   std::string(thread.message()).c_str());
    });
    return;
  }
  MPI_Comm_free(&comm_);
}

absl::Status MpiCommunicator::Usable(absl::string_view op) const {
  if (!MpiIsUsable()) {
    // Open MPI aborts the process on any call after MPI_Finalize.
    return absl::FailedPreconditionError(absl::StrCat(
        op, " on an MPI communicator of ", size_,
        " ranks after MPI was finalised (MPI_Finalize was called): MPI cannot "
        "be used again; finish communicating before MPI_Finalize"));
  }
  // The common case first, without building a message.
  if (MpiThreadLevel() >= MPI_THREAD_SERIALIZED) return absl::OkStatus();
  return CheckMpiThread(absl::StrCat(op, " on an MPI communicator"));
}

absl::StatusOr<std::shared_ptr<MpiCommunicator>> MpiCommunicator::World() {
  VEMESH_RETURN_IF_ERROR(EnsureMpiInitialized());
  return Dup(MPI_COMM_WORLD);
}

absl::StatusOr<std::shared_ptr<MpiCommunicator>> MpiCommunicator::Dup(
    MPI_Comm comm) {
  return Dup(comm, absl::InfiniteFuture());
}

absl::StatusOr<std::shared_ptr<MpiCommunicator>> MpiCommunicator::Dup(
    MPI_Comm comm, absl::Time deadline) {
  if (!MpiIsUsable()) {
    return absl::FailedPreconditionError(
        "MpiCommunicator::Dup needs an initialised, not finalised MPI");
  }
  if (comm == MPI_COMM_NULL) {
    return absl::InvalidArgumentError("MpiCommunicator::Dup of MPI_COMM_NULL");
  }
  MPI_Comm copy = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  absl::Status status =
      MpiStatus(MPI_Comm_idup(comm, &copy, &request), "MPI_Comm_idup");
  if (status.ok()) status = WaitForMpiRequest(&request, deadline, "MPI_Comm_idup");
  if (absl::IsDeadlineExceeded(status)) AbandonMpi();
  if (!status.ok()) return status;
  return Adopt(copy, MPI_COMM_NULL, nullptr);
}

absl::StatusOr<std::shared_ptr<MpiCommunicator>> MpiCommunicator::Adopt(
    MPI_Comm comm, MPI_Comm parent, const std::vector<int>* parent_ranks) {
  int rank = 0;
  int size = 0;
  absl::Status status = MpiStatus(
      MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  if (status.ok()) status = MpiStatus(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  if (status.ok()) status = MpiStatus(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  std::vector<int> ranks(static_cast<size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  if (status.ok() && parent_ranks != nullptr) {
    // Member i's rank in the parent, then the parent's origin rank of that.
    MPI_Group mine = MPI_GROUP_NULL;
    MPI_Group theirs = MPI_GROUP_NULL;
    std::vector<int> in_parent(ranks.size());
    status = MpiStatus(MPI_Comm_group(comm, &mine), "MPI_Comm_group");
    if (status.ok()) {
      status = MpiStatus(MPI_Comm_group(parent, &theirs), "MPI_Comm_group");
    }
    if (status.ok()) {
      status = MpiStatus(MPI_Group_translate_ranks(mine, size, ranks.data(),
                                                   theirs, in_parent.data()),
                         "MPI_Group_translate_ranks");
    }
    if (mine != MPI_GROUP_NULL) MPI_Group_free(&mine);
    if (theirs != MPI_GROUP_NULL) MPI_Group_free(&theirs);
    for (size_t i = 0; status.ok() && i < ranks.size(); ++i) {
      if (in_parent[i] < 0 ||
          static_cast<size_t>(in_parent[i]) >= parent_ranks->size()) {
        status = absl::InternalError(absl::StrCat(
            "MPI_Group_translate_ranks gave rank ", in_parent[i],
            " outside a parent of ", parent_ranks->size()));
      } else {
        ranks[i] = (*parent_ranks)[in_parent[i]];
      }
    }
  }
  if (!status.ok()) {
    FreeQuietly(&comm);
    return status;
  }
  return std::shared_ptr<MpiCommunicator>(
      new MpiCommunicator(comm, rank, size, std::move(ranks)));
}


absl::Status MpiCommunicator::barrier() {
  VEMESH_RETURN_IF_ERROR(Usable("barrier"));
  return MpiStatus(MPI_Barrier(comm_), "MPI_Barrier");
}

absl::Status MpiCommunicator::broadcast(void* data, size_t count,
                                        DataType type, int root) {
  absl::Status status = Usable("broadcast");
  if (status.ok()) status = CheckBuffer("MPI", "broadcast", data, count);
  if (status.ok()) status = CheckPeer("broadcast", "root", root);
  if (!status.ok()) return status;
  return MpiStatus(MPI_Bcast(data, static_cast<int>(count), MpiDataType(type),
                             root, comm_),
                   "MPI_Bcast");
}

absl::Status MpiCommunicator::all_reduce(const void* send, void* recv,
                                         size_t count, DataType type,
                                         ReduceOp op) {
  absl::Status status = Usable("all_reduce");
  if (status.ok()) status = CheckBuffer("MPI", "all_reduce", send, count);
  if (status.ok()) status = CheckBuffer("MPI", "all_reduce", recv, count);
  if (!status.ok()) return status;
  const size_t bytes = count * SizeOf(type);
  if (send != recv && Overlap(send, bytes, recv, bytes)) {
    return absl::InvalidArgumentError(
        "all_reduce: send and recv overlap without being the same buffer");
  }
  const void* source = send == recv ? MPI_IN_PLACE : send;
  return MpiStatus(MPI_Allreduce(source, recv, static_cast<int>(count),
                                 MpiDataType(type), MpiReduceOp(op), comm_),
                   "MPI_Allreduce");
}

absl::Status MpiCommunicator::all_gather(const void* send, void* recv,
                                         size_t count, DataType type) {
  const size_t total = count * static_cast<size_t>(size_);
  absl::Status status = Usable("all_gather");
  if (status.ok()) status = CheckBuffer("MPI", "all_gather", send, count);
  if (status.ok()) status = CheckBuffer("MPI", "all_gather", recv, total);
  if (!status.ok()) return status;
  const size_t width = SizeOf(type);
  if (Overlap(send, count * width, recv, total * width)) {
    return absl::InvalidArgumentError(
        "all_gather: send and recv buffers overlap");
  }
  return MpiStatus(
      MPI_Allgather(send, static_cast<int>(count), MpiDataType(type), recv,
                    static_cast<int>(count), MpiDataType(type), comm_),
      "MPI_Allgather");
}

absl::Status MpiCommunicator::reduce_scatter(const void* send, void* recv,
                                             size_t count, DataType type,
                                             ReduceOp op) {
  const size_t total = count * static_cast<size_t>(size_);
  absl::Status status = Usable("reduce_scatter");
  if (status.ok()) status = CheckBuffer("MPI", "reduce_scatter", send, total);
  if (status.ok()) status = CheckBuffer("MPI", "reduce_scatter", recv, count);
  if (!status.ok()) return status;
  const size_t width = SizeOf(type);
  if (Overlap(send, total * width, recv, count * width)) {
    return absl::InvalidArgumentError(
        "reduce_scatter: send and recv buffers overlap");
  }
  return MpiStatus(
      MPI_Reduce_scatter_block(send, recv, static_cast<int>(count),
                               MpiDataType(type), MpiReduceOp(op), comm_),
      "MPI_Reduce_scatter_block");
}

absl::Status MpiCommunicator::send(const void* data, size_t count,
                                   DataType type, int peer) {
  absl::Status status = Usable("send");
  if (status.ok()) status = CheckBuffer("MPI", "send", data, count);
  if (status.ok()) status = CheckPeer("send", "peer", peer);
  if (!status.ok()) return status;
  return MpiStatus(MPI_Send(data, static_cast<int>(count), MpiDataType(type),
                            peer, kTag, comm_),
                   "MPI_Send");
}

absl::Status MpiCommunicator::recv(void* data, size_t count, DataType type,
                                   int peer) {
  absl::Status status = Usable("recv");
  if (status.ok()) status = CheckBuffer("MPI", "recv", data, count);
  if (status.ok()) status = CheckPeer("recv", "peer", peer);
  if (!status.ok()) return status;
  MPI_Status info;
  status = MpiStatus(MPI_Recv(data, static_cast<int>(count), MpiDataType(type),
                              peer, kTag, comm_, &info),
                     "MPI_Recv");
  if (!status.ok()) return status;
  int got = 0;
  MPI_Get_count(&info, MpiDataType(type), &got);
  if (static_cast<size_t>(got) != count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "recv expected ", count, " elements from rank ", peer, " but got ",
        got));
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::send_recv(const void* send_data,
                                        size_t send_count, int dest,
                                        void* recv_data, size_t recv_count,
                                        int source, DataType type) {
  absl::Status status = Usable("send_recv");
  if (status.ok()) status = CheckBuffer("MPI", "send_recv", send_data, send_count);
  if (status.ok()) status = CheckBuffer("MPI", "send_recv", recv_data, recv_count);
  if (status.ok()) status = CheckPeer("send_recv", "dest", dest);
  if (status.ok()) status = CheckPeer("send_recv", "source", source);
  if (!status.ok()) return status;
  MPI_Status info;
  status = MpiStatus(
      MPI_Sendrecv(send_data, static_cast<int>(send_count), MpiDataType(type),
                   dest, kTag, recv_data, static_cast<int>(recv_count),
                   MpiDataType(type), source, kTag, comm_, &info),
      "MPI_Sendrecv");
  if (!status.ok()) return status;
  int got = 0;
  MPI_Get_count(&info, MpiDataType(type), &got);
  if (static_cast<size_t>(got) != recv_count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "send_recv expected ", recv_count, " elements from rank ", source,
        " but got ", got));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<MpiCommunicator>> MpiCommunicator::split_mpi(
    int color, int key) {
  absl::Status status = Usable("split");
  if (!status.ok()) return status;
  MPI_Comm child = MPI_COMM_NULL;
  status =
      MpiStatus(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key,
                               &child),
                "MPI_Comm_split");
  if (!status.ok()) return status;
  if (child == MPI_COMM_NULL) return std::shared_ptr<MpiCommunicator>();
  return Adopt(child, comm_, &ranks_);
}

absl::StatusOr<std::shared_ptr<Communicator>> MpiCommunicator::split(
    int color, int key) {
  VEMESH_ASSIGN_OR_RETURN(auto child, split_mpi(color, key));
  return std::shared_ptr<Communicator>(std::move(child));
}

NativeHandle MpiCommunicator::native_handle() const {
  return NativeHandle{"mpi", const_cast<MPI_Comm*>(&comm_)};
}

absl::StatusOr<std::shared_ptr<Bootstrap>> MpiCommunicator::make_bootstrap(
    absl::Time deadline) {
  VEMESH_RETURN_IF_ERROR(Usable("make_bootstrap"));
  VEMESH_ASSIGN_OR_RETURN(
      auto boot,
      MpiBootstrap::Create(comm_, "MeshOptions.world (an MPI communicator)",
                           deadline));
  return std::shared_ptr<Bootstrap>(std::move(boot));
}

}  // namespace vemesh
