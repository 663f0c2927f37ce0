// vemesh/comm/communicator.h
//
// A Communicator is one group of ranks that can talk: the world, or the group
// of one mesh dimension. Three backends implement it, MPI (vemesh/comm/mpi/),
// NCCL (vemesh/comm/nccl/) and Gloo (vemesh/comm/gloo/, TCP between ranks
// that meet through a Store).
//
//   std::shared_ptr<Communicator> tp = ...;     // from a DeviceMesh
//   std::vector<float> grad(1024, 1.0f);
//   absl::Status s = tp->all_reduce(absl::MakeSpan(grad), ReduceOp::kSum);
//   std::vector<int64_t> who(tp->size());
//   int64_t me = tp->global_rank();
//   s = tp->all_gather(absl::MakeConstSpan(&me, 1), absl::MakeSpan(who));
//
//   // Asynchronous: the same operation, a handle to wait on (work.h).
//   auto w = dp->iall_reduce(absl::MakeSpan(bucket), ReduceOp::kAvg);
//   ... compute ...
//   s = (*w)->wait();
//
//   // Point to point by global rank, as the registry answers neighbours.
//   std::optional<int64_t> next = *VESCALE_DEVICE_MESH.get_next_stage_peer();
//   if (next) s = pp->send(absl::MakeConstSpan(act), GlobalRank(*next));
//
// Operations are collective over the group unless they say otherwise
// (send/recv/batch are point to point). Buffers are host memory for MPI and
// Gloo, device memory for NCCL. Every operation has a blocking form and an
// asynchronous `i` form (`all_reduce` / `iall_reduce`, `send` / `isend`) that
// returns a Work; the blocking form is the asynchronous one waited for until
// the communicator's timeout (`set_timeout`, none by default).
//
// Arguments are checked here (operation_checks.cc), once, for every
// backend, before anything is sent: a null buffer with a non-zero count, a
// count above the backend's limit, a root or peer outside the group, a length
// that does not match the group, send and recv buffers that overlap without
// being the same, an average of integers. Each is InvalidArgument with one text
// for all backends. Other failures (a lost peer, a deadline, abort()) and
// whether to retry: the table in vemesh/base/status_codes.h.
//
// Buffers of the typed forms: any contiguous range, std::vector and
// std::span included (buffer.h). Data types and reductions: data_type.h
// (every type on every backend). An operation as a backend receives it:
// operation.h. The backend names: backend.h.
//
// Ownership: communicators are shared (std::shared_ptr). A mesh, its
// sub-meshes, any caller and any unfinished Work may hold the same one; it
// is freed when the last holder lets go. `LiveCommunicatorCount()` says how
// many exist in this process (every backend), so tests can prove that
// nothing leaks.
//
// Threads: one communicator may be used by one thread at a time (as an MPI
// or NCCL communicator); `abort()` and `aborted()` may be called from any
// thread. Different communicators may be used from different threads when
// MPI granted MPI_THREAD_MULTIPLE; under MPI_THREAD_FUNNELED or SINGLE only
// the main thread may use (or free) an MPI communicator: elsewhere its
// operations are FailedPrecondition naming the thread level
// (vemesh/comm/mpi/mpi_environment.h).

#ifndef VEMESH_COMM_COMMUNICATOR_H_
#define VEMESH_COMM_COMMUNICATOR_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/backend.h"
#include "vemesh/comm/buffer.h"
#include "vemesh/comm/data_type.h"
#include "vemesh/comm/half.h"
#include "vemesh/comm/operation.h"
#include "vemesh/comm/work.h"

