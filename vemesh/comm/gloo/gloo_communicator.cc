#include "vemesh/comm/gloo/gloo_communicator.h"

#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gloo/allgather.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/alltoall.h"
#include "gloo/alltoallv.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/gather.h"
#include "gloo/reduce.h"
#include "gloo/rendezvous/context.h"
#include "gloo/scatter.h"
#include "gloo/transport/context.h"
#include "gloo/transport/device.h"
#include "gloo/transport/tcp/address.h"
#include "gloo/transport/tcp/attr.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/tcp/loop.h"
#include "gloo/transport/unbound_buffer.h"
#include "vemesh/base/fnv1a.h"
#include "vemesh/base/sigpipe.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/gloo/internal/gloo_error.h"
#include "vemesh/comm/gloo/internal/gloo_store.h"
#include "vemesh/comm/internal/buffer_overlap.h"
#include "vemesh/comm/internal/host_reduce.h"
#include "vemesh/rendezvous/prefix_store.h"

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

// Where an empty buffer points: Gloo copies zero bytes from or to it, and a
// null pointer would make even that undefined.
char empty_buffer[1];

char* Bytes(void* data) {
  return data == nullptr ? empty_buffer : static_cast<char*>(data);
}
char* Bytes(const void* data) {
  // Gloo only reads a buffer it sends from.
  return Bytes(const_cast<void*>(data));
}

using comm_internal::BuffersOverlap;

// The host reduction of `op` (comm/internal/host_reduce.h). The base
// class refuses unknown types and ops before a Job runs.
HostCombineFn ReduceFunction(const Operation& op) {
  const HostCombineFn combine = HostCombiner(op.type, op.op);
  if (combine == nullptr)
    throw std::invalid_argument("unknown vemesh ReduceOp");
  return combine;
}

// The end of an avg: divides a sum by the group size.
void FinishAverage(const Operation& op, void* data, size_t count, int size) {
  if (op.op != ReduceOp::kAvg || count == 0) return;
  HostDivide(data, count, op.type, size);
}

// Element counts as byte counts, as Gloo's all_to_all_v takes them.
std::vector<int64_t> ByteCounts(absl::Span<const size_t> counts, size_t width) {
  std::vector<int64_t> bytes;
  bytes.reserve(counts.size());
  for (size_t c : counts) bytes.push_back(static_cast<int64_t>(c * width));
  return bytes;
}

}  // namespace

// -- Interruptible point-to-point waits ---------------------------------------

// While it lives, OnAbort can interrupt the waits on `buffer`. A buffer
// registered after abort() is interrupted at once (abort sets the flag
// before it takes the lock, so one of the two sees the other).
class GlooCommunicator::Interruptible {
 public:
  Interruptible(GlooCommunicator& owner, gloo::transport::UnboundBuffer* buffer)
      : owner_(owner), buffer_(buffer) {
    {
      std::lock_guard<std::mutex> lock(owner_.interruptible_mu_);
      owner_.interruptible_.push_back(buffer_);
    }
    if (owner_.aborted()) {
      buffer_->abortWaitRecv();
      buffer_->abortWaitSend();
    }
  }
  Interruptible(const Interruptible&) = delete;
  Interruptible& operator=(const Interruptible&) = delete;
  ~Interruptible() {
    std::lock_guard<std::mutex> lock(owner_.interruptible_mu_);
    auto& all = owner_.interruptible_;
    all.erase(std::find(all.begin(), all.end(), buffer_));
  }

 private:
  GlooCommunicator& owner_;
  gloo::transport::UnboundBuffer* const buffer_;
};

void GlooCommunicator::WaitSend(gloo::transport::UnboundBuffer& buffer) {
  // False: abort() interrupted it (a timeout or a lost peer throws).
  if (!buffer.waitSend()) throw std::runtime_error("send interrupted by abort");
}

void GlooCommunicator::WaitRecv(gloo::transport::UnboundBuffer& buffer) {
  if (!buffer.waitRecv()) throw std::runtime_error("recv interrupted by abort");
}

// A message on its way to a peer: header and payload are posted at once
// (Gloo sends asynchronously); Wait() blocks until both left. Pinned in
// memory because Gloo holds the header's address.
class GlooCommunicator::Outgoing {
 public:
  Outgoing(GlooCommunicator& owner, int peer, const void* data, size_t bytes)
      : owner_(owner), header_(bytes) {
    header_buffer_ =
        owner.context_->createUnboundBuffer(&header_, sizeof(header_));
    header_guard_.emplace(owner, header_buffer_.get());
    header_buffer_->send(peer, kHeaderSlot);
    if (bytes > 0) {
      payload_ = owner.context_->createUnboundBuffer(Bytes(data), bytes);
      payload_guard_.emplace(owner, payload_.get());
      payload_->send(peer, kPayloadSlot);
    }
  }
  Outgoing(const Outgoing&) = delete;
  Outgoing& operator=(const Outgoing&) = delete;

  void Wait() {
    owner_.WaitSend(*header_buffer_);
    if (payload_ != nullptr) owner_.WaitSend(*payload_);
  }

 private:
  GlooCommunicator& owner_;
  uint64_t header_;
  std::unique_ptr<gloo::transport::UnboundBuffer> header_buffer_;
  std::unique_ptr<gloo::transport::UnboundBuffer> payload_;
  // Declared after the buffers: unregistered before they are freed.
  std::optional<Interruptible> header_guard_;
  std::optional<Interruptible> payload_guard_;
};

// -- Jobs and their Works -----------------------------------------------------

// One issued operation, shared by the queue, the worker and its Work.
struct GlooCommunicator::Job {
  explicit Job(const Operation& o) : op(o), name(o.Describe()) {}

  void Finish(absl::Status s) {
    status = std::move(s);
    done.store(true, std::memory_order_release);
  }

  const Operation op;
  const std::string name;
  // A batch's sends to peers, posted by the issuing thread, and the error
  // that posting them met (reported, in order, by the worker).
  std::vector<std::unique_ptr<Outgoing>> outgoing;
  absl::Status posted;
  std::atomic<bool> done{false};
  absl::Status status;  // written once, before `done`
};

class GlooCommunicator::GlooWork final : public Work {
 public:
  GlooWork(std::shared_ptr<Communicator> owner, std::shared_ptr<Job> job)
      : Work(std::move(owner), job->name), job_(std::move(job)) {}

