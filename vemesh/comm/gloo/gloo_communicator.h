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
//   absl::Status s = (*world)->all_reduce(absl::MakeSpan(grad), ReduceOp::kSum);
//   auto row = (*world)->split(rank / 4, rank % 4);   // collective
//
// Create is collective over the `size` ranks: each calls it once with the
// same store, prefix, size, global_ranks and timeout, and its own rank. They
// connect a full mesh of TCP pairs (a gloo::rendezvous::Context on a tcp
// device bound to `hostname`), exchanging addresses under `prefix/` in the
// store. A prefix must be fresh: reusing one would read the addresses of an
// earlier group. split() derives fresh ones (`prefix/split/<n>/<color>`).
// Create returns once every rank is connected (it ends with a barrier), so
// a rank may drop the group at once without breaking a peer's connect.
//
// Deadlines: `timeout` bounds the rendezvous and every later wait inside an
// operation (Gloo's context timeout). A rank that never arrives or stops
// answering gives DeadlineExceeded; a peer whose connection closes or resets
// (it died, or destroyed its communicator) gives Unavailable, as soon as the
// socket says so. After such a failure the communicator is broken: it closes
// its connections, so that its peers fail fast too rather than wait out the
// timeout, and every later operation returns the same error. Bad arguments
// (InvalidArgument) are checked before Gloo is called and break nothing.
//
// Point to point: send/recv carry a small header with the byte count ahead
// of the data, so that a length mismatch is reported (InvalidArgument, as
// the MPI backend) instead of overrunning the receiver. A send to oneself is
// kept until a recv (or send_recv) from oneself takes it, in order.
//
// Like MPI, collectives assume every rank passes the same count and type;
// Gloo cannot check that, and a mismatch is undefined (it may abort inside
// Gloo's I/O thread).
//
// Threads: one thread at a time per communicator; different communicators
// may be used from different threads. Splits share their parent's device
// (one I/O thread), each with its own connections.

#ifndef VEMESH_COMM_GLOO_GLOO_COMMUNICATOR_H_
#define VEMESH_COMM_GLOO_GLOO_COMMUNICATOR_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
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
}  // namespace transport
}  // namespace gloo

namespace vemesh {

class GlooCommunicator final : public Communicator {
 public:
  // Collective over `size` ranks, see above. `global_ranks` (size entries)
  // become ranks(); `hostname` is the address this rank listens on.
  static absl::StatusOr<std::shared_ptr<GlooCommunicator>> Create(
      std::shared_ptr<Store> store, absl::string_view prefix, int rank,
      int size, std::vector<int> global_ranks, absl::Duration timeout,
      absl::string_view hostname = "127.0.0.1");

  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Span<const int> ranks() const override { return ranks_; }
  absl::string_view backend() const override { return "gloo"; }
  const std::string& prefix() const { return prefix_; }
  absl::Duration timeout() const { return timeout_; }

  absl::Status barrier() override;
  absl::Status broadcast(void* data, size_t count, DataType type,
                         int root) override;
  absl::Status all_reduce(const void* send, void* recv, size_t count,
                          DataType type, ReduceOp op) override;
  absl::Status all_gather(const void* send, void* recv, size_t count,
                          DataType type) override;
  absl::Status reduce_scatter(const void* send, void* recv, size_t count,
                              DataType type, ReduceOp op) override;
  absl::Status send(const void* data, size_t count, DataType type,
                    int peer) override;
  absl::Status recv(void* data, size_t count, DataType type,
                    int peer) override;
  absl::Status send_recv(const void* send_data, size_t send_count, int dest,
                         void* recv_data, size_t recv_count, int source,
                         DataType type) override;
  using Communicator::all_gather;
  using Communicator::all_reduce;
  using Communicator::broadcast;
  using Communicator::recv;
  using Communicator::reduce_scatter;
  using Communicator::send;
  using Communicator::send_recv;

  // One all_gather of (color, key) over this group, then one rendezvous per
  // new group. A negative color gives nullptr.
  absl::StatusOr<std::shared_ptr<Communicator>> split(int color,
                                                      int key) override;

  // `handle` is the gloo::Context* (valid while this object lives).
  NativeHandle native_handle() const override;

 private:
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

  // Runs `fn` (calls into Gloo) unless the communicator is already broken;
  // a failure breaks it.
  absl::Status Run(absl::string_view op, absl::FunctionRef<void()> fn);
  // The tag of the next collective. Every rank calls collectives in the
  // same order, so the counters agree, and a late message of one collective
  // can never match another.
  uint32_t NextTag() { return next_tag_++; }
  // Takes the oldest message sent to oneself into `data`.
  absl::Status TakeFromSelf(absl::string_view op, void* data, size_t count,
                            DataType type);

  std::shared_ptr<Store> store_;
  std::string prefix_;
  int rank_;
  int size_;
  std::vector<int> ranks_;
  absl::Duration timeout_;
  std::string hostname_;
  // Declared before the context so that the context is destroyed first.
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  uint32_t next_tag_ = 1;  // 0 is the rendezvous barrier's
  int64_t next_split_ = 0;
  absl::Status broken_;
  // Messages sent to oneself, oldest first.
  std::deque<std::vector<char>> to_self_;
};

}  // namespace vemesh

#endif  // VEMESH_COMM_GLOO_GLOO_COMMUNICATOR_H_
