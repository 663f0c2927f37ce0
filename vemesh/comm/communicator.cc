#include "vemesh/comm/communicator.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "vemesh/base/status_macros.h"

namespace vemesh {
namespace {

// Every backend's objects, so a test can see a leak whatever made it.
std::atomic<int64_t> live_communicators{0};

bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto x = reinterpret_cast<uintptr_t>(a);
  auto y = reinterpret_cast<uintptr_t>(b);
  return a != nullptr && b != nullptr && a_bytes > 0 && b_bytes > 0 &&
         x < y + b_bytes && y < x + a_bytes;
}

bool IsReduction(OpKind kind) {
  return kind == OpKind::kAllReduce || kind == OpKind::kReduce ||
         kind == OpKind::kReduceScatter || kind == OpKind::kReduceScatterV;
}

}  // namespace

Communicator::Communicator() {
  live_communicators.fetch_add(1, std::memory_order_relaxed);
}

Communicator::~Communicator() {
  live_communicators.fetch_sub(1, std::memory_order_relaxed);
}

int64_t LiveCommunicatorCount() {
  return live_communicators.load(std::memory_order_relaxed);
}

// -- Rank translation ---------------------------------------------------------

absl::StatusOr<int> Communicator::group_rank(int64_t global) const {
  std::call_once(group_rank_once_, [this] {
    const absl::Span<const int> members = ranks();
    group_rank_of_.reserve(members.size());
    for (size_t i = 0; i < members.size(); ++i) {
      group_rank_of_.emplace(members[i], static_cast<int>(i));
    }
  });
  auto it = group_rank_of_.find(global);
  if (it != group_rank_of_.end()) return it->second;
  const absl::Span<const int> members = ranks();
  std::string listed;
  for (size_t i = 0; i < members.size() && i < 8; ++i) {
    absl::StrAppend(&listed, i == 0 ? "" : ", ", members[i]);
  }
  if (members.size() > 8) absl::StrAppend(&listed, ", ...");
  return absl::NotFoundError(absl::StrCat(
      "global rank ", global, " is not a member of this group of ",
      members.size(), " ranks (global ranks ", listed, ")"));
}

absl::StatusOr<int> Communicator::PeerOf(absl::string_view op,
                                         GlobalRank peer) const {
  absl::StatusOr<int> local = group_rank(peer.value);
  if (!local.ok()) {
    return absl::NotFoundError(absl::StrCat(op, ": ", local.status().message()));
  }
  return local;
}

// -- Deadlines and abort --------------------------------------------------------

void Communicator::set_timeout(absl::Duration timeout) {
  timeout_ns_.store(timeout == absl::InfiniteDuration() || timeout < absl::ZeroDuration()
                        ? -1
                        : absl::ToInt64Nanoseconds(timeout),
                    std::memory_order_relaxed);
}

absl::Duration Communicator::timeout() const {
  const int64_t ns = timeout_ns_.load(std::memory_order_relaxed);
  return ns < 0 ? absl::InfiniteDuration() : absl::Nanoseconds(ns);
}

void Communicator::abort(absl::string_view reason) {
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (aborted_.load(std::memory_order_relaxed)) return;
    abort_reason_ = std::string(reason);
    aborted_.store(true, std::memory_order_release);
  }
  OnAbort();
}

absl::Status Communicator::AbortedError(absl::string_view op) const {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    reason = abort_reason_;
  }
  return absl::AbortedError(absl::StrCat(op, " on a ", backend(),
                                         " communicator of ", size(),
                                         " ranks: it was aborted (", reason,
                                         ")"));
}

// -- Checks ---------------------------------------------------------------------

size_t Communicator::MaxCount() const { return std::numeric_limits<size_t>::max(); }

absl::Status Communicator::CheckUsable(absl::string_view) const {
  return absl::OkStatus();
}