 protected:
  std::optional<absl::Status> Poll() override {
    if (!job_->done.load(std::memory_order_acquire)) return std::nullopt;
    return job_->status;
  }
  // After a failure or an abort Gloo's I/O thread may still write into the
  // operation's buffers until the worker has left it (it closes the pairs
  // first): a waiter returns only then, so its caller never frees a buffer
  // Gloo still touches (a TSan report in train_nd's elastic mode).
  bool LeavesOnAbort() const override { return false; }

 private:
  std::shared_ptr<Job> job_;
};

absl::Status GlooCommunicator::Receive(absl::string_view op, int peer,
                                       void* data, size_t count,
                                       DataType type) {
  const size_t bytes = count * SizeOf(type);
  uint64_t header = 0;
  {
    auto buffer = context_->createUnboundBuffer(&header, sizeof(header));
    Interruptible guard(*this, buffer.get());
    buffer->recv(peer, kHeaderSlot);
    WaitRecv(*buffer);
  }
  if (header > kMaxMessageBytes) {
    throw std::runtime_error(absl::StrCat("rank ", peer,
                                          " announced a message of ", header,
                                          " bytes: the stream is corrupt"));
  }
  // Gloo aborts the process when a message is longer than the buffer posted
  // for it, so the length is learnt first and a mismatched message lands in
  // scratch: the receive always fits and the stream stays in step.
  std::vector<char> scratch;
  if (header > 0) {
    void* target = data;
    if (header != bytes) {
      scratch.resize(header);
      target = scratch.data();
    }
    auto buffer = context_->createUnboundBuffer(target, header);
    Interruptible guard(*this, buffer.get());
    buffer->recv(peer, kPayloadSlot);
    WaitRecv(*buffer);
  }
  if (header != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, " expected ", count, " elements from rank ", peer,
                     " but got ", header / SizeOf(type)));
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::TakeFromSelf(absl::string_view op, void* data,
                                            size_t count, DataType type) {
  std::vector<char> message;
  {
    std::lock_guard<std::mutex> lock(to_self_mu_);
    if (to_self_.empty()) {
      // Only this rank could send it, and it is here: waiting would hang.
      return absl::FailedPreconditionError(
          absl::StrCat(op, " from oneself (rank ", rank_,
                       ") with no message sent to oneself before it"));
    }
    message = std::move(to_self_.front());
    to_self_.pop_front();
  }
  if (message.size() != count * SizeOf(type)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, " expected ", count, " elements from rank ", rank_,
                     " but got ", message.size() / SizeOf(type)));
  }
  if (!message.empty()) std::memcpy(data, message.data(), message.size());
  return absl::OkStatus();
}

void GlooCommunicator::PostSends(Job& job) {
  // Messages to oneself are kept at once too, so that a batch can receive
  // what it sends itself whatever the order of its entries, and a receive
  // from oneself queued before the send finds it.
  for (const P2POp& p : job.op.p2p) {
    if (p.kind == P2POp::Kind::kSend && p.peer == rank_) {
      const char* begin = Bytes(p.data);
      std::lock_guard<std::mutex> lock(to_self_mu_);
      to_self_.emplace_back(begin, begin + p.count * SizeOf(p.type));
    }
  }
  job.posted = RunGloo(absl::StrCat("gloo ", job.name), [&] {
    for (const P2POp& p : job.op.p2p) {
      if (p.kind == P2POp::Kind::kSend && p.peer != rank_) {
        job.outgoing.push_back(std::make_unique<Outgoing>(
            *this, p.peer, p.data, p.count * SizeOf(p.type)));
      }
    }
  });
}

absl::Status GlooCommunicator::RunBatch(Job& job) {
  const Operation& op = job.op;
  // Receives in order: two from one peer match its sends in order. A
  // mismatched length is reported after the others completed.
  absl::Status first_error;
  for (const P2POp& p : op.p2p) {
    if (p.kind != P2POp::Kind::kRecv) continue;
    absl::Status s = p.peer == rank_
                         ? TakeFromSelf(op.Name(), p.data, p.count, p.type)
                         : Receive(op.Name(), p.peer, p.data, p.count, p.type);
    if (first_error.ok()) first_error = s;
  }
  for (auto& message : job.outgoing) message->Wait();
  job.outgoing.clear();
  return first_error;
}

// -- Collectives -----------------------------------------------------------

namespace {

// What one rank passes to a collective, in a fixed size, so that the
// exchange itself can never mismatch.
struct Summary {
  uint32_t kind = 0;
  uint32_t type = 0;
  uint32_t op = 0;
  int32_t root = 0;
  uint64_t count = 0;
  uint64_t counts_hash = 0;  // the V forms' count list
};
static_assert(sizeof(Summary) == 32);

uint64_t HashCounts(const std::vector<size_t>& counts) {
  uint64_t h = kFnv1aOffset;  // FNV-1a over the 64-bit counts
  for (size_t c : counts) h = Fnv1aWord(c, h);
  return h;
}

Summary Summarize(const Operation& op) {
  Summary s;
  s.kind = static_cast<uint32_t>(op.kind);
  if (op.kind == OpKind::kBarrier) return s;
  s.type = static_cast<uint32_t>(op.type);
  switch (op.kind) {
    case OpKind::kAllReduce:
    case OpKind::kReduceScatter:
      s.op = static_cast<uint32_t>(op.op);
      s.count = op.count;
      break;
    case OpKind::kReduce:
      s.op = static_cast<uint32_t>(op.op);
      s.root = op.root;
      s.count = op.count;
      break;
    case OpKind::kBroadcast:
    case OpKind::kGather:
    case OpKind::kScatter:
      s.root = op.root;
      s.count = op.count;
      break;
    case OpKind::kReduceScatterV:
      s.op = static_cast<uint32_t>(op.op);
      [[fallthrough]];
    case OpKind::kAllGatherV:
      s.count = std::accumulate(op.recv_counts.begin(), op.recv_counts.end(),
                                size_t{0});
      s.counts_hash = HashCounts(op.recv_counts);
      break;
    case OpKind::kAllToAllV:
      break;  // pairwise: checked on the count lists themselves
    default:
      s.count = op.count;
      break;
  }
  return s;
}

bool operator==(const Summary& a, const Summary& b) {
  return std::memcmp(&a, &b, sizeof(Summary)) == 0;
}

std::string SummaryText(const Summary& s) {
  const auto kind = static_cast<OpKind>(s.kind);
  std::string out(OpKindName(kind));
  if (kind == OpKind::kBarrier) return out;
  absl::StrAppend(&out, " of ", s.count, " ",
                  DataTypeName(static_cast<DataType>(s.type)));
  std::vector<std::string> details;
  if (s.counts_hash != 0) details.push_back("its own count list");
  if (kind == OpKind::kAllReduce || kind == OpKind::kReduce ||
      kind == OpKind::kReduceScatter || kind == OpKind::kReduceScatterV) {
    details.push_back(
        absl::StrCat("op ", ReduceOpName(static_cast<ReduceOp>(s.op))));
  }
  if (kind == OpKind::kBroadcast || kind == OpKind::kReduce ||
      kind == OpKind::kGather || kind == OpKind::kScatter) {
    details.push_back(absl::StrCat("root ", s.root));
  }
  if (!details.empty())
    absl::StrAppend(&out, " (", absl::StrJoin(details, ", "), ")");
  return out;
}

}  // namespace

