// vemesh/comm/nccl/nccl_communicator.h
//
// The NCCL backend of Communicator: device buffers, bootstrapped over a host
// communicator (MPI under mpirun, Gloo under torchrun / env://). Built when
// NCCL's and CUDA's headers are found (VEMESH_HAVE_NCCL); otherwise
// nccl_stub.cc beside this file gives the two functions below, and they
// answer Unimplemented. libnccl and libcudart are loaded at the first call,
// never linked (internal/nccl_api.h: VEMESH_NCCL_LIBRARY,
// VEMESH_CUDART_LIBRARY): where they are missing, both functions answer
// Unavailable saying which library and what to do.
//
//   absl::StatusOr<int> gpus = CudaDeviceCount();   // error when no GPU
//   std::shared_ptr<Communicator> host_world = ...;  // MPI or Gloo
//   auto nccl = CreateNcclCommunicator(host_world, /*device=*/local_rank);
//   float* grad = ...;                              // device memory
//   (*nccl)->all_reduce(grad, grad, n, DataType::kFloat32, ReduceOp::kSum);
//
// Every NCCL communicator is paired with a host-memory *twin* (any CPU
// backend) holding the same members in the same order. The twin answers
// ranks() and carries the bootstrap: rank 0 makes the unique id and
// broadcasts it over the twin, so no MPI is needed. `split` splits the twin
// and the NCCL communicator (ncclCommSplit) with the same color and key: two
// collectives per split, whatever the number of groups.
//
// A mesh makes all its dimensions' groups with one `split_many`: one twin
// split per dimension, then every ncclCommSplit inside one
// ncclGroupStart/ncclGroupEnd, so that NCCL (>= 2.27) builds the
// communicators concurrently instead of one after another. Each child is
// named after its dimension (ncclConfig_t::commName, shown in NCCL's logs)
// and shares the parent's resources when NcclOptions::split_share says so.
// The calls return at once (non-blocking config); the children are then
// polled together until all are ready, one fails, the deadline passes or
// abort() is called. On any failure every child made so far is aborted and
// the parent too (the other ranks are in the same splits and must not wait
// for this one); the status names the dimension.
//
// Operations are asynchronous on the device: each is enqueued on the
// caller's stream (AsyncOptions::stream, a cudaStream_t) or the
// communicator's own, and a CUDA event recorded after it; its Work polls the
// event and NCCL's asynchronous error, so neither form synchronises the
// device or the stream (the blocking form is the Work waited for). Equal
// collectives map to NCCL's own; the uneven and rooted ones are NCCL groups:
// all_gather_v is one ncclBroadcast per block, reduce_scatter_v one
// ncclReduce per block, gather, scatter, all_to_all(_v) and batches are
// ncclSend/ncclRecv pairs (zero-count blocks skipped), which every NCCL since
// 2.7 has. A send and a receive must agree on the count, as in NCCL: a
// mismatch cannot be seen by one rank.
//
// The NCCL communicator is non-blocking (ncclConfig_t::blocking = 0), so no
// NCCL call waits for a peer inside this library: creation, split and each
// enqueue are polled until NCCL has them in hand, bounded by the
// communicator's timeout (the twin's for creation) and by abort(). That is
// what lets `abort()` from another thread (ncclCommAbort) and a deadline end
// an operation whose peer never came, at the price of NCCL starting a helper
// thread per operation. NCCL's return codes become: ncclRemoteError and
// ncclSystemError Unavailable (a lost peer, a socket); ncclInvalidArgument and
// ncclInvalidUsage InvalidArgument; CUDA's "no device" FailedPrecondition;
// anything else Internal with NCCL's message. An asynchronous NCCL error
// ends the Work with that status and aborts the communicator (NCCL's rule:
// a failed communicator cannot be used again).
//
// Abort and release (NCCL's rules, 2.27+): AbortCommunicators (a
// DeviceMesh's abort()) releases all its NCCL communicators with
// ncclCommAbort inside one ncclGroupStart/ncclGroupEnd (one at a time
// before NCCL 2.27, which cannot group them). Once any NCCL communicator of
// one lineage (a communicator made by ncclCommInitRankConfig, all split or
// shrunk from it: one mesh's) was aborted, failed, or shrunk, every one of
// them released afterwards is released with ncclCommAbort, never
// ncclCommDestroy (a destroy flushes with peers that may be gone). `shrink`
// uses ncclCommShrink (nccl_shrink.cc): NCCL_SHRINK_ABORT when ShrinkOptions
// says so or this rank has unfinished operations on the parent, else
// NCCL_SHRINK_DEFAULT.
//
// Sources: nccl_lifecycle.cc (create, destroy, abort, state), nccl_ops.cc
// (operations and their Work), nccl_split.cc (split, split_many); under
// internal/: nccl_status.h (return codes as Status), cuda_resources.h (the
// current device, the stream), nccl_poll.h (waiting on a non-blocking
// communicator), nccl_api.h (the calls, replaceable by tests).

