// vemesh/comm/gloo/gloo_communicator.h
//
// The Gloo backend of Communicator: host buffers over TCP, no MPI needed.
// Ranks find each other through a vemesh Store, so it works wherever the
// store does (threads of one process sharing a MemoryStore, processes
// sharing a TCP store).
//
//   std::shared_ptr<Store> store = ...;          // shared by every rank
//   auto world = GlooCommunicator::Create(store, "job7/world", rank, size,
//                                         global_ranks, absl::Seconds(30));
//   if (!world.ok()) return world.status();      // e.g. a rank never came
//   std::vector<float> grad(1024, 1.0f);
//   absl::Status s =
//       (*world)->all_reduce(absl::MakeSpan(grad), ReduceOp::kSum);
//   auto row = (*world)->split(rank / 4, rank % 4);  // collective
//
// Create is collective over the `size` ranks: each calls it once with the
// same store, prefix, size, global_ranks and timeout, and its own rank. They
// connect a full mesh of TCP pairs on a tcp device bound to `hostname`,
// each posting its pairs' addresses as one value (`prefix/pairs/<rank>`)
// and reading the others' in reads of about 64 KiB (internal/gloo_pairs.h). A
// prefix must be fresh: reusing one would read the addresses of an earlier
// group. split() derives fresh ones (`prefix/split/<n>/<color>`). Create
// returns once every rank is connected (it ends with a barrier), so a rank may
// drop the group at once without breaking a peer's connect.
//
// Deadlines: `timeout` bounds the rendezvous and every later wait inside an
// operation (Gloo's context timeout). A rank that never arrives or stops
// answering gives DeadlineExceeded; a peer whose connection closes or resets
// (it died, or destroyed its communicator) gives Unavailable, as soon as the
// socket says so. After such a failure the communicator is broken: it closes
// its connections, so that its peers fail fast too rather than wait out the
// timeout, and every later operation returns the same error. Bad arguments
// (InvalidArgument, checked by Communicator) break nothing. The
// communicator's own timeout (set_timeout, for blocking operations) stays
// infinite unless set: Gloo's bounds every wait already.
//
// Every operation of communicator.h, every DataType and ReduceOp. Gloo has
// no general reduce-scatter, so reduce_scatter(_v) is an all_to_all(v) of
// the blocks followed by a local reduction in rank order (each element
// crosses the network once, in one round). 16-bit floats are reduced in
// fp32 and rounded back once per combining step; avg is a sum divided by
// size() afterwards.
//
// Point to point: every message carries a small header with its byte count
// ahead of the data, so that a length mismatch is reported (InvalidArgument
// naming both counts) instead of overrunning the receiver. A send to oneself
// is kept until a receive from oneself takes it, in issue order; a receive
// from oneself issued with no send to oneself before it (or in the same
// batch) is FailedPrecondition at once, also in the `i` form.
//
// Collectives check that every rank passes the same operation, count,
// type, reduce op and root (and consistent count lists for the V forms):
// each rank's 32-byte summary is all-gathered before the data moves, and a
// mismatch is InvalidArgument on every rank, naming the ranks and what each
// passed, and breaks nothing. Without it Gloo would abort the process
// inside its I/O thread, or a broadcast into a larger buffer would return
// OK with the rest unwritten. The check costs one small all-gather per
// collective.
//
// Asynchrony: Gloo's algorithms block the calling thread, so each
// communicator runs its operations on one worker thread of its own, started
// by the first operation (a group that is only created, split or dropped
// costs no thread). Every operation, blocking or not, is queued to it, so
// operations run in the order they were issued, the same order on every
// rank; a Work finishes when the worker has run its operation. The blocking
// forms pay one hand-off to the worker (a few tens of microseconds). Sends
// to peers are posted at once by the issuing thread (Gloo moves them on
// its I/O thread), so `irecv` then `isend` on every rank of a ring works.
// A receive, though, holds the worker until its message came: a collective
// issued after an `irecv` waits for that message (as on one NCCL stream);
// post the matching sends first, or use batch_send_recv.
//
// Abort (abort(), or a Work::wait past its deadline, from any thread):
// waiters return Aborted as soon as the worker has left the operation, and
// not before (Gloo's I/O thread may write into its buffers until then, and
// the caller may free them once the wait returns). The worker is released
// at once from a send or receive (their waits are aborted) and the
// connections are reset,
// so peers fail at once (Unavailable) and the worker's next step inside a
// collective fails; a worker blocked inside one of Gloo's own collective
// waits, which cannot be interrupted from outside, finishes at the Gloo
// timeout at the latest. Operations queued behind it end Aborted without
// running. The destructor drops queued operations and joins the worker,
// which takes at most the Gloo timeout.
//
// Threads: one thread at a time issues operations on a communicator;
// abort() may come from any. Different communicators may be used from
// different threads. Splits share their parent's device (one I/O thread),
// each with its own connections and worker. `native_handle()` must not be
// used while an operation is in flight (the worker uses the context).
//
// Connections only where they are used (CreateLazy, subgroup): a world made
// by CreateLazy holds its device (one listening socket) and no pairs; it
// connects its full mesh on its first operation or split, which must then be
// collective over the whole group (every rank's first use is the same call).
// subgroup() connects a group of some of its members through the store
// without touching the parent's pairs: a process holds sockets only to the
// peers of the groups it is in. When a peer of a lazy connect is gone (it
// never publishes its address within the Gloo timeout), the operation is
// Unavailable naming that peer's group and global rank (and every later one
// says the same at once); a creation or subgroup whose member never comes
// stays DeadlineExceeded, now naming the missing members.
//
// A vemesh built with VEMESH_WITH_GLOO=OFF has no Gloo: Create then answers
// Unimplemented naming the option (comm/gloo/gloo_stub.cc), and so does
// every world built on it (StoreBootstrap::world, a cpu mesh under env://).