namespace vemesh {

// How many Communicator objects (of any backend) are alive in this process.
int64_t LiveCommunicatorCount();

// A peer named by its global (world) rank instead of its rank in the group:
// what the mesh's neighbour queries answer.
struct GlobalRank {
  explicit GlobalRank(int64_t r) : value(r) {}
  int64_t value;
};

// The library object behind a communicator, for code that calls MPI, NCCL
// or Gloo directly: `MPI_Comm`, `ncclComm_t` or `gloo::Context`, cast from
// `handle`.
struct NativeHandle {
  absl::string_view backend;  // "mpi", "nccl" or "gloo"
  // Points at the MPI_Comm / is the ncclComm_t / is the gloo::Context*.
  void* handle = nullptr;
};

// Options of the asynchronous forms.
struct AsyncOptions {
  // NCCL only: enqueue on this cudaStream_t instead of the communicator's
  // own stream. Ignored by the host backends.
  void* stream = nullptr;
};

// One group of a `split_many`: this rank's color and key, as for `split`,
// and the group's name (a mesh passes the dimension's name, "TP"). Backends
// that can label a communicator use the name (NCCL: ncclConfig_t::commName,
// which NCCL's logs and profilers show); the others ignore it.
//
// `members`, when the caller knows them: this communicator's ranks of the
// group's members in key order (this rank at index `key`), the same list on
// every member. It lets a backend make the group by a call collective over
// the group only (MPI: MPI_Comm_create_group, whose context id is agreed in
// log2(group) rounds instead of log2(world); a Gloo world not connected yet:
// all the requests' groups in one store round among their members,
// GlooCommunicator::subgroups); a rank with a negative color then makes no
// call at all. Either every rank's requests carry members
// (or a negative color) or none do: a mix would leave ranks in different
// calls. Backends without such a call split as usual.
struct SplitRequest {
  int color = -1;
  int key = 0;
  std::string name;
  std::vector<int> members = {};
  bool group_local = false;  // set with `members` (on every rank)
};
// How errors name a request: "'TP'", or "request 2" when it has no name.
std::string SplitRequestName(const SplitRequest& request, size_t index);

// Options of Communicator::shrink.
struct ShrinkOptions {
  // Operations of the parent may still be in flight (a peer died during
  // one): NCCL stops them first (NCCL_SHRINK_ABORT) instead of waiting for
  // them. NCCL also does so by itself when this rank has unfinished
  // operations on the parent. The host backends ignore it.
  bool abort_in_flight = false;
};

class Communicator;
class Store;

// Where a group's ranks met (Communicator::store_scope): the store and the
// key prefix this group owns in it. A backend built over the group posts
// its own state under the prefix (NCCL's unique ids over a torchrun world
// that is never connected). A null store: the group met through none.
struct StoreScope {
  std::shared_ptr<Store> store;
  std::string prefix;
};

// Aborts several communicators in one call, from any thread, as abort()
// does for one: each is marked aborted first (every blocked and later
// operation returns Aborted with `reason`), then each backend releases its
// own together. NCCL: every ncclCommAbort inside one
// ncclGroupStart/ncclGroupEnd, never one after another (a communicator
// aborted alone can wait for one still running on the same device). Nulls
// and communicators already aborted are skipped; idempotent.
void AbortCommunicators(absl::Span<const std::shared_ptr<Communicator>> comms,
                        absl::string_view reason = "abort() was called");

class Communicator : public std::enable_shared_from_this<Communicator> {
 public:
  using WorkOr = absl::StatusOr<std::shared_ptr<Work>>;

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

  // The group rank of global rank `global`; NotFound when it is not a
  // member. O(1) after the first call.
  absl::StatusOr<int> group_rank(int64_t global) const;

  // -- Deadlines and abort
  // ----------------------------------------------------- How long a blocking
  // operation may take (InfiniteDuration: no limit, the default). Past it the
  // operation is DeadlineExceeded and the communicator aborted.
  void set_timeout(absl::Duration timeout);
  absl::Duration timeout() const;
  // Any thread: makes every blocked and later operation of this
  // communicator return Aborted (with `reason`), and asks the backend to
  // stop (NCCL: ncclCommAbort). Irreversible; the first reason is kept.
  void abort(absl::string_view reason = "abort() was called");
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // The Aborted status a stopped operation returns ("<op> on <backend>
  // communicator aborted: <reason>").
  absl::Status AbortedError(absl::string_view op) const;

  // -- Any operation, checked
  // --------------------------------------------------- Checks `op` and starts
  // it; the named forms below build an Operation and call this.
  WorkOr start(Operation op);
  // `start` and wait until the timeout.
  absl::Status run(Operation op);