#ifndef VEMESH_COMM_NCCL_NCCL_COMMUNICATOR_H_
#define VEMESH_COMM_NCCL_NCCL_COMMUNICATOR_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/comm/nccl/cuda_device.h"
#include "vemesh/comm/nccl_options.h"
#include "vemesh/rendezvous/store.h"

namespace vemesh {

// The number of CUDA devices this process sees. An error (FailedPrecondition
// with CUDA's message, Unavailable when libcudart or libnccl cannot be
// loaded, or Unimplemented without NCCL support) when there is none: tests
// skip with `GTEST_SKIP() << "no GPU: " << status`.
absl::StatusOr<int> CudaDeviceCount();

// Collective over `twin`: an NCCL communicator with the same members, on
// CUDA device `device` of this process. The twin is kept (shared);
// `options` go to every communicator split from this one.
absl::StatusOr<std::shared_ptr<Communicator>> CreateNcclCommunicator(
    std::shared_ptr<Communicator> twin, int device,
    const NcclOptions& options = {});
// The same on the device `request` chooses (vemesh/comm/nccl/cuda_device.h:
// "cuda:N", one device per task, or the host-local rank). A rank that cannot
// have its device fails every rank, with that rank's reason and code.
absl::StatusOr<std::shared_ptr<Communicator>> CreateNcclCommunicator(
    std::shared_ptr<Communicator> twin, const CudaDeviceRequest& request,
    const NcclOptions& options = {});

// One group of CreateNcclGroupsOverStore: its host twin (connected, the same
// members in the same order as the NCCL communicator will have) and a name
// that is the same on all its members and unique within the call.
struct NcclStoreGroup {
  std::string name;
  std::shared_ptr<Communicator> twin;
};

// Collective over all `world_size` ranks sharing `store` (a torchrun mesh's
// dimensions, whose world is never connected): one NCCL communicator per
// group in `groups` (those this rank is in; none is fine), with no NCCL or
// host collective over the world. Every rank prepares its GPU and posts
// whether it could under `<prefix>/ok/<world_rank>`; each group's rank 0
// posts its unique id under `<prefix>/id/<name>` (empty when it failed);
// world rank 0 reads the world's flags and posts the verdict; every rank
// reads the verdict and its groups' ids in one wait, then calls
// ncclCommInitRankConfig once per group. A rank that cannot prepare its GPU
// fails every rank with the same FailedPrecondition naming it (its own
// status keeps its code), as CreateNcclCommunicator does; a rank that never
// posts ends the others' wait at `timeout` (DeadlineExceeded naming the
// keys). The groups share one lineage (abort, never destroy, after any
// abort). `prefix` must be fresh in `store`.
//
//   auto groups = CreateNcclGroupsOverStore(store, "job/nccl", rank, 8,
//       {{"dim0/0", twin0}, {"dim1/0", twin1}}, request, absl::Seconds(60));
absl::StatusOr<std::vector<std::shared_ptr<Communicator>>>
CreateNcclGroupsOverStore(const std::shared_ptr<Store>& store,
                          absl::string_view prefix, int world_rank,
                          int world_size, std::vector<NcclStoreGroup> groups,
                          const CudaDeviceRequest& request,
                          absl::Duration timeout,
                          const NcclOptions& options = {});

// Collective over every rank of `world`, a host world whose ranks met
// through a store (Communicator::store_scope: a torchrun world, which is
// never connected): one NCCL communicator per request (null for a negative
// color), with no NCCL or host collective over the world. The requests
// carry their members (SplitRequest::members), the same count on every
// rank, as for world->split_many. The host twins come from one
// world->split_many(requests) (a lazy Gloo world: one store round among
// the groups' members); the communicators from CreateNcclGroupsOverStore
// over the world's store under `<prefix>/nccl/<batch>` (`batch` fresh in
// the world), each named `<request name>/<first member>`. Ranks in none of
// the groups take part in the ready agreement only. FailedPrecondition
// when `world` met through no store.
//
//   auto dims = CreateNcclGroupsOverWorld(host_world, "dims0", requests,
//                                         request, absl::Seconds(60));
absl::StatusOr<std::vector<std::shared_ptr<Communicator>>>
CreateNcclGroupsOverWorld(const std::shared_ptr<Communicator>& world,
                          absl::string_view batch,
                          absl::Span<const SplitRequest> requests,
                          const CudaDeviceRequest& request,
                          absl::Duration timeout,
                          const NcclOptions& options = {});

}  // namespace vemesh

#ifdef VEMESH_HAVE_NCCL

// NCCL's and CUDA's opaque handles, so this header does not need their
// headers (they stay private to the library).
struct ncclComm;
struct CUstream_st;