absl::Status GlooCommunicator::CheckAgreement(const Operation& op) {
  if (size_ == 1) return absl::OkStatus();
  const Summary mine = Summarize(op);
  std::vector<Summary> all(static_cast<size_t>(size_));
  {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(const_cast<Summary*>(&mine), 1);
    opts.setOutput(all.data(), all.size());
    opts.setTag(NextTag());
    gloo::allgather(opts);
  }
  for (int r = 1; r < size_; ++r) {
    if (all[r] == all[0]) continue;
    // Every rank holds the same list, so every rank reports alike.
    std::string hint = "the same operation, count, type, op and root";
    if (all[r].counts_hash != 0 && all[0].counts_hash != 0 &&
        all[r].kind == all[0].kind) {
      hint = "the same count list";
    }
    return absl::InvalidArgumentError(absl::StrCat(
        op.Name(), ": the ranks disagree: rank 0 passed ", SummaryText(all[0]),
        "; rank ", r, " passed ", SummaryText(all[r]),
        ": every rank of the group must pass ", hint));
  }
  if (op.kind != OpKind::kAllToAllV) return absl::OkStatus();
  // all_to_all_v: what rank a sends to b must be what b expects from a.
  const size_t n = static_cast<size_t>(size_);
  std::vector<uint64_t> counts(2 * n);
  for (size_t i = 0; i < n; ++i) {
    counts[i] = op.send_counts[i];
    counts[n + i] = op.recv_counts[i];
  }
  std::vector<uint64_t> every(2 * n * n);
  {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(counts.data(), counts.size());
    opts.setOutput(every.data(), every.size());
    opts.setTag(NextTag());
    gloo::allgather(opts);
  }
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = 0; b < n; ++b) {
      const uint64_t sent = every[a * 2 * n + b];
      const uint64_t expected = every[b * 2 * n + n + a];
      if (sent == expected) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          op.Name(), ": rank ", a, " sends ", sent, " elements to rank ", b,
          ", which expects ", expected,
          ": send_counts[b] of rank a must equal recv_counts[a] of rank b"));
    }
  }
  return absl::OkStatus();
}