  // -- Untyped operations (counts are elements, not bytes) -------------------
  absl::Status barrier();
  absl::Status broadcast(void* data, size_t count, DataType type, int root);
  absl::Status all_reduce(const void* send, void* recv, size_t count,
                          DataType type, ReduceOp op);
  absl::Status reduce(const void* send, void* recv, size_t count, DataType type,
                      ReduceOp op, int root);
  absl::Status all_gather(const void* send, void* recv, size_t count,
                          DataType type);
  absl::Status all_gather_v(const void* send, void* recv,
                            absl::Span<const size_t> recv_counts,
                            DataType type);
  absl::Status reduce_scatter(const void* send, void* recv, size_t count,
                              DataType type, ReduceOp op);
  absl::Status reduce_scatter_v(const void* send, void* recv,
                                absl::Span<const size_t> recv_counts,
                                DataType type, ReduceOp op);
  absl::Status gather(const void* send, void* recv, size_t count, DataType type,
                      int root);
  absl::Status scatter(const void* send, void* recv, size_t count,
                       DataType type, int root);
  absl::Status all_to_all(const void* send, void* recv, size_t count,
                          DataType type);
  absl::Status all_to_all_v(const void* send,
                            absl::Span<const size_t> send_counts, void* recv,
                            absl::Span<const size_t> recv_counts,
                            DataType type);
  absl::Status send(const void* data, size_t count, DataType type, int peer);
  absl::Status recv(void* data, size_t count, DataType type, int peer);
  absl::Status send(const void* data, size_t count, DataType type,
                    GlobalRank peer);
  absl::Status recv(void* data, size_t count, DataType type, GlobalRank peer);
  // Sends to `dest` and receives from `source` as one operation, so that a
  // ring shift or an exchange with oneself cannot deadlock.
  absl::Status send_recv(const void* send_data, size_t send_count, int dest,
                         void* recv_data, size_t recv_count, int source,
                         DataType type);
  // Every send and receive of `ops`, completed together (NCCL group calls,
  // PyTorch's batch_isend_irecv).
  absl::Status batch_send_recv(absl::Span<const P2POp> ops);

  // -- Asynchronous forms: the same checks, a Work to wait on ----------------
  WorkOr ibarrier();
  WorkOr ibroadcast(void* data, size_t count, DataType type, int root,
                    const AsyncOptions& options = {});
  WorkOr iall_reduce(const void* send, void* recv, size_t count, DataType type,
                     ReduceOp op, const AsyncOptions& options = {});
  WorkOr ireduce(const void* send, void* recv, size_t count, DataType type,
                 ReduceOp op, int root, const AsyncOptions& options = {});
  WorkOr iall_gather(const void* send, void* recv, size_t count, DataType type,
                     const AsyncOptions& options = {});
  WorkOr iall_gather_v(const void* send, void* recv,
                       absl::Span<const size_t> recv_counts, DataType type,
                       const AsyncOptions& options = {});
  WorkOr ireduce_scatter(const void* send, void* recv, size_t count,
                         DataType type, ReduceOp op,
                         const AsyncOptions& options = {});
  WorkOr ireduce_scatter_v(const void* send, void* recv,
                           absl::Span<const size_t> recv_counts, DataType type,
                           ReduceOp op, const AsyncOptions& options = {});
  WorkOr igather(const void* send, void* recv, size_t count, DataType type,
                 int root, const AsyncOptions& options = {});
  WorkOr iscatter(const void* send, void* recv, size_t count, DataType type,
                  int root, const AsyncOptions& options = {});
  WorkOr iall_to_all(const void* send, void* recv, size_t count, DataType type,
                     const AsyncOptions& options = {});
  WorkOr iall_to_all_v(const void* send, absl::Span<const size_t> send_counts,
                       void* recv, absl::Span<const size_t> recv_counts,
                       DataType type, const AsyncOptions& options = {});
  WorkOr isend(const void* data, size_t count, DataType type, int peer,
               const AsyncOptions& options = {});
  WorkOr irecv(void* data, size_t count, DataType type, int peer,
               const AsyncOptions& options = {});
  WorkOr isend(const void* data, size_t count, DataType type, GlobalRank peer,
               const AsyncOptions& options = {});
  WorkOr irecv(void* data, size_t count, DataType type, GlobalRank peer,
               const AsyncOptions& options = {});
  WorkOr isend_recv(const void* send_data, size_t send_count, int dest,
                    void* recv_data, size_t recv_count, int source,
                    DataType type, const AsyncOptions& options = {});
  WorkOr batch_isend_irecv(absl::Span<const P2POp> ops,
                           const AsyncOptions& options = {});

