#include "vemesh/comm/gloo/gloo_communicator.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/attr.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "vemesh/comm/gloo/gloo_error.h"
#include "vemesh/comm/gloo/gloo_store.h"
#include "vemesh/rendezvous/prefix_store.h"
#include "vemesh/status_macros.h"

namespace vemesh {
namespace {

// Point-to-point slots. Gloo's collectives use slot prefixes 0x01..0x08 in
// the top byte (gloo/types.h); 0x7e is ours. Every message is a header
// (its byte count) on one slot, then its payload on the next.
constexpr uint64_t kHeaderSlot = uint64_t{0x7e} << 56;
constexpr uint64_t kPayloadSlot = kHeaderSlot + 1;

// The most a vemesh sender ever sends: INT_MAX elements of 8 bytes. A
// header above it is garbage, never an allocation size.
constexpr uint64_t kMaxMessageBytes = uint64_t{INT_MAX} * 8;

bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto x = reinterpret_cast<uintptr_t>(a);
  auto y = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

// Calls `f(T{})` with the C++ type of `type`.
template <typename F>
void WithType(DataType type, F&& f) {
  switch (type) {
    case DataType::kFloat32:
      return f(float{});
    case DataType::kFloat64:
      return f(double{});
    case DataType::kInt32:
      return f(int32_t{});
    case DataType::kInt64:
      return f(int64_t{});
  }
  throw std::invalid_argument("unknown vemesh DataType");
}

// Gloo's reduction signature: c[i] = a[i] op b[i] (c may alias a or b).
template <typename T, ReduceOp kOp>
void Combine(void* c, const void* a, const void* b, size_t n) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (kOp == ReduceOp::kSum) out[i] = x[i] + y[i];
    if constexpr (kOp == ReduceOp::kMax) out[i] = std::max(x[i], y[i]);
    if constexpr (kOp == ReduceOp::kMin) out[i] = std::min(x[i], y[i]);
  }
}

template <typename T>
gloo::AllreduceOptions::Func Reduction(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return &Combine<T, ReduceOp::kSum>;
    case ReduceOp::kMax:
      return &Combine<T, ReduceOp::kMax>;
    case ReduceOp::kMin:
      return &Combine<T, ReduceOp::kMin>;
  }
  throw std::invalid_argument("unknown vemesh ReduceOp");
}

// All-reduce of `count` elements of `data`, in place.
void AllReduceInPlace(const std::shared_ptr<gloo::Context>& context,
                      uint32_t tag, void* data, size_t count, DataType type,
                      ReduceOp op) {
  WithType(type, [&](auto zero) {
    using T = decltype(zero);
    gloo::AllreduceOptions opts(context);
    opts.setOutput(static_cast<T*>(data), count);
    opts.setReduceFunction(Reduction<T>(op));
    opts.setTag(tag);
    gloo::allreduce(opts);
  });
}

// A message on its way to a peer: header and payload are posted at once
// (Gloo sends asynchronously); Wait() blocks until both left. Pinned in
// memory because Gloo holds the header's address.
class Outgoing {
 public:
  Outgoing(gloo::Context& context, int peer, const void* data, size_t bytes)
      : header_(bytes) {
    header_buffer_ = context.createUnboundBuffer(&header_, sizeof(header_));
    header_buffer_->send(peer, kHeaderSlot);
    if (bytes > 0) {
      // Gloo only reads a buffer it sends from.
      payload_ = context.createUnboundBuffer(const_cast<void*>(data), bytes);
      payload_->send(peer, kPayloadSlot);
    }
  }
  Outgoing(const Outgoing&) = delete;
  Outgoing& operator=(const Outgoing&) = delete;

  void Wait() {
    header_buffer_->waitSend();
    if (payload_ != nullptr) payload_->waitSend();
  }

 private:
  uint64_t header_;
  std::unique_ptr<gloo::transport::UnboundBuffer> header_buffer_;
  std::unique_ptr<gloo::transport::UnboundBuffer> payload_;
};