absl::Status Communicator::LengthError(absl::string_view op,
                                       absl::string_view what, size_t got,
                                       size_t expected) {
  return absl::InvalidArgumentError(absl::StrCat(
      op, ": the ", what, " buffer has ", got, " elements: expected ",
      expected));
}

absl::Status Communicator::TotalError(absl::string_view op,
                                      absl::string_view what, size_t length,
                                      absl::Span<const size_t> counts) {
  size_t total = 0;
  for (size_t c : counts) {
    if (c > std::numeric_limits<size_t>::max() - total) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": the ", what, " counts overflow when summed"));
    }
    total += c;
  }
  if (total == length) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      op, ": the ", what, " buffer has ", length,
      " elements: expected the sum of its counts, ", total));
}

std::string Communicator::AllToAllLengthText(size_t send, size_t recv) const {
  return absl::StrCat("all_to_all: send has ", send, " and recv ", recv,
                      " elements: expected the same length, a multiple of "
                      "the group size ",
                      size());
}

absl::Status Communicator::CheckBuffer(const Operation& op,
                                       absl::string_view what,
                                       const void* data, size_t count) const {
  if (count > MaxCount()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op.Name(), ": the ", what, " buffer of ", count, " elements is above "
        "the ", backend(), " backend's limit of ", MaxCount()));
  }
  if (data == nullptr && count > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op.Name(), ": the ", what, " buffer is null for ", count,
        " elements"));
  }
  return absl::OkStatus();
}

absl::Status Communicator::CheckRank(const Operation& op,
                                     absl::string_view what,
                                     int64_t rank) const {
  if (rank < 0 || rank >= size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op.Name(), ": ", what, " ", rank,
                     " is outside the group of ", size(), " ranks (0..",
                     size() - 1, ")"));
  }
  return absl::OkStatus();
}

absl::Status Communicator::CheckCounts(const Operation& op,
                                       absl::string_view what,
                                       absl::Span<const size_t> counts,
                                       size_t* total) const {
  if (counts.size() != static_cast<size_t>(size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        op.Name(), ": ", what, " has ", counts.size(),
        " entries: expected one per rank of the group (", size(), ")"));
  }
  *total = 0;
  for (size_t c : counts) {
    if (c > MaxCount() - *total) {
      return absl::InvalidArgumentError(absl::StrCat(
          op.Name(), ": the ", what, " add up to more than the ", backend(),
          " backend's limit of ", MaxCount(), " elements"));
    }
    *total += c;
  }
  return absl::OkStatus();
}