  // Collective: splits this group as MPI_Comm_split does. Ranks with the same
  // `color` (>= 0) form a new group, ordered by `key` then by rank. A
  // negative color takes part without joining; it gets nullptr.
  virtual absl::StatusOr<std::shared_ptr<Communicator>> split(int color,
                                                              int key) = 0;
  // Collective: several splits of this group at once, with the result of
  // calling `split(color, key)` for each request in order (entry i is
  // request i's group, null for a negative color). Every rank passes the
  // same number of requests. Backends that can build the groups
  // concurrently do: NCCL issues all its ncclCommSplit calls in one group
  // (NCCL >= 2.27). `deadline` bounds the backends that poll (NCCL); the
  // others take as long as their split takes. On failure no group is
  // returned (those made are freed), and the status names the request
  // that failed.
  virtual absl::StatusOr<std::vector<std::shared_ptr<Communicator>>> split_many(
      absl::Span<const SplitRequest> requests,
      absl::Time deadline = absl::InfiniteFuture());
  // The store this group's ranks met through and the prefix it owns there
  // (Gloo); a null store for the backends that meet through none (MPI,
  // NCCL). Local.
  virtual StoreScope store_scope() const;

  // Collective over the members that stay (the excluded ones do not call):
  // a new communicator of this group without the group ranks `exclude`,
  // in the same order; ranks() keeps their global ranks. The parent is left
  // as it is (it may be aborted: the new group is then rebuilt, not derived
  // from it). Per backend:
  //   NCCL  ncclCommShrink of the parent (NCCL >= 2.27), NCCL_SHRINK_ABORT
  //         when operations may be in flight (ShrinkOptions), else
  //         NCCL_SHRINK_DEFAULT; a new ncclCommInitRankConfig over the
  //         shrunk twin when the parent was aborted or NCCL is older. The
  //         parent is afterwards released with ncclCommAbort, never
  //         ncclCommDestroy (its excluded peers may be gone).
  //   MPI   MPI_Comm_create_group over the survivors' group: collective over
  //         them only. MPI cannot recover from a dead process: it works when
  //         the excluded ranks are alive (leaving, idle or gone through
  //         MPI_Finalize), not after one was killed (Open MPI ends the job).
  //   Gloo  a new rendezvous of the survivors over the parent's store.
  // InvalidArgument (naming the value) for a group rank out of range or
  // given twice, this rank in `exclude`, or everyone excluded.
  absl::StatusOr<std::shared_ptr<Communicator>> shrink(
      absl::Span<const int> exclude, const ShrinkOptions& options = {});

  virtual NativeHandle native_handle() const = 0;