#ifndef VEMESH_COMM_GLOO_GLOO_COMMUNICATOR_H_
#define VEMESH_COMM_GLOO_GLOO_COMMUNICATOR_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/rendezvous/store.h"

namespace gloo {
class Context;
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace vemesh {
namespace gloo_internal {
class ShmGroup;
}  // namespace gloo_internal

class GlooCommunicator final : public Communicator {
 public:
  // Collective over `size` ranks, see above. `global_ranks` (size entries)
  // become ranks(); `hostname` is the address this rank listens on.
  static absl::StatusOr<std::shared_ptr<GlooCommunicator>> Create(
      std::shared_ptr<Store> store, absl::string_view prefix, int rank,
      int size, std::vector<int> global_ranks, absl::Duration timeout,
      absl::string_view hostname = "127.0.0.1");

  // As Create, but connects nothing yet (see above): the first operation or
  // split connects the whole group.
  static absl::StatusOr<std::shared_ptr<GlooCommunicator>> CreateLazy(
      std::shared_ptr<Store> store, absl::string_view prefix, int rank,
      int size, std::vector<int> global_ranks, absl::Duration timeout,
      absl::string_view hostname = "127.0.0.1");

  // Collective over `members` (indices into this group, in the new group's
  // rank order, this rank among them) only: each member calls it with the
  // same `name` (fresh within this group) and list. Connects the new group
  // through the store on this group's device; this group's own pairs are
  // neither used nor made.
  //
  //   auto row = world->subgroup("dim0/3", {6, 7});   // ranks 6 and 7 only
  absl::StatusOr<std::shared_ptr<GlooCommunicator>> subgroup(
      absl::string_view name, std::vector<int> members);

  // Several subgroups in one store round (a mesh's dimension groups):
  // collective over the union of their members, each of which passes the
  // groups it is in, with the same `batch` (fresh within this group) on
  // every rank and, for each group, the same name and members as its other
  // members. Each rank makes the pairs of all its groups first, posts their
  // addresses as one value under `<prefix>/fold/<batch>/<rank>`, reads its
  // groups' peers' values in one wait, then connects every pair and ends
  // with one barrier per group in `specs` order. The groups are as
  // subgroup()'s (prefixes `<prefix>/sub/<name>`), in `specs` order; a
  // member that never posts is DeadlineExceeded naming it in each of its
  // groups.
  //
  //   auto groups = world->subgroups("dims", {{"dim0/0", {0, 1}},
  //                                           {"dim1/0", {0, 2}}});
  struct SubgroupSpec {
    std::string name;
    std::vector<int> members;
  };
  absl::StatusOr<std::vector<std::shared_ptr<GlooCommunicator>>> subgroups(
      absl::string_view batch, std::vector<SubgroupSpec> specs);

  // Whether the pairs are connected (false for a CreateLazy world not used
  // yet).
  bool connected() const { return connected_.load(); }
  // `comm` as a GlooCommunicator whose pairs are not connected yet (a
  // CreateLazy world), else nullptr. A function of this file rather than a
  // dynamic_cast at the caller: a build without Gloo has no type info.
  static GlooCommunicator* UnconnectedWorld(Communicator* comm);
  // `comm` as a GlooCommunicator (sharing its ownership), or null when it is
  // another backend's (or a wrapper's): subgroup() for callers that hold a
  // Communicator (the Python module's torch backend, dist.new_group).
  static std::shared_ptr<GlooCommunicator> Of(
      const std::shared_ptr<Communicator>& comm);

  // Drops queued operations and joins the worker (at most the Gloo
  // timeout, when it is blocked inside an operation).
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Span<const int> ranks() const override { return ranks_; }
  absl::string_view backend() const override {
    return BackendName(Backend::kGloo);
  }
  const std::string& prefix() const { return prefix_; }
  // The store this group met through (a lazy world's NCCL ids go there).
  const std::shared_ptr<Store>& store() const { return store_; }
  // Gloo's bound on the rendezvous and on each wait inside an operation
  // (not Communicator::timeout(), the bound of blocking forms).
  absl::Duration gloo_timeout() const { return gloo_timeout_; }

  // One all_gather of (color, key) over this group, then one rendezvous per
  // new group. A negative color gives nullptr.
  absl::StatusOr<std::shared_ptr<Communicator>> split(int color,
                                                      int key) override;
  // Over a world not connected yet (CreateLazy), when every request of
  // this rank carries its members (SplitRequest::members, group_local): the
  // groups as subgroups() makes them, in one store round among their
  // members (batch `many<n>`, the n-th split_many of this group; groups
  // `many<n>/<request index>/<first member>`), and the world's pairs are
  // not made; a rank whose colors are all negative makes no call. Else one
  // split() per request (which connects a lazy world first).
  absl::StatusOr<std::vector<std::shared_ptr<Communicator>>> split_many(
      absl::Span<const SplitRequest> requests,
      absl::Time deadline = absl::InfiniteFuture()) override;
  // The store and prefix() (a lazy world's NCCL ids go there).
  StoreScope store_scope() const override;

  // `handle` is the gloo::Context* (valid while this object lives; null for
  // a lazy world not connected yet).
  NativeHandle native_handle() const override;

 protected:
  WorkOr Start(const Operation& op) override;
  size_t MaxCount() const override;
  void OnAbort() override;
  // A new rendezvous of the survivors over this group's store (prefix
  // "<prefix>/shrink/<n>/<excluded>"), on this group's device; it needs
  // no connection of this group, so it works after an abort.
  absl::StatusOr<std::shared_ptr<Communicator>> Shrink(
      absl::Span<const int> exclude, const ShrinkOptions& options) override;

 private:
  struct Job;
  class GlooWork;

  GlooCommunicator(std::shared_ptr<Store> store, std::string prefix, int rank,
                   int size, std::vector<int> ranks, absl::Duration timeout,
                   std::string hostname,
                   std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<gloo::Context> context);
  // Connects a new group on `device`: Create makes the device, splits reuse
  // their parent's.
  static absl::StatusOr<std::shared_ptr<GlooCommunicator>> Connect(
      std::shared_ptr<Store> store, std::string prefix, int rank, int size,
      std::vector<int> ranks, absl::Duration timeout, std::string hostname,
      std::shared_ptr<gloo::transport::Device> device);

  // The rendezvous of a group on `device` (a full mesh, then a barrier).
  static absl::StatusOr<std::shared_ptr<gloo::Context>> ConnectContext(
      const std::shared_ptr<Store>& store, const std::string& prefix, int rank,
      int size, absl::Duration timeout, const std::vector<int>& ranks,
      const std::shared_ptr<gloo::transport::Device>& device, bool lazy);
  // Connects a lazy world on its first use (issuing thread).
  absl::Status EnsureConnected();

  // The worker thread: runs queued jobs in order until stopping_.
  void WorkerLoop();
  // Runs one operation on the worker: refuses it when aborted or broken,
  // and breaks the communicator when it fails.
  absl::Status Execute(Job& job);
  // The Gloo calls of each operation (throw on failure, see gloo_error.h).
  void RunCollective(const Operation& op);
  // Every rank's kind, count, type, op and root (count lists for the V
  // forms), exchanged before the data: InvalidArgument on every rank when
  // they differ, so that Gloo never sees a mismatch (it aborts the process
  // or leaves a larger buffer partly unwritten).
  absl::Status CheckAgreement(const Operation& op);
  // Whether every rank passed the same 32-byte summary: ceil(log2 size)
  // rounds of one 64-byte message each (gloo_agreement.cc).
  bool SummariesAgree(const void* summary, uint32_t tag);
  // all_to_all_v's pairwise check of the count lists.
  absl::Status CheckAllToAllCounts(const Operation& op);
  // The 32-byte summary of `op` into `out`, and the verdict on every
  // rank's (InvalidArgument naming the first rank unlike rank 0).
  static void SummarizeInto(const Operation& op, void* out);
  absl::Status CompareSummaries(const Operation& op,
                                absl::FunctionRef<const void*(int)> summary_of);
  // Same-host groups (gloo_shm.cc): at the first collective every rank
  // learns whether all share its host; if so (and VEMESH_GLOO_SHM is not
  // 0 on any), rank 0 makes a shared segment the others map.
  void SetUpShm();
  // `op`'s agreement round on shared memory, carrying the payload of a
  // small collective, whose result it then computes (*finished), or the
  // first of a large all_reduce's, broadcast's, all_gather's or
  // reduce_scatter's chunked rounds. A returned error breaks the communicator
  // (a rank died, timeout, abort); a disagreement is `*verdict`.
  absl::Status ShmRound(const Operation& op, absl::Status* verdict,
                        bool* finished);
  // Point to point. Sends to peers are posted when the operation is
  // issued (PostSends, on the issuing thread), so that a receive queued
  // ahead of them on a peer's worker cannot wait for them forever; the
  // worker takes messages to oneself, receives in order and waits for the
  // sends. A receive of the wrong length is InvalidArgument and leaves the
  // stream in step. Once a same-host group's segment is set up, its
  // messages go through it (a payload too large for the pair's ring free
  // space still goes by TCP); a failure of its waits (a peer died or left,
  // timeout, abort) is `*failed` and breaks the communicator.
  void PostSends(Job& job);
  absl::Status RunBatch(Job& job, absl::Status* failed);
  // Receives the next message from `peer` (not oneself), through the
  // segment or TCP as its sender sent it.
  absl::Status ReceiveFrom(absl::string_view op, int peer, void* data,
                           size_t count, DataType type, absl::Status* failed);
  // The tag of the next collective. Every rank runs collectives in the
  // same order, so the counters agree, and a late message of one
  // collective can never match another.
  uint32_t NextTag() { return next_tag_++; }
  // Takes the oldest message sent to oneself into `data`.
  absl::Status TakeFromSelf(absl::string_view op, void* data, size_t count,
                            DataType type);
  // Waits on a send or receive buffer of a point-to-point operation; abort
  // can interrupt it. Throws when it failed or was interrupted.
  void WaitSend(gloo::transport::UnboundBuffer& buffer);
  void WaitRecv(gloo::transport::UnboundBuffer& buffer);
  // Registers a buffer that OnAbort may interrupt while the guard lives.
  class Interruptible;
  // A message on its way to a peer (header and payload).
  class Outgoing;
  // Receives one message from `peer` into `data` (`count` elements) when
  // its length matches; InvalidArgument naming both counts otherwise.
  absl::Status Receive(absl::string_view op, int peer, void* data, size_t count,
                       DataType type);

  std::shared_ptr<Store> store_;
  std::string prefix_;
  int rank_;
  int size_;
  std::vector<int> ranks_;
  absl::Duration gloo_timeout_;
  std::string hostname_;
  // Declared before the context so that the context is destroyed first.
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  // Set once context_ is (OnAbort reads it from any thread).
  std::atomic<bool> connected_{false};
  absl::Status connect_error_;  // a failed lazy connect, kept
  // The issuing thread's.
  int64_t next_split_ = 0;
  int64_t next_split_many_ = 0;  // numbers split_many calls alike
  int64_t next_shrink_ = 0;      // numbers shrinks alike on every survivor
  int64_t self_sent_ = 0;        // messages to oneself issued
  int64_t self_taken_ = 0;       // receives from oneself issued

  // The worker's own state: only it reads or writes these.
  uint32_t next_tag_ = 1;  // 0 is the rendezvous barrier's
  bool shm_tried_ = false;
  std::unique_ptr<gloo_internal::ShmGroup> shm_;  // same-host groups only
  // shm_ once set up, for OnAbort on any thread (freed after the worker).
  std::atomic<gloo_internal::ShmGroup*> shm_shared_{nullptr};
  absl::Status broken_;

  // Messages sent to oneself, oldest first: kept by the issuing thread,
  // taken by the worker.
  std::mutex to_self_mu_;
  std::deque<std::vector<char>> to_self_;  // under to_self_mu_

  // The queue between issuing threads and the worker.
  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<std::shared_ptr<Job>> queue_;  // under queue_mu_
  bool stopping_ = false;                   // under queue_mu_
  std::thread worker_;                      // started under queue_mu_

  // Point to point through the segment: the issuing threads' sends are
  // counted per peer, so that a receiver knows which of them went by TCP
  // before the segment was opened to them.
  std::mutex p2p_mu_;
  std::vector<uint64_t> sent_;                  // under p2p_mu_
  gloo_internal::ShmGroup* p2p_shm_ = nullptr;  // under p2p_mu_
  // The worker's: receives run per peer, and how many messages each peer
  // sent by TCP before it opened its sends here (-1: not known yet).
  std::vector<uint64_t> received_;
  std::vector<int64_t> tcp_before_;

  // Point-to-point buffers the worker waits on, for OnAbort.
  std::mutex interruptible_mu_;
  std::vector<gloo::transport::UnboundBuffer*> interruptible_;
};

}  // namespace vemesh

#endif  // VEMESH_COMM_GLOO_GLOO_COMMUNICATOR_H_
