// vemesh/comm/communicator.h
//
// A Communicator is one group of ranks that can talk: the world, or the group
// of one mesh dimension. It is a small interface with three backends, MPI
// (vemesh/comm/mpi/), NCCL (vemesh/comm/nccl/) and Gloo (vemesh/comm/gloo/,
// TCP between ranks that meet through a Store).
//
//   std::shared_ptr<Communicator> tp = ...;     // from a DeviceMesh
//   std::vector<float> grad(1024, 1.0f);
//   absl::Status s = tp->all_reduce(absl::MakeSpan(grad), ReduceOp::kSum);
//   std::vector<int64_t> who(tp->size());
//   int64_t me = tp->global_rank();
//   s = tp->all_gather(absl::MakeConstSpan(&me, 1), absl::MakeSpan(who));
//
// Every operation is blocking and collective over the group unless it says
// otherwise (send/recv are point to point). Buffers are host memory for the
// MPI and Gloo backends and device memory for NCCL. Errors come back as absl::Status,
// never as an abort: a wrong buffer length is InvalidArgument, a failing
// library call is Internal with the library's own message.
//
// Ownership: communicators are shared (std::shared_ptr). A mesh, its
// sub-meshes and any caller may hold the same one; it is freed when the last
// holder lets go. `LiveCommunicatorCount()` says how many exist right now in
// this process (every backend), so tests can prove that nothing leaks.
//
// Threads: one communicator may be used by one thread at a time (as an MPI
// communicator or an NCCL communicator); different communicators may be used
// from different threads when MPI granted MPI_THREAD_MULTIPLE. Under
// MPI_THREAD_FUNNELED or SINGLE only the main thread may use (or free) an
// MPI communicator: elsewhere its operations are FailedPrecondition naming
// the thread level (vemesh/comm/mpi/mpi_environment.h).
//
// After MPI_Finalize, an MPI communicator's operations are
// FailedPrecondition saying MPI was finalised, not an abort.

#ifndef VEMESH_COMM_COMMUNICATOR_H_
#define VEMESH_COMM_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include "absl/strings/string_view.h"
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace vemesh {

class Bootstrap;

enum class DataType { kFloat32, kFloat64, kInt32, kInt64 };
enum class ReduceOp { kSum, kMax, kMin };

size_t SizeOf(DataType type);
absl::string_view DataTypeName(DataType type);
absl::string_view ReduceOpName(ReduceOp op);

// How many Communicator objects (of any backend) are alive in this process.
int64_t LiveCommunicatorCount();

// The DataType of a C++ element type, at compile time.
template <typename T>
constexpr DataType DataTypeOf() {
  if constexpr (std::is_same_v<T, float>) return DataType::kFloat32;
  if constexpr (std::is_same_v<T, double>) return DataType::kFloat64;
  if constexpr (std::is_same_v<T, int32_t>) return DataType::kInt32;
  if constexpr (std::is_same_v<T, int64_t>) return DataType::kInt64;
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> ||
                    std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>,
                "vemesh communicators carry float, double, int32_t, int64_t");
}

// The library object behind a communicator, for code that calls MPI, NCCL
// or Gloo directly: `MPI_Comm`, `ncclComm_t` or `gloo::Context`, cast from
// `handle`.
struct NativeHandle {
  absl::string_view backend;  // "mpi", "nccl" or "gloo"
  // Points at the MPI_Comm / is the ncclComm_t / is the gloo::Context*.
  void* handle = nullptr;
};

class Communicator {
 public:
  Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  virtual ~Communicator();

  // This process's rank in the group, and the group's size.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The members' global (world) ranks, indexed by group rank.
  virtual absl::Span<const int> ranks() const = 0;
  int global_rank() const { return ranks()[rank()]; }
  virtual absl::string_view backend() const = 0;