namespace vemesh {

class NcclCommunicator final : public Communicator {
 public:
  // See CreateNcclCommunicator.
  static absl::StatusOr<std::shared_ptr<NcclCommunicator>> Create(
      std::shared_ptr<Communicator> twin, int device,
      const NcclOptions& options = {});
  static absl::StatusOr<std::shared_ptr<NcclCommunicator>> Create(
      std::shared_ptr<Communicator> twin, const CudaDeviceRequest& request,
      const NcclOptions& options = {});
  ~NcclCommunicator() override;

  int rank() const override { return twin_->rank(); }
  int size() const override { return twin_->size(); }
  absl::Span<const int> ranks() const override { return twin_->ranks(); }
  absl::string_view backend() const override {
    return BackendName(Backend::kNccl);
  }

  // split_many with one request.
  absl::StatusOr<std::shared_ptr<Communicator>> split(int color,
                                                      int key) override;
  // See the file comment. Bounded by the earlier of `deadline` and this
  // communicator's timeout.
  absl::StatusOr<std::vector<std::shared_ptr<Communicator>>> split_many(
      absl::Span<const SplitRequest> requests,
      absl::Time deadline = absl::InfiniteFuture()) override;
  // `handle` is the ncclComm_t; null once the communicator was aborted
  // (ncclCommAbort freed it).
  NativeHandle native_handle() const override;

  int device() const { return device_; }
  const NcclOptions& options() const { return options_; }
  const std::shared_ptr<Communicator>& twin() const { return twin_; }

 protected:
  WorkOr Start(const Operation& op) override;
  // NCCL counts are size_t: unbounded, short of a byte length that
  // overflows.
  size_t MaxCount() const override;
  // ncclCommAbort, once, from any thread.
  void OnAbort() override;
  // See CreateNcclGroupsOverStore.
  friend absl::StatusOr<std::vector<std::shared_ptr<Communicator>>>
  CreateNcclGroupsOverStore(const std::shared_ptr<Store>& store,
                            absl::string_view prefix, int world_rank,
                            int world_size, std::vector<NcclStoreGroup> groups,
                            const CudaDeviceRequest& request,
                            absl::Duration timeout, const NcclOptions& options);
  // One NCCL group of ncclCommAbort (see the file comment).
  void OnAbortMany(absl::Span<Communicator* const> same_backend) override;
  // ncclCommShrink, or a new communicator over the shrunk twin.
  absl::StatusOr<std::shared_ptr<Communicator>> Shrink(
      absl::Span<const int> exclude, const ShrinkOptions& options) override;

 private:
  friend class NcclWork;

  NcclCommunicator(std::shared_ptr<Communicator> twin, int device,
                   const NcclOptions& options, ncclComm* comm,
                   CUstream_st* stream, void* scratch);
  // Enqueues `op` as one NCCL group on `stream` (comm_mu_ held).
  absl::Status Enqueue(const Operation& op, CUstream_st* stream);
  // Polls until NCCL has taken the last enqueue in hand, bounded by the
  // timeout and abort().
  absl::Status WaitEnqueued(absl::string_view op);
  // One look at the communicator's asynchronous state (Aborted once
  // aborted); `in_progress` tells whether an enqueue is still running.
  absl::Status State(absl::string_view op, bool* in_progress);
  // Polls the children of splits issued on this communicator (entry i of
  // `children` answers `requests[i]`, whose index in the caller's list is
  // `first + i`) until every colored one is ready. Bounded by `deadline`
  // and abort().
  absl::Status AwaitSplits(absl::Span<const SplitRequest> requests,
                           absl::Span<ncclComm* const> children, size_t first,
                           absl::Time deadline);

  std::shared_ptr<Communicator> twin_;
  const int device_;
  const NcclOptions options_;
  // Guards comm_ against ncclCommAbort from another thread: every NCCL call
  // on it is short (the communicator is non-blocking) and made under this
  // lock, and OnAbort frees it under the lock and leaves null behind.
  mutable std::mutex comm_mu_;
  ncclComm* comm_;
  CUstream_st* stream_;
  // A one-element device buffer: barrier is an all_reduce of it.
  void* scratch_;
  // Operations started and not yet seen finished (NcclWork counts them).
  std::atomic<int> in_flight_{0};
  // Shared by a communicator made by ncclCommInitRankConfig and every one
  // split or shrunk from it: set once any of them was aborted, failed or
  // shrunk, after which all are released with ncclCommAbort.
  std::shared_ptr<std::atomic<bool>> lineage_aborted_ =
      std::make_shared<std::atomic<bool>>(false);
};

}  // namespace vemesh

#endif  // VEMESH_HAVE_NCCL

#endif  // VEMESH_COMM_NCCL_NCCL_COMMUNICATOR_H_