absl::Status Communicator::Check(const Operation& op) const {
  const absl::string_view name = op.Name();
  if (SizeOf(op.type) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": unknown data type ", static_cast<int>(op.type)));
  }
  if (IsReduction(op.kind)) {
    if (ReduceOpName(op.op) == "unknown") {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": unknown reduce op ", static_cast<int>(op.op)));
    }
    if (op.op == ReduceOp::kAvg && !IsFloatingPoint(op.type)) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": ReduceOp avg needs a floating-point type; got ",
          DataTypeName(op.type), " (use sum and divide)"));
    }
  }
  const size_t n = static_cast<size_t>(size());
  const size_t width = SizeOf(op.type);
  // Blocks of size() * count elements: refuse a product past the limit
  // before anything multiplies it.
  auto blocks = [&](absl::string_view what) -> absl::StatusOr<size_t> {
    if (op.count > MaxCount() / n) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": the ", what, " buffer of ", n, " x ", op.count,
          " elements is above the ", backend(), " backend's limit of ",
          MaxCount()));
    }
    return op.count * n;
  };
  auto disjoint = [&](size_t send_count, size_t recv_count) -> absl::Status {
    if (op.send != op.recv &&
        Overlap(op.send, send_count * width, op.recv, recv_count * width)) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": the send and recv buffers overlap without being the same "
          "buffer"));
    }
    return absl::OkStatus();
  };
  auto apart = [&](size_t send_count, size_t recv_count) -> absl::Status {
    if (Overlap(op.send, send_count * width, op.recv, recv_count * width)) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": the send and recv buffers overlap (this operation cannot "
          "work in place)"));
    }
    return absl::OkStatus();
  };
  const bool root_here = op.root == rank();
  switch (op.kind) {
    case OpKind::kBarrier:
      return absl::OkStatus();
    case OpKind::kBroadcast:
      VEMESH_RETURN_IF_ERROR(CheckRank(op, "root", op.root));
      return CheckBuffer(op, "data", op.recv, op.count);
    case OpKind::kAllReduce:
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "send", op.send, op.count));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "recv", op.recv, op.count));
      return disjoint(op.count, op.count);
    case OpKind::kReduce:
      VEMESH_RETURN_IF_ERROR(CheckRank(op, "root", op.root));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "send", op.send, op.count));
      if (!root_here) return absl::OkStatus();
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "recv", op.recv, op.count));
      return disjoint(op.count, op.count);
    case OpKind::kAllGather: {
      VEMESH_ASSIGN_OR_RETURN(size_t total, blocks("recv"));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "send", op.send, op.count));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "recv", op.recv, total));
      return apart(op.count, total);
    }
    case OpKind::kAllGatherV: {
      size_t total = 0;
      VEMESH_RETURN_IF_ERROR(CheckCounts(op, "recv_counts", op.recv_counts, &total));
      if (op.count != op.recv_counts[rank()]) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, ": this rank sends ", op.count,
            " elements but recv_counts[", rank(), "] is ",
            op.recv_counts[rank()]));
      }
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "send", op.send, op.count));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "recv", op.recv, total));
      return apart(op.count, total);
    }
    case OpKind::kReduceScatter: {
      VEMESH_ASSIGN_OR_RETURN(size_t total, blocks("send"));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "send", op.send, total));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "recv", op.recv, op.count));
      return apart(total, op.count);
    }
    case OpKind::kReduceScatterV: {
      size_t total = 0;
      VEMESH_RETURN_IF_ERROR(CheckCounts(op, "recv_counts", op.recv_counts, &total));
      const size_t mine = op.recv_counts[rank()];
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "send", op.send, total));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "recv", op.recv, mine));
      return apart(total, mine);
    }
    case OpKind::kGather: {
      VEMESH_RETURN_IF_ERROR(CheckRank(op, "root", op.root));
      VEMESH_ASSIGN_OR_RETURN(size_t total, blocks("recv"));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "send", op.send, op.count));
      if (!root_here) return absl::OkStatus();
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "recv", op.recv, total));
      return apart(op.count, total);
    }
    case OpKind::kScatter: {
      VEMESH_RETURN_IF_ERROR(CheckRank(op, "root", op.root));
      VEMESH_ASSIGN_OR_RETURN(size_t total, blocks("send"));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "recv", op.recv, op.count));
      if (!root_here) return absl::OkStatus();
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "send", op.send, total));
      return apart(total, op.count);
    }
    case OpKind::kAllToAll: {
      VEMESH_ASSIGN_OR_RETURN(size_t total, blocks("send"));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "send", op.send, total));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "recv", op.recv, total));
      return apart(total, total);
    }
    case OpKind::kAllToAllV: {
      size_t sent = 0;
      size_t received = 0;
      VEMESH_RETURN_IF_ERROR(CheckCounts(op, "send_counts", op.send_counts, &sent));
      VEMESH_RETURN_IF_ERROR(CheckCounts(op, "recv_counts", op.recv_counts, &received));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "send", op.send, sent));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "recv", op.recv, received));
      return apart(sent, received);
    }
    case OpKind::kBatch: {
      for (size_t i = 0; i < op.p2p.size(); ++i) {
        const P2POp& p = op.p2p[i];
        const bool sends = p.kind == P2POp::Kind::kSend;
        if (SizeOf(p.type) == 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              name, ": transfer ", i, " has unknown data type ",
              static_cast<int>(p.type)));
        }
        VEMESH_RETURN_IF_ERROR(CheckRank(op, sends ? "dest" : "source", p.peer));
        VEMESH_RETURN_IF_ERROR(CheckBuffer(op, sends ? "send" : "recv", p.data, p.count));
        if (sends) continue;
        // A receive must not write over another transfer's buffer.
        for (size_t j = 0; j < op.p2p.size(); ++j) {
          const P2POp& q = op.p2p[j];
          if (j != i && Overlap(p.data, p.count * SizeOf(p.type), q.data,
                                q.count * SizeOf(q.type))) {
            return absl::InvalidArgumentError(absl::StrCat(
                name, ": the recv buffer of transfer ", i,
                " overlaps the buffer of transfer ", j));
          }
        }
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown operation kind ", static_cast<int>(op.kind)));
}