  // -- Typed operations: the element type and the lengths are checked --------
  // Every buffer is any contiguous range (buffer.h): std::vector, std::span,
  // absl::Span, std::array, ...; a buffer only read may be const. Each has
  // an asynchronous `i` form taking the same buffers, which must outlive
  // the Work. Lengths are checked before anything starts (InvalidArgument).
  template <WriteBuffer W>
  absl::Status broadcast(W&& data, int root) {
    return broadcast(WriteData(data), BufferSize(data), TypeOf<W>(), root);
  }
  template <WriteBuffer W>
  WorkOr ibroadcast(W&& data, int root, const AsyncOptions& options = {}) {
    return ibroadcast(WriteData(data), BufferSize(data), TypeOf<W>(), root,
                      options);
  }
  // In place.
  template <WriteBuffer W>
  absl::Status all_reduce(W&& data, ReduceOp op) {
    return all_reduce(WriteData(data), WriteData(data), BufferSize(data),
                      TypeOf<W>(), op);
  }
  template <WriteBuffer W>
  WorkOr iall_reduce(W&& data, ReduceOp op, const AsyncOptions& options = {}) {
    return iall_reduce(WriteData(data), WriteData(data), BufferSize(data),
                       TypeOf<W>(), op, options);
  }
  // `recv` is written at `root` only (same length as `send` there; any
  // length, empty included, elsewhere).
  template <ReadBuffer R, WriteBuffer W>
  absl::Status reduce(R&& send, W&& recv, ReduceOp op, int root) {
    VEMESH_RETURN_IF_ERROR(
        RootLength("reduce", "recv", BufferSize(recv), BufferSize(send), root));
    return reduce(ReadData(send), RecvAt(recv, root), BufferSize(send),
                  PairType<R, W>(), op, root);
  }
  template <ReadBuffer R, WriteBuffer W>
  WorkOr ireduce(R&& send, W&& recv, ReduceOp op, int root,
                 const AsyncOptions& options = {}) {
    VEMESH_RETURN_IF_ERROR(RootLength("ireduce", "recv", BufferSize(recv),
                                      BufferSize(send), root));
    return ireduce(ReadData(send), RecvAt(recv, root), BufferSize(send),
                   PairType<R, W>(), op, root, options);
  }
  template <ReadBuffer R, WriteBuffer W>
  absl::Status all_gather(R&& send, W&& recv) {
    VEMESH_RETURN_IF_ERROR(
        Multiple("all_gather", "recv", BufferSize(recv), BufferSize(send)));
    return all_gather(ReadData(send), WriteData(recv), BufferSize(send),
                      PairType<R, W>());
  }
  template <ReadBuffer R, WriteBuffer W>
  WorkOr iall_gather(R&& send, W&& recv, const AsyncOptions& options = {}) {
    VEMESH_RETURN_IF_ERROR(
        Multiple("iall_gather", "recv", BufferSize(recv), BufferSize(send)));
    return iall_gather(ReadData(send), WriteData(recv), BufferSize(send),
                       PairType<R, W>(), options);
  }
  // `send` holds recv_counts[rank()] elements, `recv` their sum.
  template <ReadBuffer R, WriteBuffer W>
  absl::Status all_gather_v(R&& send, W&& recv,
                            absl::Span<const size_t> recv_counts) {
    VEMESH_RETURN_IF_ERROR(VLengths("all_gather_v", "send", BufferSize(send),
                                    "recv", BufferSize(recv), recv_counts));
    return all_gather_v(ReadData(send), WriteData(recv), recv_counts,
                        PairType<R, W>());
  }
  template <ReadBuffer R, WriteBuffer W>
  WorkOr iall_gather_v(R&& send, W&& recv, absl::Span<const size_t> recv_counts,
                       const AsyncOptions& options = {}) {
    VEMESH_RETURN_IF_ERROR(VLengths("iall_gather_v", "send", BufferSize(send),
                                    "recv", BufferSize(recv), recv_counts));
    return iall_gather_v(ReadData(send), WriteData(recv), recv_counts,
                         PairType<R, W>(), options);
  }
  template <ReadBuffer R, WriteBuffer W>
  absl::Status reduce_scatter(R&& send, W&& recv, ReduceOp op) {
    VEMESH_RETURN_IF_ERROR(
        Multiple("reduce_scatter", "send", BufferSize(send), BufferSize(recv)));
    return reduce_scatter(ReadData(send), WriteData(recv), BufferSize(recv),
                          PairType<R, W>(), op);
  }
  template <ReadBuffer R, WriteBuffer W>
  WorkOr ireduce_scatter(R&& send, W&& recv, ReduceOp op,
                         const AsyncOptions& options = {}) {
    VEMESH_RETURN_IF_ERROR(Multiple("ireduce_scatter", "send", BufferSize(send),
                                    BufferSize(recv)));
    return ireduce_scatter(ReadData(send), WriteData(recv), BufferSize(recv),
                           PairType<R, W>(), op, options);
  }
  // `send` holds the sum of recv_counts, `recv` recv_counts[rank()].
  template <ReadBuffer R, WriteBuffer W>
  absl::Status reduce_scatter_v(R&& send, W&& recv,
                                absl::Span<const size_t> recv_counts,
                                ReduceOp op) {
    VEMESH_RETURN_IF_ERROR(VLengths("reduce_scatter_v", "recv",
                                    BufferSize(recv), "send", BufferSize(send),
                                    recv_counts));
    return reduce_scatter_v(ReadData(send), WriteData(recv), recv_counts,
                            PairType<R, W>(), op);
  }
  template <ReadBuffer R, WriteBuffer W>
  WorkOr ireduce_scatter_v(R&& send, W&& recv,
                           absl::Span<const size_t> recv_counts, ReduceOp op,
                           const AsyncOptions& options = {}) {
    VEMESH_RETURN_IF_ERROR(VLengths("ireduce_scatter_v", "recv",
                                    BufferSize(recv), "send", BufferSize(send),
                                    recv_counts));
    return ireduce_scatter_v(ReadData(send), WriteData(recv), recv_counts,
                             PairType<R, W>(), op, options);
  }
  // `recv` is written at `root` only: size() times `send` there.
  template <ReadBuffer R, WriteBuffer W>
  absl::Status gather(R&& send, W&& recv, int root) {
    VEMESH_RETURN_IF_ERROR(RootLength("gather", "recv", BufferSize(recv),
                                      BufferSize(send) * size(), root));
    return gather(ReadData(send), RecvAt(recv, root), BufferSize(send),
                  PairType<R, W>(), root);
  }
  template <ReadBuffer R, WriteBuffer W>
  WorkOr igather(R&& send, W&& recv, int root,
                 const AsyncOptions& options = {}) {
    VEMESH_RETURN_IF_ERROR(RootLength("igather", "recv", BufferSize(recv),
                                      BufferSize(send) * size(), root));
    return igather(ReadData(send), RecvAt(recv, root), BufferSize(send),
                   PairType<R, W>(), root, options);
  }
  // `send` is read at `root` only: size() times `recv` there.
  template <ReadBuffer R, WriteBuffer W>
  absl::Status scatter(R&& send, W&& recv, int root) {
    VEMESH_RETURN_IF_ERROR(RootLength("scatter", "send", BufferSize(send),
                                      BufferSize(recv) * size(), root));
    return scatter(SendAt(send, root), WriteData(recv), BufferSize(recv),
                   PairType<R, W>(), root);
  }
  template <ReadBuffer R, WriteBuffer W>
  WorkOr iscatter(R&& send, W&& recv, int root,
                  const AsyncOptions& options = {}) {
    VEMESH_RETURN_IF_ERROR(RootLength("iscatter", "send", BufferSize(send),
                                      BufferSize(recv) * size(), root));
    return iscatter(SendAt(send, root), WriteData(recv), BufferSize(recv),
                    PairType<R, W>(), root, options);
  }
  // Equal blocks: both buffers hold size() blocks of the same length.
  template <ReadBuffer R, WriteBuffer W>
  absl::Status all_to_all(R&& send, W&& recv) {
    VEMESH_RETURN_IF_ERROR(AllToAllLengths(BufferSize(send), BufferSize(recv)));
    return all_to_all(ReadData(send), WriteData(recv),
                      BufferSize(send) / size(), PairType<R, W>());
  }
  template <ReadBuffer R, WriteBuffer W>
  WorkOr iall_to_all(R&& send, W&& recv, const AsyncOptions& options = {}) {
    VEMESH_RETURN_IF_ERROR(AllToAllLengths(BufferSize(send), BufferSize(recv)));
    return iall_to_all(ReadData(send), WriteData(recv),
                       BufferSize(send) / size(), PairType<R, W>(), options);
  }
  template <ReadBuffer R, WriteBuffer W>
  absl::Status all_to_all_v(R&& send, absl::Span<const size_t> send_counts,
                            W&& recv, absl::Span<const size_t> recv_counts) {
    VEMESH_RETURN_IF_ERROR(
        TotalError("all_to_all_v", "send", BufferSize(send), send_counts));
    VEMESH_RETURN_IF_ERROR(
        TotalError("all_to_all_v", "recv", BufferSize(recv), recv_counts));
    return all_to_all_v(ReadData(send), send_counts, WriteData(recv),
                        recv_counts, PairType<R, W>());
  }
  template <ReadBuffer R, WriteBuffer W>
  WorkOr iall_to_all_v(R&& send, absl::Span<const size_t> send_counts, W&& recv,
                       absl::Span<const size_t> recv_counts,
                       const AsyncOptions& options = {}) {
    VEMESH_RETURN_IF_ERROR(
        TotalError("iall_to_all_v", "send", BufferSize(send), send_counts));
    VEMESH_RETURN_IF_ERROR(
        TotalError("iall_to_all_v", "recv", BufferSize(recv), recv_counts));
    return iall_to_all_v(ReadData(send), send_counts, WriteData(recv),
                         recv_counts, PairType<R, W>(), options);
  }
  // Point to point, to a group rank (int) or a GlobalRank.
  template <ReadBuffer R>
  absl::Status send(R&& data, int peer) {
    return send(ReadData(data), BufferSize(data), TypeOf<R>(), peer);
  }
  template <ReadBuffer R>
  absl::Status send(R&& data, GlobalRank peer) {
    return send(ReadData(data), BufferSize(data), TypeOf<R>(), peer);
  }
  template <WriteBuffer W>
  absl::Status recv(W&& data, int peer) {
    return recv(WriteData(data), BufferSize(data), TypeOf<W>(), peer);
  }
  template <WriteBuffer W>
  absl::Status recv(W&& data, GlobalRank peer) {
    return recv(WriteData(data), BufferSize(data), TypeOf<W>(), peer);
  }
  template <ReadBuffer R>
  WorkOr isend(R&& data, int peer, const AsyncOptions& options = {}) {
    return isend(ReadData(data), BufferSize(data), TypeOf<R>(), peer, options);
  }
  template <ReadBuffer R>
  WorkOr isend(R&& data, GlobalRank peer, const AsyncOptions& options = {}) {
    return isend(ReadData(data), BufferSize(data), TypeOf<R>(), peer, options);
  }
  template <WriteBuffer W>
  WorkOr irecv(W&& data, int peer, const AsyncOptions& options = {}) {
    return irecv(WriteData(data), BufferSize(data), TypeOf<W>(), peer, options);
  }
  template <WriteBuffer W>
  WorkOr irecv(W&& data, GlobalRank peer, const AsyncOptions& options = {}) {
    return irecv(WriteData(data), BufferSize(data), TypeOf<W>(), peer, options);
  }
  template <ReadBuffer R, WriteBuffer W>
  absl::Status send_recv(R&& send, int dest, W&& recv, int source) {
    return send_recv(ReadData(send), BufferSize(send), dest, WriteData(recv),
                     BufferSize(recv), source, PairType<R, W>());
  }
  template <ReadBuffer R, WriteBuffer W>
  WorkOr isend_recv(R&& send, int dest, W&& recv, int source,
                    const AsyncOptions& options = {}) {
    return isend_recv(ReadData(send), BufferSize(send), dest, WriteData(recv),
                      BufferSize(recv), source, PairType<R, W>(), options);
  }

