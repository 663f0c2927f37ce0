#include "vemesh/comm/communicator.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "vemesh/base/status_macros.h"

namespace vemesh {
namespace {

// Every backend's objects, so a test can see a leak whatever made it.
std::atomic<int64_t> live_communicators{0};

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
  {
    std::lock_guard<std::mutex> lock(group_rank_mu_);
    if (!group_rank_built_) {
      const absl::Span<const int> members = ranks();
      group_rank_of_.reserve(members.size());
      for (size_t i = 0; i < members.size(); ++i) {
        group_rank_of_.emplace(members[i], static_cast<int>(i));
      }
      group_rank_built_ = true;
    }
    auto it = group_rank_of_.find(global);
    if (it != group_rank_of_.end()) return it->second;
  }
  const absl::Span<const int> members = ranks();
  std::string listed;
  for (size_t i = 0; i < members.size() && i < 8; ++i) {
    absl::StrAppend(&listed, i == 0 ? "" : ", ", members[i]);
  }
  if (members.size() > 8) absl::StrAppend(&listed, ", ...");
  return absl::NotFoundError(
      absl::StrCat("global rank ", global, " is not a member of this group of ",
                   members.size(), " ranks (global ranks ", listed, ")"));
}

void Communicator::ForgetGroupRanks() {
  std::lock_guard<std::mutex> lock(group_rank_mu_);
  group_rank_of_.clear();
  group_rank_built_ = false;
}

absl::StatusOr<int> Communicator::PeerOf(absl::string_view op,
                                         GlobalRank peer) const {
  absl::StatusOr<int> local = group_rank(peer.value);
  if (!local.ok()) {
    return absl::NotFoundError(
        absl::StrCat(op, ": ", local.status().message()));
  }
  return local;
}

// -- Deadlines and abort
// --------------------------------------------------------

void Communicator::set_timeout(absl::Duration timeout) {
  timeout_ns_.store(
      timeout == absl::InfiniteDuration() || timeout < absl::ZeroDuration()
          ? -1
          : absl::ToInt64Nanoseconds(timeout),
      std::memory_order_relaxed);
}

absl::Duration Communicator::timeout() const {
  const int64_t ns = timeout_ns_.load(std::memory_order_relaxed);
  return ns < 0 ? absl::InfiniteDuration() : absl::Nanoseconds(ns);
}

bool Communicator::MarkAborted(absl::string_view reason) {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (aborted_.load(std::memory_order_relaxed)) return false;
  abort_reason_ = std::string(reason);
  aborted_.store(true, std::memory_order_release);
  return true;
}

void Communicator::ClearAborted() {
  std::lock_guard<std::mutex> lock(abort_mu_);
  abort_reason_.clear();
  aborted_.store(false, std::memory_order_release);
}

void Communicator::abort(absl::string_view reason) {
  if (MarkAborted(reason)) OnAbort();
}

void Communicator::OnAbortMany(absl::Span<Communicator* const> same_backend) {
  for (Communicator* comm : same_backend) comm->OnAbort();
}

void AbortCommunicators(absl::Span<const std::shared_ptr<Communicator>> comms,
                        absl::string_view reason) {
  // Marked first, all of them, so that no operation starts on one while
  // another is being released; then one release per backend.
  std::vector<std::vector<Communicator*>> by_backend;
  for (const std::shared_ptr<Communicator>& comm : comms) {
    if (comm == nullptr || !comm->MarkAborted(reason)) continue;
    auto same = std::find_if(
        by_backend.begin(), by_backend.end(), [&](const auto& group) {
          return group.front()->backend() == comm->backend();
        });
    if (same == by_backend.end()) {
      by_backend.push_back({comm.get()});
    } else {
      same->push_back(comm.get());
    }
  }
  for (const std::vector<Communicator*>& group : by_backend) {
    group.front()->OnAbortMany(group);
  }
}

absl::StatusOr<std::shared_ptr<Communicator>> Communicator::shrink(
    absl::Span<const int> exclude, const ShrinkOptions& options) {
  std::vector<int> sorted(exclude.begin(), exclude.end());
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shrink: group rank ", sorted[i],
                       " is outside this group of ", size(), " ranks"));
    }
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("shrink: group rank ", sorted[i], " is excluded twice"));
    }
    if (sorted[i] == rank()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shrink: this rank (group rank ", rank(),
                       ", global rank ", global_rank(),
                       ") is excluded; only the ranks that stay call shrink"));
    }
  }
  if (static_cast<int>(sorted.size()) >= size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shrink: excluding all ", size(), " ranks leaves no group"));
  }
  return Shrink(sorted, options);
}