// -- Any operation -----------------------------------------------------------------

Communicator::WorkOr Communicator::start(Operation op) {
  if (aborted()) return AbortedError(op.Name());
  VEMESH_RETURN_IF_ERROR(CheckUsable(op.Name()));
  VEMESH_RETURN_IF_ERROR(Check(op));
  return Start(op);
}

absl::Status Communicator::run(Operation op) {
  const int64_t ns = timeout_ns_.load(std::memory_order_relaxed);
  const absl::Time deadline =
      ns < 0 ? absl::InfiniteFuture() : absl::Now() + absl::Nanoseconds(ns);
  VEMESH_ASSIGN_OR_RETURN(std::shared_ptr<Work> work, start(std::move(op)));
  return work->wait(deadline);
}

// -- Named forms -------------------------------------------------------------------

namespace {

Operation Make(OpKind kind, const void* send, void* recv, size_t count,
               DataType type) {
  Operation op;
  op.kind = kind;
  op.send = send;
  op.recv = recv;
  op.count = count;
  op.type = type;
  return op;
}

Operation Reduction(OpKind kind, const void* send, void* recv, size_t count,
                    DataType type, ReduceOp reduce) {
  Operation op = Make(kind, send, recv, count, type);
  op.op = reduce;
  return op;
}

Operation Rooted(OpKind kind, const void* send, void* recv, size_t count,
                 DataType type, int root) {
  Operation op = Make(kind, send, recv, count, type);
  op.root = root;
  return op;
}

Operation Batch(absl::string_view name, std::vector<P2POp> p2p) {
  Operation op;
  op.kind = OpKind::kBatch;
  op.name = name;
  if (!p2p.empty()) op.type = p2p.front().type;
  op.p2p = std::move(p2p);
  return op;
}

Operation Streamed(Operation op, const AsyncOptions& options) {
  op.stream = options.stream;
  return op;
}

std::vector<size_t> Counts(absl::Span<const size_t> counts) {
  return std::vector<size_t>(counts.begin(), counts.end());
}

}  // namespace

absl::Status Communicator::barrier() { return run(Make(OpKind::kBarrier, nullptr, nullptr, 0, DataType::kFloat32)); }

absl::Status Communicator::broadcast(void* data, size_t count, DataType type,
                                     int root) {
  return run(Rooted(OpKind::kBroadcast, data, data, count, type, root));
}

absl::Status Communicator::all_reduce(const void* send, void* recv,
                                      size_t count, DataType type,
                                      ReduceOp op) {
  return run(Reduction(OpKind::kAllReduce, send, recv, count, type, op));
}

absl::Status Communicator::reduce(const void* send, void* recv, size_t count,
                                  DataType type, ReduceOp op, int root) {
  Operation o = Reduction(OpKind::kReduce, send, recv, count, type, op);
  o.root = root;
  return run(std::move(o));
}

absl::Status Communicator::all_gather(const void* send, void* recv,
                                      size_t count, DataType type) {
  return run(Make(OpKind::kAllGather, send, recv, count, type));
}