 protected:
  // -- Backend hooks ----------------------------------------------------------
  // Starts a checked operation: its arguments are valid for this group and
  // the communicator is not aborted. The returned Work finishes it.
  virtual WorkOr Start(const Operation& op) = 0;
  // The largest count (elements, per buffer and in total) the backend takes:
  // INT_MAX for MPI and Gloo (int counts), unbounded for NCCL.
  virtual size_t MaxCount() const;
  // Whether the backend can be used from here right now (MPI: not
  // finalised, a thread MPI allows). Called before every operation.
  virtual absl::Status CheckUsable(absl::string_view op) const;
  // Called once by abort(), from any thread: release what blocks (NCCL:
  // ncclCommAbort). The default does nothing: blocked waits notice the
  // abort themselves.
  virtual void OnAbort() {}
  // Called by AbortCommunicators with every newly aborted communicator of
  // this one's backend (this one included, all of this class): release
  // them together. The default calls OnAbort on each.
  virtual void OnAbortMany(absl::Span<Communicator* const> same_backend);
  // shrink's backend part: `exclude` is checked, sorted and non-empty or
  // empty (a rebuild of the same members). The default is Unimplemented.
  virtual absl::StatusOr<std::shared_ptr<Communicator>> Shrink(
      absl::Span<const int> exclude, const ShrinkOptions& options);
  // The members of this group that stay after `exclude` (sorted group
  // ranks): their global ranks, and this rank's index among them.
  std::vector<int> Survivors(absl::Span<const int> exclude,
                             int* new_rank) const;