  // -- Untyped operations (counts are elements, not bytes) -------------------
  virtual absl::Status barrier() = 0;
  virtual absl::Status broadcast(void* data, size_t count, DataType type,
                                 int root) = 0;
  // In place when send == recv.
  virtual absl::Status all_reduce(const void* send, void* recv, size_t count,
                                  DataType type, ReduceOp op) = 0;
  // `recv` holds size() * count elements, rank i's block at i * count.
  virtual absl::Status all_gather(const void* send, void* recv, size_t count,
                                  DataType type) = 0;
  // `send` holds size() * count elements; rank i receives the reduction of
  // every rank's block i.
  virtual absl::Status reduce_scatter(const void* send, void* recv,
                                      size_t count, DataType type,
                                      ReduceOp op) = 0;
  virtual absl::Status send(const void* data, size_t count, DataType type,
                            int peer) = 0;
  virtual absl::Status recv(void* data, size_t count, DataType type,
                            int peer) = 0;
  // Sends to `dest` and receives from `source` as one operation, so that a
  // ring shift or an exchange with oneself cannot deadlock (MPI_Sendrecv;
  // a grouped ncclSend/ncclRecv). The default answers Unimplemented.
  virtual absl::Status send_recv(const void* send_data, size_t send_count,
                                 int dest, void* recv_data, size_t recv_count,
                                 int source, DataType type);

  // Collective: splits this group as MPI_Comm_split does. Ranks with the same
  // `color` (>= 0) form a new group, ordered by `key` then by rank. A
  // negative color takes part without joining; it gets nullptr.
  virtual absl::StatusOr<std::shared_ptr<Communicator>> split(int color,
                                                              int key) = 0;

  virtual NativeHandle native_handle() const = 0;

  // Collective: a Bootstrap over this group, so that a mesh can be built on
  // it (MeshOptions::world). The default answers InvalidArgument naming the
  // backend: only backends whose collectives honour a deadline offer one.
  virtual absl::StatusOr<std::shared_ptr<Bootstrap>> make_bootstrap(
      absl::Time deadline);

  // -- Typed operations: the element type and the lengths are checked --------
  template <typename T>
  absl::Status broadcast(absl::Span<T> data, int root) {
    return broadcast(data.data(), data.size(), DataTypeOf<T>(), root);
  }
  template <typename T>
  absl::Status all_reduce(absl::Span<T> data, ReduceOp op) {
    return all_reduce(data.data(), data.data(), data.size(), DataTypeOf<T>(),
                      op);
  }
  template <typename T>
  absl::Status all_gather(absl::Span<const T> send, absl::Span<T> recv) {
    if (recv.size() != send.size() * static_cast<size_t>(size())) {
      return LengthError("all_gather", recv.size(), send.size() * size());
    }
    return all_gather(send.data(), recv.data(), send.size(), DataTypeOf<T>());
  }
  template <typename T>
  absl::Status reduce_scatter(absl::Span<const T> send, absl::Span<T> recv,
                              ReduceOp op) {
    if (send.size() != recv.size() * static_cast<size_t>(size())) {
      return LengthError("reduce_scatter", send.size(), recv.size() * size());
    }
    return reduce_scatter(send.data(), recv.data(), recv.size(),
                          DataTypeOf<T>(), op);
  }
  template <typename T>
  absl::Status send(absl::Span<const T> data, int peer) {
    return send(data.data(), data.size(), DataTypeOf<T>(), peer);
  }
  template <typename T>
  absl::Status recv(absl::Span<T> data, int peer) {
    return recv(data.data(), data.size(), DataTypeOf<T>(), peer);
  }
  template <typename T>
  absl::Status send_recv(absl::Span<const T> send, int dest,
                         absl::Span<T> recv, int source) {
    return send_recv(send.data(), send.size(), dest, recv.data(), recv.size(),
                     source, DataTypeOf<T>());
  }

 protected:
  // The argument checks every host backend makes, with one text for all:
  // a count above INT_MAX (the int counts of MPI and of Gloo's reduction
  // helpers), a null buffer for a non-zero count, a peer outside the group.
  // `backend_name` is how the message names the backend ("MPI", "Gloo").
  absl::Status CheckBuffer(absl::string_view backend_name, absl::string_view op,
                           const void* data, size_t count) const;
  absl::Status CheckPeer(absl::string_view op, absl::string_view what,
                         int peer) const;

  static absl::Status LengthError(absl::string_view op, size_t got,
                                  size_t expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, " buffer has ", got, " elements: expected ", expected));
  }
};

}  // namespace vemesh

#endif  // VEMESH_COMM_COMMUNICATOR_H_