absl::Status Communicator::all_gather_v(const void* send, void* recv,
                                        absl::Span<const size_t> recv_counts,
                                        DataType type) {
  Operation op = Make(OpKind::kAllGatherV, send, recv, 0, type);
  op.recv_counts = Counts(recv_counts);
  if (static_cast<size_t>(rank()) < recv_counts.size()) {
    op.count = recv_counts[rank()];
  }
  return run(std::move(op));
}

absl::Status Communicator::reduce_scatter(const void* send, void* recv,
                                          size_t count, DataType type,
                                          ReduceOp op) {
  return run(Reduction(OpKind::kReduceScatter, send, recv, count, type, op));
}

absl::Status Communicator::reduce_scatter_v(
    const void* send, void* recv, absl::Span<const size_t> recv_counts,
    DataType type, ReduceOp op) {
  Operation o = Reduction(OpKind::kReduceScatterV, send, recv, 0, type, op);
  o.recv_counts = Counts(recv_counts);
  return run(std::move(o));
}

absl::Status Communicator::gather(const void* send, void* recv, size_t count,
                                  DataType type, int root) {
  return run(Rooted(OpKind::kGather, send, recv, count, type, root));
}

absl::Status Communicator::scatter(const void* send, void* recv, size_t count,
                                   DataType type, int root) {
  return run(Rooted(OpKind::kScatter, send, recv, count, type, root));
}

absl::Status Communicator::all_to_all(const void* send, void* recv,
                                      size_t count, DataType type) {
  return run(Make(OpKind::kAllToAll, send, recv, count, type));
}

absl::Status Communicator::all_to_all_v(const void* send,
                                        absl::Span<const size_t> send_counts,
                                        void* recv,
                                        absl::Span<const size_t> recv_counts,
                                        DataType type) {
  Operation op = Make(OpKind::kAllToAllV, send, recv, 0, type);
  op.send_counts = Counts(send_counts);
  op.recv_counts = Counts(recv_counts);
  return run(std::move(op));
}

absl::Status Communicator::send(const void* data, size_t count, DataType type,
                                int peer) {
  return run(Batch("send", {P2POp::Send(data, count, type, peer)}));
}

absl::Status Communicator::recv(void* data, size_t count, DataType type,
                                int peer) {
  return run(Batch("recv", {P2POp::Recv(data, count, type, peer)}));
}

absl::Status Communicator::send(const void* data, size_t count, DataType type,
                                GlobalRank peer) {
  VEMESH_ASSIGN_OR_RETURN(int local, PeerOf("send", peer));
  return send(data, count, type, local);
}

absl::Status Communicator::recv(void* data, size_t count, DataType type,
                                GlobalRank peer) {
  VEMESH_ASSIGN_OR_RETURN(int local, PeerOf("recv", peer));
  return recv(data, count, type, local);
}

absl::Status Communicator::send_recv(const void* send_data, size_t send_count,
                                     int dest, void* recv_data,
                                     size_t recv_count, int source,
                                     DataType type) {
  return run(Batch("send_recv",
                   {P2POp::Send(send_data, send_count, type, dest),
                    P2POp::Recv(recv_data, recv_count, type, source)}));
}

absl::Status Communicator::batch_send_recv(absl::Span<const P2POp> ops) {
  return run(Batch("batch_send_recv", std::vector<P2POp>(ops.begin(), ops.end())));
}

Communicator::WorkOr Communicator::ibarrier() {
  return start(Make(OpKind::kBarrier, nullptr, nullptr, 0, DataType::kFloat32));
}

Communicator::WorkOr Communicator::ibroadcast(void* data, size_t count,
                                              DataType type, int root,
                                              const AsyncOptions& options) {
  return start(Streamed(Rooted(OpKind::kBroadcast, data, data, count, type, root),
                        options));
}

Communicator::WorkOr Communicator::iall_reduce(const void* send, void* recv,
                                               size_t count, DataType type,
                                               ReduceOp op,
                                               const AsyncOptions& options) {
  return start(Streamed(
      Reduction(OpKind::kAllReduce, send, recv, count, type, op), options));
}