void GlooCommunicator::RunCollective(const Operation& op) {
  const uint32_t tag = NextTag();  // every rank, every collective
  const size_t width = SizeOf(op.type);
  const size_t bytes = op.count * width;
  switch (op.kind) {
    case OpKind::kBarrier: {
      gloo::BarrierOptions opts(context_);
      opts.setTag(tag);
      gloo::barrier(opts);
      return;
    }
    case OpKind::kBroadcast: {
      if (bytes == 0) return;  // Gloo rejects 0 bytes; every rank skips
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(Bytes(op.recv), bytes);
      opts.setRoot(op.root);
      opts.setTag(tag);
      gloo::broadcast(opts);
      return;
    }
    case OpKind::kAllReduce: {
      if (bytes == 0) return;
      WithHostType(op.type, [&](auto zero) {
        using T = decltype(zero);
        gloo::AllreduceOptions opts(context_);
        // Without an input Gloo reduces the output in place.
        if (op.send != op.recv) {
          opts.setInput(reinterpret_cast<T*>(Bytes(op.send)), op.count);
        }
        opts.setOutput(static_cast<T*>(op.recv), op.count);
        opts.setReduceFunction(ReduceFunction(op));
        opts.setTag(tag);
        gloo::allreduce(opts);
      });
      FinishAverage(op, op.recv, op.count, size_);
      return;
    }
    case OpKind::kReduce: {
      if (bytes == 0) return;
      // Gloo's ring reduce needs a whole output on every rank.
      std::vector<char> scratch;
      void* out = op.recv;
      if (rank_ != op.root) {
        scratch.resize(bytes);
        out = scratch.data();
      }
      WithHostType(op.type, [&](auto zero) {
        using T = decltype(zero);
        gloo::ReduceOptions opts(context_);
        if (op.send != out) {
          opts.setInput(reinterpret_cast<T*>(Bytes(op.send)), op.count);
        }
        opts.setOutput(static_cast<T*>(out), op.count);
        opts.setRoot(op.root);
        opts.setReduceFunction(ReduceFunction(op));
        opts.setTag(tag);
        gloo::reduce(opts);
      });
      if (rank_ == op.root) FinishAverage(op, op.recv, op.count, size_);
      return;
    }
    case OpKind::kAllGather: {
      if (bytes == 0) return;
      // Gloo copies the input into the output first: an input inside the
      // output (MPI's in-place form) is copied out of the way.
      std::vector<char> copy;
      const char* in = Bytes(op.send);
      if (BuffersOverlap(op.send, bytes, op.recv, bytes * size_)) {
        copy.assign(in, in + bytes);
        in = copy.data();
      }
      gloo::AllgatherOptions opts(context_);
      opts.setInput(const_cast<char*>(in), bytes);
      opts.setOutput(Bytes(op.recv), bytes * size_);
      opts.setTag(tag);
      gloo::allgather(opts);
      return;
    }
    case OpKind::kAllGatherV: {
      // Every rank passes the same counts, so all skip an empty one alike.
      std::vector<size_t> counts;
      size_t total = 0;
      for (size_t c : op.recv_counts) {
        counts.push_back(c * width);
        total += c;
      }
      if (total == 0) return;
      const size_t mine = counts[rank_];
      std::vector<char> copy;
      const char* in = Bytes(op.send);
      if (BuffersOverlap(op.send, mine, op.recv, total * width)) {
        copy.assign(in, in + mine);
        in = copy.data();
      }
      gloo::AllgathervOptions opts(context_);
      opts.setInput(const_cast<char*>(in), mine);
      opts.setOutput(Bytes(op.recv), std::move(counts));
      opts.setTag(tag);
      gloo::allgatherv(opts);
      return;
    }
    case OpKind::kReduceScatter:
    case OpKind::kReduceScatterV: {
      // Gloo (2022) has no general reduce-scatter. Each rank gets the
      // blocks it owns from every rank with one all_to_all(v) and reduces
      // them locally in rank order: every element crosses the network once
      // and in one round (an all_reduce of the whole input moves about
      // twice as much; a reduce per root takes size() rounds), at the cost
      // of size() blocks of scratch.
      std::vector<size_t> counts = op.recv_counts;
      if (op.kind == OpKind::kReduceScatter) {
        counts.assign(static_cast<size_t>(size_), op.count);
      }
      const size_t total =
          std::accumulate(counts.begin(), counts.end(), size_t{0});
      if (total == 0) return;  // same counts everywhere: all skip
      const size_t mine = counts[rank_];
      std::vector<char> blocks(mine * width * size_);
      gloo::AlltoallvOptions opts(context_);
      opts.setInput(Bytes(op.send), ByteCounts(counts, width));
      opts.setOutput(Bytes(static_cast<void*>(blocks.data())),
                     ByteCounts(std::vector<size_t>(size_, mine), width));
      opts.setTag(tag);
      gloo::alltoallv(opts);
      if (mine == 0) return;
      const size_t block = mine * width;
      std::memcpy(op.recv, blocks.data(), block);
      const HostCombineFn combine = ReduceFunction(op);
      for (int r = 1; r < size_; ++r) {
        combine(op.recv, op.recv, blocks.data() + r * block, mine);
      }
      FinishAverage(op, op.recv, mine, size_);
      return;
    }
    case OpKind::kGather: {
      if (bytes == 0) return;
      gloo::GatherOptions opts(context_);
      opts.setInput(Bytes(op.send), bytes);
      if (rank_ == op.root) opts.setOutput(Bytes(op.recv), bytes * size_);
      opts.setRoot(op.root);
      opts.setTag(tag);
      gloo::gather(opts);
      return;
    }
    case OpKind::kScatter: {
      if (bytes == 0) return;
      gloo::ScatterOptions opts(context_);
      if (rank_ == op.root) {
        std::vector<char*> blocks;
        for (int r = 0; r < size_; ++r) {
          blocks.push_back(Bytes(op.send) + r * bytes);
        }
        opts.setInputs(blocks, bytes);
      }
      opts.setOutput(Bytes(op.recv), bytes);
      opts.setRoot(op.root);
      opts.setTag(tag);
      gloo::scatter(opts);
      return;
    }
    case OpKind::kAllToAll: {
      if (bytes == 0) return;
      gloo::AlltoallOptions opts(context_);
      opts.setInput(Bytes(op.send), bytes * size_);
      opts.setOutput(Bytes(op.recv), bytes * size_);
      opts.setTag(tag);
      gloo::alltoall(opts);
      return;
    }
    case OpKind::kAllToAllV: {
      // Never skipped: a rank with nothing to send or receive must still
      // answer the zero-length messages of the others.
      gloo::AlltoallvOptions opts(context_);
      opts.setInput(Bytes(op.send), ByteCounts(op.send_counts, width));
      opts.setOutput(Bytes(op.recv), ByteCounts(op.recv_counts, width));
      opts.setTag(tag);
      gloo::alltoallv(opts);
      return;
    }
    case OpKind::kBatch:
      break;
  }
  throw std::invalid_argument(
      absl::StrCat("the Gloo backend cannot run ", op.Describe()));
}

// -- The worker ---------------------------------------------------------------

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
      gloo_timeout_(timeout),
      hostname_(std::move(hostname)),
      device_(std::move(device)),
      context_(std::move(context)) {
  connected_ = context_ != nullptr;
}

// No Work can be alive here (each keeps its communicator), so the queue
// holds only operations whose handles were dropped: they are not run. The
// worker finishes the one it runs (bounded by the Gloo timeout). Then the
// context closes its pairs (an orderly close: peers still read what was
// sent, then see the connection end), and the device stops its I/O thread
// once no other communicator shares it.
GlooCommunicator::~GlooCommunicator() {
  std::deque<std::shared_ptr<Job>> dropped;
  std::thread worker;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    stopping_ = true;
    dropped.swap(queue_);
    worker = std::move(worker_);
  }
  queue_cv_.notify_all();
  if (worker.joinable()) worker.join();
  for (auto& job : dropped) {
    job->Finish(absl::AbortedError(
        absl::StrCat(job->name, ": the communicator was destroyed")));
  }
}

size_t GlooCommunicator::MaxCount() const { return INT_MAX; }

Communicator::WorkOr GlooCommunicator::Start(const Operation& op) {
  std::shared_ptr<Communicator> self = Self();
  if (self == nullptr) {
    return absl::FailedPreconditionError(
        "a Gloo communicator must be owned by a shared_ptr (Create's)");
  }
  VEMESH_RETURN_IF_ERROR(EnsureConnected());
  if (op.kind == OpKind::kBatch) {
    // Messages to oneself are matched in issue order: a receive from
    // oneself issued before its send would wait for this very thread.
    int64_t sends = 0, recvs = 0;
    for (const P2POp& p : op.p2p) {
      if (p.peer != rank_) continue;
      (p.kind == P2POp::Kind::kSend ? sends : recvs) += 1;
    }
    if (recvs > self_sent_ - self_taken_ + sends) {
      return absl::FailedPreconditionError(
          absl::StrCat(op.Name(), " from oneself (rank ", rank_,
                       ") with no message sent to oneself before it"));
    }
    self_sent_ += sends;
    self_taken_ += recvs;
  }
  auto job = std::make_shared<Job>(op);
  if (op.kind == OpKind::kBatch) {
    ScopedSigpipeBlock no_sigpipe;  // Gloo may write on this thread
    PostSends(*job);
  }
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (!worker_.joinable()) {
      try {
        worker_ = std::thread([this] { WorkerLoop(); });
      } catch (const std::system_error& e) {
        return absl::ResourceExhaustedError(absl::StrCat(
            job->name, ": cannot start the Gloo worker thread: ", e.what()));
      }
    }
    queue_.push_back(job);
  }
  queue_cv_.notify_one();
  return std::shared_ptr<Work>(
      std::make_shared<GlooWork>(std::move(self), std::move(job)));
}