absl::StatusOr<std::shared_ptr<Communicator>> Communicator::Shrink(
    absl::Span<const int> /*exclude*/, const ShrinkOptions& /*options*/) {
  return absl::UnimplementedError(absl::StrCat(
      "shrink is not implemented for a ", backend(), " communicator"));
}

std::vector<int> Communicator::Survivors(absl::Span<const int> exclude,
                                         int* new_rank) const {
  std::vector<int> out;
  size_t next = 0;
  for (int r = 0; r < size(); ++r) {
    if (next < exclude.size() && exclude[next] == r) {
      ++next;
      continue;
    }
    if (r == rank()) *new_rank = static_cast<int>(out.size());
    out.push_back(ranks()[r]);
  }
  return out;
}

absl::Status Communicator::AbortedError(absl::string_view op) const {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    reason = abort_reason_;
  }
  return absl::AbortedError(
      absl::StrCat(op, " on a ", backend(), " communicator of ", size(),
                   " ranks: it was aborted (", reason, ")"));
}

// -- Any operation
// -----------------------------------------------------------------

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

// -- Named forms
// -------------------------------------------------------------------

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

absl::Status Communicator::barrier() {
  return run(Make(OpKind::kBarrier, nullptr, nullptr, 0, DataType::kFloat32));
}

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
  return run(
      Batch("send_recv", {P2POp::Send(send_data, send_count, type, dest),
                          P2POp::Recv(recv_data, recv_count, type, source)}));
}

absl::Status Communicator::batch_send_recv(absl::Span<const P2POp> ops) {
  return run(
      Batch("batch_send_recv", std::vector<P2POp>(ops.begin(), ops.end())));
}

Communicator::WorkOr Communicator::ibarrier() {
  return start(Make(OpKind::kBarrier, nullptr, nullptr, 0, DataType::kFloat32));
}

Communicator::WorkOr Communicator::ibroadcast(void* data, size_t count,
                                              DataType type, int root,
                                              const AsyncOptions& options) {
  return start(Streamed(
      Rooted(OpKind::kBroadcast, data, data, count, type, root), options));
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
  return start(
      Streamed(Make(OpKind::kAllGather, send, recv, count, type), options));
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
  return start(
      Streamed(Make(OpKind::kAllToAll, send, recv, count, type), options));
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

Communicator::WorkOr Communicator::isend_recv(
    const void* send_data, size_t send_count, int dest, void* recv_data,
    size_t recv_count, int source, DataType type, const AsyncOptions& options) {
  return start(Streamed(
      Batch("isend_recv", {P2POp::Send(send_data, send_count, type, dest),
                           P2POp::Recv(recv_data, recv_count, type, source)}),
      options));
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

StoreScope Communicator::store_scope() const { return {}; }

absl::StatusOr<std::vector<std::shared_ptr<Communicator>>>
Communicator::split_many(absl::Span<const SplitRequest> requests, absl::Time) {
  std::vector<std::shared_ptr<Communicator>> groups;
  groups.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const SplitRequest& request = requests[i];
    auto group = split(request.color, request.key);
    if (!group.ok()) {
      return absl::Status(group.status().code(),
                          absl::StrCat("split ", SplitRequestName(request, i),
                                       ": ", group.status().message()));
    }
    groups.push_back(*std::move(group));
  }
  return groups;
}

}  // namespace vemesh