Communicator::WorkOr Communicator::ireduce(const void* send, void* recv,
                                           size_t count, DataType type,
                                           ReduceOp op, int root,
                                           const AsyncOptions& options) {
  Operation o = Reduction(OpKind::kReduce, send, recv, count, type, op);
  o.root = root;
  return start(Streamed(std::move(o), options));
}

Communicator::WorkOr Communicator::iall_gather(const void* send, void* recv,
                                               size_t count, DataType type,
                                               const AsyncOptions& options) {
  return start(Streamed(Make(OpKind::kAllGather, send, recv, count, type),
                        options));
}

Communicator::WorkOr Communicator::iall_gather_v(
    const void* send, void* recv, absl::Span<const size_t> recv_counts,
    DataType type, const AsyncOptions& options) {
  Operation op = Make(OpKind::kAllGatherV, send, recv, 0, type);
  op.recv_counts = Counts(recv_counts);
  if (static_cast<size_t>(rank()) < recv_counts.size()) {
    op.count = recv_counts[rank()];
  }
  return start(Streamed(std::move(op), options));
}

Communicator::WorkOr Communicator::ireduce_scatter(
    const void* send, void* recv, size_t count, DataType type, ReduceOp op,
    const AsyncOptions& options) {
  return start(Streamed(
      Reduction(OpKind::kReduceScatter, send, recv, count, type, op), options));
}

Communicator::WorkOr Communicator::ireduce_scatter_v(
    const void* send, void* recv, absl::Span<const size_t> recv_counts,
    DataType type, ReduceOp op, const AsyncOptions& options) {
  Operation o = Reduction(OpKind::kReduceScatterV, send, recv, 0, type, op);
  o.recv_counts = Counts(recv_counts);
  return start(Streamed(std::move(o), options));
}

Communicator::WorkOr Communicator::igather(const void* send, void* recv,
                                           size_t count, DataType type,
                                           int root,
                                           const AsyncOptions& options) {
  return start(Streamed(Rooted(OpKind::kGather, send, recv, count, type, root),
                        options));
}

Communicator::WorkOr Communicator::iscatter(const void* send, void* recv,
                                            size_t count, DataType type,
                                            int root,
                                            const AsyncOptions& options) {
  return start(Streamed(Rooted(OpKind::kScatter, send, recv, count, type, root),
                        options));
}

Communicator::WorkOr Communicator::iall_to_all(const void* send, void* recv,
                                               size_t count, DataType type,
                                               const AsyncOptions& options) {
  return start(Streamed(Make(OpKind::kAllToAll, send, recv, count, type),
                        options));
}

Communicator::WorkOr Communicator::iall_to_all_v(
    const void* send, absl::Span<const size_t> send_counts, void* recv,
    absl::Span<const size_t> recv_counts, DataType type,
    const AsyncOptions& options) {
  Operation op = Make(OpKind::kAllToAllV, send, recv, 0, type);
  op.send_counts = Counts(send_counts);
  op.recv_counts = Counts(recv_counts);
  return start(Streamed(std::move(op), options));
}

Communicator::WorkOr Communicator::isend(const void* data, size_t count,
                                         DataType type, int peer,
                                         const AsyncOptions& options) {
  return start(Streamed(Batch("isend", {P2POp::Send(data, count, type, peer)}),
                        options));
}

Communicator::WorkOr Communicator::irecv(void* data, size_t count,
                                         DataType type, int peer,
                                         const AsyncOptions& options) {
  return start(Streamed(Batch("irecv", {P2POp::Recv(data, count, type, peer)}),
                        options));
}

Communicator::WorkOr Communicator::isend(const void* data, size_t count,
                                         DataType type, GlobalRank peer,
                                         const AsyncOptions& options) {
  VEMESH_ASSIGN_OR_RETURN(int local, PeerOf("isend", peer));
  return isend(data, count, type, local, options);
}