void GlooCommunicator::WorkerLoop() {
  BlockSigpipeOnThisThread();  // a lost peer is an error, not SIGPIPE
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;  // the destructor ends what is queued
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job->Finish(Execute(*job));
  }
}

absl::Status GlooCommunicator::Execute(Job& job) {
  const Operation& op = job.op;
  const std::string& name = job.name;
  // Queued before an abort, started after it: never sent.
  if (aborted()) return AbortedError(name);
  if (!broken_.ok()) {
    return absl::Status(
        broken_.code(),
        absl::StrCat(name,
                     ": the communicator is broken by an earlier "
                     "failure: ",
                     broken_.message()));
  }
  absl::Status result;  // a recv's length mismatch, which breaks nothing
  absl::Status status = job.posted;
  if (status.ok()) {
    status = RunGloo(absl::StrCat("gloo ", name), [&] {
      if (op.kind == OpKind::kBatch) {
        result = RunBatch(job);
      } else {
        result = CheckAgreement(op);  // a mismatch breaks nothing
        if (result.ok()) RunCollective(op);
      }
    });
  }
  if (status.ok()) return result;
  // An abort that closed the connections under the operation made it fail.
  if (aborted()) return AbortedError(name);
  broken_ = status;
  // Gloo's pairs are in an unknown state now. Closing them (with a reset)
  // tells every peer at once, instead of leaving them to their timeout.
  RunGloo("close", [&] { context_->closeConnections(); }).IgnoreError();
  return status;
}

// Gloo cannot interrupt the waits inside its collectives; it can interrupt
// waits on buffers we hold (our point-to-point messages), and closing the
// pairs (with a reset) makes every peer fail at once and our worker's next
// send or receive fail. A collective wait already under way ends at the
// Gloo timeout.
void GlooCommunicator::OnAbort() {
  {
    std::lock_guard<std::mutex> lock(interruptible_mu_);
    for (gloo::transport::UnboundBuffer* buffer : interruptible_) {
      buffer->abortWaitRecv();
      buffer->abortWaitSend();
    }
  }
  if (!connected_.load()) return;  // a lazy world with no pairs yet
  RunGloo("close", [&] { context_->closeConnections(); }).IgnoreError();
}

// -- Creation and split -------------------------------------------------------

namespace {

absl::Status CheckCreate(const std::shared_ptr<Store>& store, int rank,
                         int size, const std::vector<int>& global_ranks,
                         absl::Duration timeout) {
  if (store == nullptr) {
    return absl::InvalidArgumentError("GlooCommunicator::Create needs a store");
  }
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("GlooCommunicator::Create: rank ", rank,
                     " is outside a group of ", size, " ranks"));
  }
  if (global_ranks.size() != static_cast<size_t>(size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GlooCommunicator::Create: ", global_ranks.size(),
                     " global ranks for a group of ", size));
  }
  if (timeout < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GlooCommunicator::Create: timeout ",
                     absl::FormatDuration(timeout), " is below 1ms"));
  }
  return absl::OkStatus();
}

// Turns a tcp device's event loop while armed. Idle, Gloo's loop sleeps in
// epoll_wait for up to 10 ms, and a pair that connects out from the
// caller's thread first waits for the loop's next turn (it unregisters its
// listening socket): about 10 ms per such connect, more than the rest of a
// mesh's creation. Armed, an always-readable eventfd makes the loop turn at
// once (pausing 200 us per turn). Disarmed, the fd stays registered with no
// events, so the loop sleeps and the spinner costs nothing: a turn costs a
// few microseconds of CPU, and on a busy machine the turns of every rank
// add up. Arming only re-registers the fd (epoll_ctl wakes the loop);
// disarming happens on the loop's next turn, from the loop's own thread,
// as does taking the spinner off, so nothing here waits for a turn.
class LoopSpinner final : public gloo::transport::tcp::Handler {
 public:
  explicit LoopSpinner(gloo::transport::Device* device)
      : device_(dynamic_cast<gloo::transport::tcp::Device*>(device)) {
    if (device_ == nullptr) return;
    fd_ = eventfd(1, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd_ < 0) return;
    registered_ = Watch(0);  // without it connects are only slower
  }

  ~LoopSpinner() override {
    if (registered_) {
      std::unique_lock<std::mutex> lock(mu_);
      stop_ = true;
      // The loop takes the spinner off on its next turn: make it come.
      if (!Watch(EPOLLIN) ||
          !cv_.wait_for(lock, std::chrono::seconds(5), [&] { return off_; })) {
        lock.unlock();  // the loop is not turning: take it off from here
        try {
          device_->unregisterDescriptor(fd_, this);
        } catch (const std::exception&) {
        }
      }
    }
    if (fd_ >= 0) close(fd_);
  }

  // Keeps the loop turning until the matching Disarm (they nest).
  void Arm() {
    std::lock_guard<std::mutex> lock(mu_);
    if (armed_++ == 0 && registered_ && !stop_) Watch(EPOLLIN);
  }
  void Disarm() {
    std::lock_guard<std::mutex> lock(mu_);
    --armed_;  // the loop's next turn goes back to sleep
  }

  // On the loop's thread.
  void handleEvents(int /*events*/) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (off_) return;
      if (stop_) {
        try {
          device_->unregisterDescriptor(fd_, this);
        } catch (const std::exception&) {
        }
        off_ = true;
        cv_.notify_all();  // under the lock: the waiter returns after us
        return;
      }
      if (armed_ == 0) {
        Watch(0);
        return;
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }

 private:
  // (Re-)registers the fd for `events` (0: registered, never reported).
  bool Watch(int events) {
    try {
      device_->registerDescriptor(fd_, events, this);
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }

  gloo::transport::tcp::Device* device_;
  int fd_ = -1;
  bool registered_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  int armed_ = 0;      // under mu_
  bool stop_ = false;  // under mu_
  bool off_ = false;   // under mu_
};

// Which side of a tcp pair connects out, by Gloo's rule (tcp::Pair::connect
// in gloo 2022-05): the pair whose listening address is the larger (the IP,
// then the port as stored) connects to the other, which accepts. Only the
// connecting side needs the loop to turn (see LoopSpinner). Unsure (an
// address that does not parse): true, which costs only some loop turns.
bool ConnectsOut(const std::vector<char>& self_bytes,
                 const std::vector<char>& peer_bytes) {
  try {
    const gloo::transport::tcp::Address self(self_bytes);
    const gloo::transport::tcp::Address peer(peer_bytes);
    const sockaddr_storage& a = self.getSockaddr();
    const sockaddr_storage& b = peer.getSockaddr();
    if (a.ss_family != b.ss_family) return true;
    int order = 0;
    if (a.ss_family == AF_INET) {
      const auto* sa = reinterpret_cast<const sockaddr_in*>(&a);
      const auto* sb = reinterpret_cast<const sockaddr_in*>(&b);
      order = std::memcmp(&sa->sin_addr, &sb->sin_addr, sizeof(in_addr));
      if (order == 0) order = sa->sin_port - sb->sin_port;
    } else if (a.ss_family == AF_INET6) {
      const auto* sa = reinterpret_cast<const sockaddr_in6*>(&a);
      const auto* sb = reinterpret_cast<const sockaddr_in6*>(&b);
      order = std::memcmp(&sa->sin6_addr, &sb->sin6_addr, sizeof(in6_addr));
      if (order == 0) order = sa->sin6_port - sb->sin6_port;
    } else {
      return true;
    }
    return order > 0;
  } catch (const std::exception&) {
    return true;
  }
}

absl::StatusOr<std::shared_ptr<gloo::transport::Device>> MakeDevice(
    absl::string_view hostname) {
  std::shared_ptr<gloo::transport::Device> device;
  // The device's I/O thread, started here, inherits SIGPIPE blocked.
  ScopedSigpipeBlock no_sigpipe;
  absl::Status status = RunGloo("gloo tcp device", [&] {
    gloo::transport::tcp::attr attr;
    attr.hostname = std::string(hostname);
    device = gloo::transport::tcp::CreateDevice(attr);
  });
  if (!status.ok()) return status;
  return device;
}

}  // namespace

absl::StatusOr<std::shared_ptr<GlooCommunicator>> GlooCommunicator::Create(
    std::shared_ptr<Store> store, absl::string_view prefix, int rank, int size,
    std::vector<int> global_ranks, absl::Duration timeout,
    absl::string_view hostname) {
  VEMESH_RETURN_IF_ERROR(CheckCreate(store, rank, size, global_ranks, timeout));
  VEMESH_ASSIGN_OR_RETURN(auto device, MakeDevice(hostname));
  return Connect(std::move(store), std::string(prefix), rank, size,
                 std::move(global_ranks), timeout, std::string(hostname),
                 std::move(device));
}

absl::StatusOr<std::shared_ptr<GlooCommunicator>> GlooCommunicator::CreateLazy(
    std::shared_ptr<Store> store, absl::string_view prefix, int rank, int size,
    std::vector<int> global_ranks, absl::Duration timeout,
    absl::string_view hostname) {
  VEMESH_RETURN_IF_ERROR(CheckCreate(store, rank, size, global_ranks, timeout));
  VEMESH_ASSIGN_OR_RETURN(auto device, MakeDevice(hostname));
  return std::shared_ptr<GlooCommunicator>(
      new GlooCommunicator(std::move(store), std::string(prefix), rank, size,
                           std::move(global_ranks), timeout,
                           std::string(hostname), std::move(device), nullptr));
}

absl::StatusOr<std::shared_ptr<gloo::Context>> GlooCommunicator::ConnectContext(
    const std::shared_ptr<Store>& store, const std::string& prefix, int rank,
    int size, absl::Duration timeout, const std::vector<int>& ranks,
    const std::shared_ptr<gloo::transport::Device>& device, bool lazy) {
  auto group = std::make_shared<PrefixStore>(store, prefix);
  GlooStore rendezvous(group, timeout);
  std::shared_ptr<gloo::rendezvous::Context> context;
  ScopedSigpipeBlock no_sigpipe;  // connecting and the barrier write here
  absl::Status status = RunGloo(
      absl::StrCat("gloo rendezvous of rank ", rank, " of ", size, " under '",
                   prefix, "'"),
      [&] {
        context = std::make_shared<gloo::rendezvous::Context>(rank, size);
        context->setTimeout(absl::ToChronoMilliseconds(timeout));
        std::shared_ptr<gloo::transport::Device> shared_device = device;
        context->connectFullMesh(rendezvous, shared_device);
        // connectFullMesh can return before the peers have finished: a TCP
        // connect completes in the kernel before the listener accepts it.
        // A rank that returned and at once dropped the group would close a
        // socket its peer is still accepting. The barrier holds every rank
        // until all are connected. It uses tag 0; collectives start at 1.
        gloo::BarrierOptions barrier(context);
        barrier.setTag(0);
        gloo::barrier(barrier);
      });
  if (status.ok()) return std::shared_ptr<gloo::Context>(std::move(context));
  // The store's own code (DeadlineExceeded: a rank never came) says more
  // than the IoException that carried it through Gloo.
  absl::Status store_error = rendezvous.error();
  if (store_error.ok()) return status;
  if (!absl::IsDeadlineExceeded(store_error)) {
    return absl::Status(store_error.code(), status.message());
  }
  // Name the peers that never published their address (Gloo's key
  // "rank_<r>"): gone, or never made this call.
  std::vector<std::string> missing;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    if (!group->get(absl::StrCat("rank_", r)).ok()) {
      missing.push_back(
          absl::StrCat(r, " (global rank ",
                       r < static_cast<int>(ranks.size()) ? ranks[r] : r, ")"));
    }
  }
  if (missing.empty()) {
    return absl::Status(store_error.code(), status.message());
  }
  // Creation keeps its DeadlineExceeded (a rank never came); a lazy connect
  // on first use says the peer is unavailable, as a lost connection does.
  return absl::Status(
      lazy ? absl::StatusCode::kUnavailable
           : absl::StatusCode::kDeadlineExceeded,
      absl::StrCat("gloo group '", prefix, "': peer rank(s) ",
                   absl::StrJoin(missing, ", "), " never connected within ",
                   absl::FormatDuration(timeout),
                   " (gone, or never made this call); rank ", rank, " of ",
                   size, " gives up: ", status.message()));
}

absl::StatusOr<std::shared_ptr<GlooCommunicator>> GlooCommunicator::Connect(
    std::shared_ptr<Store> store, std::string prefix, int rank, int size,
    std::vector<int> ranks, absl::Duration timeout, std::string hostname,
    std::shared_ptr<gloo::transport::Device> device) {
  VEMESH_ASSIGN_OR_RETURN(
      auto context,
      ConnectContext(store, prefix, rank, size, timeout, ranks, device,
                     /*lazy=*/false));
  return std::shared_ptr<GlooCommunicator>(new GlooCommunicator(
      std::move(store), std::move(prefix), rank, size, std::move(ranks),
      timeout, std::move(hostname), std::move(device), std::move(context)));
}