// Receives one message from `peer` and returns its byte count. It lands in
// `data` when it is `bytes` long, else in `*scratch`: Gloo aborts the
// process when a message is longer than the buffer posted for it, so the
// length is learnt first and the receive always fits.
uint64_t Receive(gloo::Context& context, int peer, void* data, size_t bytes,
                 std::vector<char>* scratch) {
  uint64_t header = 0;
  auto header_buffer = context.createUnboundBuffer(&header, sizeof(header));
  header_buffer->recv(peer, kHeaderSlot);
  header_buffer->waitRecv();
  if (header == 0) return 0;
  if (header > kMaxMessageBytes) {
    throw std::runtime_error(absl::StrCat("rank ", peer,
                                          " announced a message of ", header,
                                          " bytes: the stream is corrupt"));
  }
  void* target = data;
  if (header != bytes) {
    scratch->resize(header);
    target = scratch->data();
  }
  auto payload = context.createUnboundBuffer(target, header);
  payload->recv(peer, kPayloadSlot);
  payload->waitRecv();
  return header;
}

absl::Status CountMismatch(absl::string_view op, size_t expected, int peer,
                           uint64_t got_bytes, DataType type) {
  return absl::InvalidArgumentError(
      absl::StrCat(op, " expected ", expected, " elements from rank ", peer,
                   " but got ", got_bytes / SizeOf(type)));
}

}  // namespace

GlooCommunicator::GlooCommunicator(
    std::shared_ptr<Store> store, std::string prefix, int rank, int size,
    std::vector<int> ranks, absl::Duration timeout, std::string hostname,
    std::shared_ptr<gloo::transport::Device> device,
    std::shared_ptr<gloo::Context> context)
    : store_(std::move(store)),
      prefix_(std::move(prefix)),
      rank_(rank),
      size_(size),
      ranks_(std::move(ranks)),
      timeout_(timeout),
      hostname_(std::move(hostname)),
      device_(std::move(device)),
      context_(std::move(context)) {}

// The context closes its pairs (an orderly close: peers still read what was
// sent, then see the connection end), then the device stops its I/O thread
// once no other communicator shares it.
GlooCommunicator::~GlooCommunicator() = default;

absl::StatusOr<std::shared_ptr<GlooCommunicator>> GlooCommunicator::Create(
    std::shared_ptr<Store> store, absl::string_view prefix, int rank, int size,
    std::vector<int> global_ranks, absl::Duration timeout,
    absl::string_view hostname) {
  if (store == nullptr) {
    return absl::InvalidArgumentError("GlooCommunicator::Create needs a store");
  }
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("GlooCommunicator::Create: rank ", rank,
                     " is outside a group of ", size, " ranks"));
  }
  if (global_ranks.size() != static_cast<size_t>(size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GlooCommunicator::Create: ", global_ranks.size(),
        " global ranks for a group of ", size));
  }
  if (timeout < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GlooCommunicator::Create: timeout ",
                     absl::FormatDuration(timeout), " is below 1ms"));
  }
  std::shared_ptr<gloo::transport::Device> device;
  absl::Status status = RunGloo("gloo tcp device", [&] {
    gloo::transport::tcp::attr attr;
    attr.hostname = std::string(hostname);
    device = gloo::transport::tcp::CreateDevice(attr);
  });
  if (!status.ok()) return status;
  return Connect(std::move(store), std::string(prefix), rank, size,
                 std::move(global_ranks), timeout, std::string(hostname),
                 std::move(device));
}