Communicator::WorkOr Communicator::irecv(void* data, size_t count,
                                         DataType type, GlobalRank peer,
                                         const AsyncOptions& options) {
  VEMESH_ASSIGN_OR_RETURN(int local, PeerOf("irecv", peer));
  return irecv(data, count, type, local, options);
}

Communicator::WorkOr Communicator::batch_isend_irecv(
    absl::Span<const P2POp> ops, const AsyncOptions& options) {
  return start(Streamed(
      Batch("batch_isend_irecv", std::vector<P2POp>(ops.begin(), ops.end())),
      options));
}

std::string SplitRequestName(const SplitRequest& request, size_t index) {
  return request.name.empty() ? absl::StrCat("request ", index)
                              : absl::StrCat("'", request.name, "'");
}

absl::StatusOr<std::vector<std::shared_ptr<Communicator>>>
Communicator::split_many(absl::Span<const SplitRequest> requests,
                         absl::Time) {
  std::vector<std::shared_ptr<Communicator>> groups;
  groups.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const SplitRequest& request = requests[i];
    auto group = split(request.color, request.key);
    if (!group.ok()) {
      return absl::Status(
          group.status().code(),
          absl::StrCat("split ", SplitRequestName(request, i), ": ",
                       group.status().message()));
    }
    groups.push_back(*std::move(group));
  }
  return groups;
}

// -- Names ---------------------------------------------------------------------------

absl::string_view Operation::Name() const {
  return name.empty() ? OpKindName(kind) : name;
}

std::string Operation::Describe() const {
  switch (kind) {
    case OpKind::kBarrier:
      return std::string(Name());
    case OpKind::kBatch: {
      if (p2p.size() == 1) {
        return absl::StrCat(Name(), " of ", p2p[0].count, " ",
                            DataTypeName(p2p[0].type), " ",
                            p2p[0].kind == P2POp::Kind::kSend ? "to" : "from",
                            " rank ", p2p[0].peer);
      }
      return absl::StrCat(Name(), " of ", p2p.size(), " transfers");
    }
    case OpKind::kAllGatherV:
    case OpKind::kReduceScatterV:
    case OpKind::kAllToAllV: {
      size_t total = 0;
      for (size_t c : recv_counts) total += c;
      return absl::StrCat(Name(), " receiving ", total, " ",
                          DataTypeName(type));
    }
    default:
      return absl::StrCat(Name(), " of ", count, " ", DataTypeName(type));
  }
}

absl::string_view OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kBarrier: return "barrier";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kAllReduce: return "all_reduce";
    case OpKind::kReduce: return "reduce";
    case OpKind::kAllGather: return "all_gather";
    case OpKind::kAllGatherV: return "all_gather_v";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kReduceScatterV: return "reduce_scatter_v";
    case OpKind::kGather: return "gather";
    case OpKind::kScatter: return "scatter";
    case OpKind::kAllToAll: return "all_to_all";
    case OpKind::kAllToAllV: return "all_to_all_v";
    case OpKind::kBatch: return "batch_send_recv";
  }
  return "unknown";
}

size_t SizeOf(DataType type) {
  switch (type) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
    case DataType::kBFloat16: return 2;
    case DataType::kFloat16: return 2;
    case DataType::kInt8: return 1;
    case DataType::kUInt8: return 1;
  }
  return 0;
}

bool IsFloatingPoint(DataType type) {
  return type == DataType::kFloat32 || type == DataType::kFloat64 ||
         type == DataType::kBFloat16 || type == DataType::kFloat16;
}

absl::string_view DataTypeName(DataType type) {
  switch (type) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat16: return "float16";
    case DataType::kInt8: return "int8";
    case DataType::kUInt8: return "uint8";
  }
  return "unknown";
}

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProd: return "prod";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kAvg: return "avg";
  }
  return "unknown";
}

}  // namespace vemesh