  // The shared_ptr that owns this communicator, for the Works it starts
  // (null when it is not owned by one).
  std::shared_ptr<Communicator> Self() { return weak_from_this().lock(); }

  // For a communicator whose group can be replaced
  // (ReconfigurableCommunicator::configure): forgets group_rank's map, built
  // from the ranks() of the group before, and an abort() of that group, so
  // that the new group starts usable. No other backend calls them.
  void ForgetGroupRanks();
  void ClearAborted();

  static absl::Status LengthError(absl::string_view op, absl::string_view what,
                                  size_t got, size_t expected);
  // InvalidArgument when a span of `length` elements does not hold exactly
  // the sum of `counts`.
  static absl::Status TotalError(absl::string_view op, absl::string_view what,
                                 size_t length,
                                 absl::Span<const size_t> counts);
  // InvalidArgument unless `length` is size() * `block`.
  absl::Status Multiple(absl::string_view op, absl::string_view what,
                        size_t length, size_t block) const;
  // InvalidArgument when this rank is `root` and `length` is not
  // `expected` (the buffer that only the root uses).
  absl::Status RootLength(absl::string_view op, absl::string_view what,
                          size_t length, size_t expected, int root) const;
  // The V forms: buffer `mine_what` holds counts[rank()] elements,
  // `total_what` their sum. (A count list of the wrong length is left to
  // the operation's own check, which names it.)
  absl::Status VLengths(absl::string_view op, absl::string_view mine_what,
                        size_t mine, absl::string_view total_what, size_t total,
                        absl::Span<const size_t> counts) const;
  absl::Status AllToAllLengths(size_t send, size_t recv) const;
  template <typename R>
  static constexpr DataType TypeOf() {
    return DataTypeOf<BufferValue<R>>();
  }
  // The element type of a send/recv pair, which must be one type.
  template <typename R, typename W>
  static constexpr DataType PairType() {
    static_assert(std::is_same_v<BufferValue<R>, BufferValue<W>>,
                  "the send and recv buffers of a typed operation must hold "
                  "the same element type (const or not)");
    return DataTypeOf<BufferValue<W>>();
  }
  // The root-only buffer: its data at `root`, null elsewhere when empty.
  template <typename W>
  void* RecvAt(W& recv, int /*root*/) {
    return BufferSize(recv) == 0 ? nullptr : WriteData(recv);
  }
  template <typename R>
  const void* SendAt(R& send, int /*root*/) {
    return BufferSize(send) == 0 ? nullptr : ReadData(send);
  }