absl::Status GlooCommunicator::EnsureConnected() {
  if (connected_.load()) return absl::OkStatus();
  if (!connect_error_.ok()) return connect_error_;
  auto context = ConnectContext(store_, prefix_, rank_, size_, gloo_timeout_,
                                ranks_, device_, /*lazy=*/true);
  if (!context.ok()) {
    connect_error_ = context.status();
    return connect_error_;
  }
  context_ = *std::move(context);
  connected_.store(true);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<GlooCommunicator>> GlooCommunicator::subgroup(
    absl::string_view name, std::vector<int> members) {
  int new_rank = -1;
  std::vector<int> global;
  global.reserve(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    const int m = members[i];
    if (m < 0 || m >= size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("GlooCommunicator::subgroup '", name, "': member ", m,
                       " is outside this group of ", size_, " ranks"));
    }
    if (m == rank_) new_rank = static_cast<int>(i);
    global.push_back(ranks_[m]);
  }
  if (new_rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GlooCommunicator::subgroup '", name, "': this rank (", rank_,
        ") is not among the members [", absl::StrJoin(members, ", "), "]"));
  }
  return Connect(store_, absl::StrCat(prefix_, "/sub/", name), new_rank,
                 static_cast<int>(members.size()), std::move(global),
                 gloo_timeout_, hostname_, device_);
}

namespace {

// A gloo::Context put together from a transport context whose pairs were
// connected by hand (subgroups), as gloo's rendezvous would leave it.
class AssembledContext final : public gloo::Context {
 public:
  AssembledContext(int rank, int size,
                   std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<gloo::transport::Context> transport)
      : gloo::Context(rank, size) {
    device_ = std::move(device);
    transportContext_ = std::move(transport);
  }
};

void AppendU32(std::string& out, uint32_t v) {
  char bytes[4];
  std::memcpy(bytes, &v, 4);
  out.append(bytes, 4);
}

bool ReadU32(absl::string_view& in, uint32_t* v) {
  if (in.size() < 4) return false;
  std::memcpy(v, in.data(), 4);
  in.remove_prefix(4);
  return true;
}

bool ReadBytes(absl::string_view& in, absl::string_view* out) {
  uint32_t n = 0;
  if (!ReadU32(in, &n) || in.size() < n) return false;
  *out = in.substr(0, n);
  in.remove_prefix(n);
  return true;
}

// In a peer's posted value (groups of: name, then (peer, address) entries),
// the address its pair of group `name` made for `me`; nullopt if absent.
std::optional<std::vector<char>> FindAddress(absl::string_view value,
                                             absl::string_view name,
                                             uint32_t me) {
  uint32_t groups = 0;
  if (!ReadU32(value, &groups)) return std::nullopt;
  for (uint32_t g = 0; g < groups; ++g) {
    absl::string_view group;
    uint32_t entries = 0;
    if (!ReadBytes(value, &group) || !ReadU32(value, &entries)) break;
    for (uint32_t e = 0; e < entries; ++e) {
      uint32_t peer = 0;
      absl::string_view address;
      if (!ReadU32(value, &peer) || !ReadBytes(value, &address)) {
        return std::nullopt;
      }
      if (group == name && peer == me) {
        return std::vector<char>(address.begin(), address.end());
      }
    }
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::vector<std::shared_ptr<GlooCommunicator>>>
GlooCommunicator::subgroups(absl::string_view batch,
                            std::vector<SubgroupSpec> specs) {
  const std::string what =
      absl::StrCat("GlooCommunicator::subgroups '", batch, "'");
  // Each group's rank of this process and global ranks, checked as
  // subgroup() checks them.
  std::vector<int> new_rank(specs.size(), -1);
  std::vector<std::vector<int>> global(specs.size());
  std::vector<int> peers;  // the union of the groups' other members
  for (size_t g = 0; g < specs.size(); ++g) {
    for (size_t i = 0; i < specs[g].members.size(); ++i) {
      const int m = specs[g].members[i];
      if (m < 0 || m >= size_) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": group '", specs[g].name, "' member ", m,
                         " is outside this group of ", size_, " ranks"));
      }
      if (m == rank_) {
        new_rank[g] = static_cast<int>(i);
      } else {
        peers.push_back(m);
      }
      global[g].push_back(ranks_[m]);
    }
    if (new_rank[g] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": this rank (", rank_, ") is not among the members [",
          absl::StrJoin(specs[g].members, ", "), "] of group '", specs[g].name,
          "'"));
    }
  }
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  const std::string key_prefix = absl::StrCat(prefix_, "/fold/", batch, "/");
  const absl::Time deadline = absl::Now() + gloo_timeout_;

  // (1) Every group's pairs, and their addresses in one value.
  std::vector<std::shared_ptr<gloo::transport::Context>> transports(
      specs.size());
  std::string value;
  ScopedSigpipeBlock no_sigpipe;  // connecting and the barriers write here
  VEMESH_RETURN_IF_ERROR(RunGloo(absl::StrCat(what, ": pairs"), [&] {
    AppendU32(value, static_cast<uint32_t>(specs.size()));
    for (size_t g = 0; g < specs.size(); ++g) {
      const int size = static_cast<int>(specs[g].members.size());
      transports[g] = device_->createContext(new_rank[g], size);
      transports[g]->setTimeout(absl::ToChronoMilliseconds(gloo_timeout_));
      AppendU32(value, static_cast<uint32_t>(specs[g].name.size()));
      value += specs[g].name;
      AppendU32(value, static_cast<uint32_t>(size - 1));
      for (int i = 0; i < size; ++i) {
        if (i == new_rank[g]) continue;
        const std::vector<char> address =
            transports[g]->createPair(i)->address().bytes();
        AppendU32(value, static_cast<uint32_t>(specs[g].members[i]));
        AppendU32(value, static_cast<uint32_t>(address.size()));
        value.append(address.data(), address.size());
      }
    }
  }));
  VEMESH_RETURN_IF_ERROR(store_->set(absl::StrCat(key_prefix, rank_), value));

  // (2) The peers' values, in one wait.
  std::vector<std::string> keys;
  keys.reserve(peers.size());
  for (int p : peers) keys.push_back(absl::StrCat(key_prefix, p));
  auto values = store_->wait_get(keys, deadline);
  if (!values.ok()) {
    if (!absl::IsDeadlineExceeded(values.status())) return values.status();
    // Name, per group, the members whose value never came.
    std::vector<std::string> lines;
    for (size_t g = 0; g < specs.size(); ++g) {
      std::vector<std::string> missing;
      for (size_t i = 0; i < specs[g].members.size(); ++i) {
        const int m = specs[g].members[i];
        if (m == rank_) continue;
        if (!store_->get(absl::StrCat(key_prefix, m)).ok()) {
          missing.push_back(absl::StrCat(i, " (global rank ", ranks_[m], ")"));
        }
      }
      if (missing.empty()) continue;
      lines.push_back(absl::StrCat("gloo group '", prefix_, "/sub/",
                                   specs[g].name, "': peer rank(s) ",
                                   absl::StrJoin(missing, ", ")));
    }
    return absl::DeadlineExceededError(
        absl::StrCat(absl::StrJoin(lines, "; "), " never connected within ",
                     absl::FormatDuration(gloo_timeout_),
                     " (gone, or never made this call); rank ", rank_,
                     " gives up: ", values.status().message()));
  }
  auto value_of = [&](int member) -> absl::string_view {
    const size_t at = static_cast<size_t>(
        std::lower_bound(peers.begin(), peers.end(), member) - peers.begin());
    return (*values)[at];
  };

  // (3) Connect every pair, then one barrier per group (every rank takes
  // its groups in the same order, so the barriers cannot wait in a cycle):
  // a TCP connect completes before the peer accepts it, and a rank that
  // dropped a group at once would close a socket still being accepted.
  // Of a pair, one side connects out (to the listening socket its peer made
  // before posting its address, so it never waits for the peer) and the
  // other waits for that. Each rank first makes all its outgoing connects,
  // then waits for its incoming ones, so no wait depends on another rank's
  // wait and one thread does it all. Only the outgoing connects need Gloo's
  // loop to turn: the spinner is armed for those alone.
  struct PairConnect {
    size_t group;
    int peer;
    std::vector<char> address;
    bool out;
  };
  LoopSpinner spinner(device_.get());
  std::vector<PairConnect> connects;
  for (size_t g = 0; g < specs.size(); ++g) {
    const int size = static_cast<int>(specs[g].members.size());
    for (int i = 0; i < size; ++i) {
      if (i == new_rank[g]) continue;
      auto address = FindAddress(value_of(specs[g].members[i]), specs[g].name,
                                 static_cast<uint32_t>(rank_));
      if (!address.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": member ", specs[g].members[i], " (global rank ",
            ranks_[specs[g].members[i]], ") posted no address for group '",
            specs[g].name, "' toward rank ", rank_,
            " (the members' group lists differ)"));
      }
      const bool out =
          ConnectsOut(transports[g]->getPair(i)->address().bytes(), *address);
      connects.push_back({g, i, *std::move(address), out});
    }
  }
  std::stable_partition(connects.begin(), connects.end(),
                        [](const PairConnect& c) { return c.out; });
  auto connect = [&](const PairConnect& c) {
    return RunGloo(
        absl::StrCat(what, ": connect group '", specs[c.group].name, "' rank ",
                     new_rank[c.group], " to ", c.peer),
        [&] { transports[c.group]->getPair(c.peer)->connect(c.address); });
  };
  {
    spinner.Arm();
    absl::Status status;
    for (const PairConnect& c : connects) {
      if (!c.out) break;
      status = connect(c);
      if (!status.ok()) break;
    }
    spinner.Disarm();
    VEMESH_RETURN_IF_ERROR(status);
  }
  for (const PairConnect& c : connects) {
    if (!c.out) VEMESH_RETURN_IF_ERROR(connect(c));
  }
  std::vector<std::shared_ptr<GlooCommunicator>> out;
  out.reserve(specs.size());
  for (size_t g = 0; g < specs.size(); ++g) {
    const int size = static_cast<int>(specs[g].members.size());
    auto context = std::make_shared<AssembledContext>(new_rank[g], size,
                                                      device_, transports[g]);
    context->setTimeout(absl::ToChronoMilliseconds(gloo_timeout_));
    VEMESH_RETURN_IF_ERROR(RunGloo(
        absl::StrCat(what, ": barrier of group '", specs[g].name, "'"), [&] {
          gloo::BarrierOptions barrier(
              std::static_pointer_cast<gloo::Context>(context));
          barrier.setTag(0);
          gloo::barrier(barrier);
        }));
    out.push_back(std::shared_ptr<GlooCommunicator>(new GlooCommunicator(
        store_, absl::StrCat(prefix_, "/sub/", specs[g].name), new_rank[g],
        size, std::move(global[g]), gloo_timeout_, hostname_, device_,
        std::move(context))));
  }
  return out;
}