absl::StatusOr<std::shared_ptr<GlooCommunicator>> GlooCommunicator::Connect(
    std::shared_ptr<Store> store, std::string prefix, int rank, int size,
    std::vector<int> ranks, absl::Duration timeout, std::string hostname,
    std::shared_ptr<gloo::transport::Device> device) {
  GlooStore rendezvous(std::make_shared<PrefixStore>(store, prefix), timeout);
  std::shared_ptr<gloo::rendezvous::Context> context;
  absl::Status status = RunGloo(
      absl::StrCat("gloo rendezvous of rank ", rank, " of ", size, " under '",
                   prefix, "'"),
      [&] {
        context = std::make_shared<gloo::rendezvous::Context>(rank, size);
        context->setTimeout(absl::ToChronoMilliseconds(timeout));
        context->connectFullMesh(rendezvous, device);
        // connectFullMesh can return before the peers have finished: a TCP
        // connect completes in the kernel before the listener accepts it.
        // A rank that returned and at once dropped the group would close a
        // socket its peer is still accepting. The barrier holds every rank
        // until all are connected. It uses tag 0; collectives start at 1.
        gloo::BarrierOptions barrier(context);
        barrier.setTag(0);
        gloo::barrier(barrier);
      });
  if (!status.ok()) {
    // The store's own code (DeadlineExceeded: a rank never came) says more
    // than the IoException that carried it through Gloo.
    absl::Status store_error = rendezvous.error();
    if (!store_error.ok()) {
      return absl::Status(store_error.code(), status.message());
    }
    return status;
  }
  return std::shared_ptr<GlooCommunicator>(new GlooCommunicator(
      std::move(store), std::move(prefix), rank, size, std::move(ranks),
      timeout, std::move(hostname), std::move(device), std::move(context)));
}


absl::Status GlooCommunicator::Run(absl::string_view op,
                                   absl::FunctionRef<void()> fn) {
  if (!broken_.ok()) {
    return absl::Status(
        broken_.code(),
        absl::StrCat(op, ": the communicator is broken by an earlier "
                         "failure: ",
                     broken_.message()));
  }
  absl::Status status = RunGloo(absl::StrCat("gloo ", op), fn);
  if (!status.ok()) {
    broken_ = status;
    // Gloo's pairs are in an unknown state now. Closing them (with a reset)
    // tells every peer at once, instead of leaving them to their timeout.
    RunGloo("close", [&] { context_->closeConnections(); }).IgnoreError();
  }
  return status;
}

absl::Status GlooCommunicator::barrier() {
  const uint32_t tag = NextTag();
  return Run("barrier", [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    gloo::barrier(opts);
  });
}

absl::Status GlooCommunicator::broadcast(void* data, size_t count,
                                         DataType type, int root) {
  absl::Status status = CheckBuffer("Gloo", "broadcast", data, count);
  if (status.ok()) status = CheckPeer("broadcast", "root", root);
  if (!status.ok()) return status;
  const uint32_t tag = NextTag();
  if (count == 0) return Run("broadcast", [] {});  // Gloo rejects 0 bytes
  return Run("broadcast", [&] {
    WithType(type, [&](auto zero) {
      using T = decltype(zero);
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<T*>(data), count);
      opts.setRoot(root);
      opts.setTag(tag);
      gloo::broadcast(opts);
    });
  });
}

absl::Status GlooCommunicator::all_reduce(const void* send, void* recv,
                                          size_t count, DataType type,
                                          ReduceOp op) {
  absl::Status status = CheckBuffer("Gloo", "all_reduce", send, count);
  if (status.ok()) status = CheckBuffer("Gloo", "all_reduce", recv, count);
  if (!status.ok()) return status;
  const size_t bytes = count * SizeOf(type);
  if (send != recv && Overlap(send, bytes, recv, bytes)) {
    return absl::InvalidArgumentError(
        "all_reduce: send and recv overlap without being the same buffer");
  }
  const uint32_t tag = NextTag();
  if (count == 0) return Run("all_reduce", [] {});
  return Run("all_reduce", [&] {
    WithType(type, [&](auto zero) {
      using T = decltype(zero);
      gloo::AllreduceOptions opts(context_);
      // Without an input Gloo reduces the output in place.
      if (send != recv) opts.setInput(const_cast<T*>(static_cast<const T*>(send)), count);
      opts.setOutput(static_cast<T*>(recv), count);
      opts.setReduceFunction(Reduction<T>(op));
      opts.setTag(tag);
      gloo::allreduce(opts);
    });
  });
}