 private:
  absl::Status Check(const Operation& op) const;
  absl::Status CheckBuffer(const Operation& op, absl::string_view what,
                           const void* data, size_t count) const;
  absl::Status CheckRank(const Operation& op, absl::string_view what,
                         int64_t rank) const;
  absl::Status CheckCounts(const Operation& op, absl::string_view what,
                           absl::Span<const size_t> counts,
                           size_t* total) const;
  absl::StatusOr<int> PeerOf(absl::string_view op, GlobalRank peer) const;
  // Marks this communicator aborted with `reason`; false when it already
  // was (abort() and AbortCommunicators then do nothing more).
  bool MarkAborted(absl::string_view reason);
  friend void AbortCommunicators(
      absl::Span<const std::shared_ptr<Communicator>> comms,
      absl::string_view reason);
  std::string AllToAllLengthText(size_t send, size_t recv) const;

  std::atomic<bool> aborted_{false};
  std::atomic<int64_t> timeout_ns_{-1};  // < 0: infinite
  mutable std::mutex abort_mu_;
  std::string abort_reason_;  // under abort_mu_
  mutable std::mutex group_rank_mu_;
  mutable bool group_rank_built_ = false;  // under group_rank_mu_
  mutable absl::flat_hash_map<int64_t, int> group_rank_of_;  // under it
};

}  // namespace vemesh

#endif  // VEMESH_COMM_COMMUNICATOR_H_