absl::StatusOr<std::shared_ptr<Communicator>> GlooCommunicator::split(int color,
                                                                      int key) {
  // Splits are collective, so every rank numbers them alike and the new
  // groups' prefixes agree without talking.
  const int64_t seq = next_split_++;
  VEMESH_RETURN_IF_ERROR(EnsureConnected());
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
              gloo_timeout_, hostname_, device_));
  return std::shared_ptr<Communicator>(std::move(child));
}

absl::StatusOr<std::shared_ptr<Communicator>> GlooCommunicator::Shrink(
    absl::Span<const int> exclude, const ShrinkOptions& /*options*/) {
  const int64_t seq = next_shrink_++;
  int new_rank = 0;
  std::vector<int> global = Survivors(exclude, &new_rank);
  const int size = static_cast<int>(global.size());
  VEMESH_ASSIGN_OR_RETURN(
      auto child, Connect(store_,
                          absl::StrCat(prefix_, "/shrink/", seq, "/",
                                       absl::StrJoin(exclude, ",")),
                          new_rank, size, std::move(global), gloo_timeout_,
                          hostname_, device_));
  return std::shared_ptr<Communicator>(std::move(child));
}

NativeHandle GlooCommunicator::native_handle() const {
  return NativeHandle{BackendName(Backend::kGloo), context_.get()};
}

GlooCommunicator* GlooCommunicator::UnconnectedWorld(Communicator* comm) {
  auto* gloo = dynamic_cast<GlooCommunicator*>(comm);
  return gloo != nullptr && !gloo->connected() ? gloo : nullptr;
}

}  // namespace vemesh