absl::Status GlooCommunicator::all_gather(const void* send, void* recv,
                                          size_t count, DataType type) {
  const size_t total = count * static_cast<size_t>(size_);
  absl::Status status = CheckBuffer("Gloo", "all_gather", send, count);
  if (status.ok()) status = CheckBuffer("Gloo", "all_gather", recv, total);
  if (!status.ok()) return status;
  const size_t width = SizeOf(type);
  if (Overlap(send, count * width, recv, total * width)) {
    return absl::InvalidArgumentError(
        "all_gather: send and recv buffers overlap");
  }
  const uint32_t tag = NextTag();
  if (count == 0) return Run("all_gather", [] {});
  return Run("all_gather", [&] {
    WithType(type, [&](auto zero) {
      using T = decltype(zero);
      gloo::AllgatherOptions opts(context_);
      opts.setInput(const_cast<T*>(static_cast<const T*>(send)), count);
      opts.setOutput(static_cast<T*>(recv), total);
      opts.setTag(tag);
      gloo::allgather(opts);
    });
  });
}

absl::Status GlooCommunicator::reduce_scatter(const void* send, void* recv,
                                              size_t count, DataType type,
                                              ReduceOp op) {
  const size_t total = count * static_cast<size_t>(size_);
  absl::Status status = CheckBuffer("Gloo", "reduce_scatter", send, total);
  if (status.ok()) status = CheckBuffer("Gloo", "reduce_scatter", recv, count);
  if (!status.ok()) return status;
  const size_t width = SizeOf(type);
  if (Overlap(send, total * width, recv, count * width)) {
    return absl::InvalidArgumentError(
        "reduce_scatter: send and recv buffers overlap");
  }
  const uint32_t tag = NextTag();
  if (count == 0) return Run("reduce_scatter", [] {});
  // Gloo (2022) has no options-based reduce-scatter, only the old
  // class-based ReduceScatterHalvingDoubling with its own slots and int
  // counts. An all-reduce of the whole input into scratch, keeping this
  // rank's block, gives the same result for size() times the traffic.
  std::vector<char> scratch(total * width);
  std::memcpy(scratch.data(), send, scratch.size());
  status = Run("reduce_scatter", [&] {
    AllReduceInPlace(context_, tag, scratch.data(), total, type, op);
  });
  if (!status.ok()) return status;
  std::memcpy(recv, scratch.data() + static_cast<size_t>(rank_) * count * width,
              count * width);
  return absl::OkStatus();
}

absl::Status GlooCommunicator::TakeFromSelf(absl::string_view op, void* data,
                                            size_t count, DataType type) {
  if (to_self_.empty()) {
    // Only this thread could send it, and it is here: waiting would hang.
    return absl::FailedPreconditionError(absl::StrCat(
        op, " from oneself (rank ", rank_,
        ") with no message sent to oneself before it"));
  }
  std::vector<char> message = std::move(to_self_.front());
  to_self_.pop_front();
  if (message.size() != count * SizeOf(type)) {
    return CountMismatch(op, count, rank_, message.size(), type);
  }
  if (!message.empty()) std::memcpy(data, message.data(), message.size());
  return absl::OkStatus();
}

absl::Status GlooCommunicator::send(const void* data, size_t count,
                                    DataType type, int peer) {
  absl::Status status = CheckBuffer("Gloo", "send", data, count);
  if (status.ok()) status = CheckPeer("send", "peer", peer);
  if (!status.ok()) return status;
  const size_t bytes = count * SizeOf(type);
  if (peer == rank_) {
    // Gloo has no pair to oneself; keep it until a recv from oneself.
    const char* begin = static_cast<const char*>(data);
    to_self_.emplace_back(begin, begin + bytes);
    return absl::OkStatus();
  }
  return Run("send", [&] {
    Outgoing message(*context_, peer, data, bytes);
    message.Wait();
  });
}

absl::Status GlooCommunicator::recv(void* data, size_t count, DataType type,
                                    int peer) {
  absl::Status status = CheckBuffer("Gloo", "recv", data, count);
  if (status.ok()) status = CheckPeer("recv", "peer", peer);
  if (!status.ok()) return status;
  if (peer == rank_) return TakeFromSelf("recv", data, count, type);
  const size_t bytes = count * SizeOf(type);
  uint64_t got = 0;
  std::vector<char> scratch;
  status = Run("recv", [&] {
    got = Receive(*context_, peer, data, bytes, &scratch);
  });
  if (!status.ok()) return status;
  if (got != bytes) return CountMismatch("recv", count, peer, got, type);
  return absl::OkStatus();
}

absl::Status GlooCommunicator::send_recv(const void* send_data,
                                         size_t send_count, int dest,
                                         void* recv_data, size_t recv_count,
                                         int source, DataType type) {
  absl::Status status = CheckBuffer("Gloo", "send_recv", send_data, send_count);
  if (status.ok()) status = CheckBuffer("Gloo", "send_recv", recv_data, recv_count);
  if (status.ok()) status = CheckPeer("send_recv", "dest", dest);
  if (status.ok()) status = CheckPeer("send_recv", "source", source);
  if (!status.ok()) return status;
  const size_t width = SizeOf(type);
  const size_t send_bytes = send_count * width;
  const size_t recv_bytes = recv_count * width;
  if (dest == rank_) {
    const char* begin = static_cast<const char*>(send_data);
    to_self_.emplace_back(begin, begin + send_bytes);
    if (source == rank_) {
      return TakeFromSelf("send_recv", recv_data, recv_count, type);
    }
  }
  if (source == rank_) {
    // dest is a peer here: send to it, then take the message to oneself.
    status = Run("send_recv", [&] {
      Outgoing message(*context_, dest, send_data, send_bytes);
      message.Wait();
    });
    if (!status.ok()) return status;
    return TakeFromSelf("send_recv", recv_data, recv_count, type);
  }
  // The send is posted before the receive and waited after it, so a ring
  // shift cannot deadlock.
  uint64_t got = 0;
  std::vector<char> scratch;
  status = Run("send_recv", [&] {
    std::optional<Outgoing> message;
    if (dest != rank_) message.emplace(*context_, dest, send_data, send_bytes);
    got = Receive(*context_, source, recv_data, recv_bytes, &scratch);
    if (message.has_value()) message->Wait();
  });
  if (!status.ok()) return status;
  if (got != recv_bytes) {
    return CountMismatch("send_recv", recv_count, source, got, type);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Communicator>> GlooCommunicator::split(
    int color, int key) {
  // Splits are collective, so every rank numbers them alike and the new
  // groups' prefixes agree without talking.
  const int64_t seq = next_split_++;
  const int64_t mine[2] = {color, key};
  std::vector<int64_t> all(2 * static_cast<size_t>(size_));
  VEMESH_RETURN_IF_ERROR(all_gather(mine, all.data(), 2, DataType::kInt64));
  if (color < 0) return std::shared_ptr<Communicator>();
  // Members of my color, ordered by (key, rank).
  std::vector<std::pair<int64_t, int>> members;
  for (int r = 0; r < size_; ++r) {
    if (all[2 * r] == color) members.emplace_back(all[2 * r + 1], r);
  }
  std::sort(members.begin(), members.end());
  int new_rank = 0;
  std::vector<int> global;
  global.reserve(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].second == rank_) new_rank = static_cast<int>(i);
    global.push_back(ranks_[members[i].second]);
  }
  VEMESH_ASSIGN_OR_RETURN(
      auto child,
      Connect(store_, absl::StrCat(prefix_, "/split/", seq, "/", color),
              new_rank, static_cast<int>(members.size()), std::move(global),
              timeout_, hostname_, device_));
  return std::shared_ptr<Communicator>(std::move(child));
}

NativeHandle GlooCommunicator::native_handle() const {
  return NativeHandle{"gloo", context_.get()};
}

}  // namespace vemesh
