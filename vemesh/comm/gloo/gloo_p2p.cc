// GlooCommunicator's point to point: sends posted on the issuing thread,
// receives (length first) and messages to oneself on the worker. On a
// same-host group, once its segment is set up, through the segment's
// pairs (internal/shm_group.h): no TCP pair, no I/O thread.

#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gloo/transport/unbound_buffer.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/comm/gloo/internal/gloo_error.h"
#include "vemesh/comm/gloo/internal/gloo_job.h"
#include "vemesh/comm/gloo/internal/shm_group.h"

namespace vemesh {
namespace {

// The most a vemesh sender ever sends: INT_MAX elements of 8 bytes. A
// header above it is garbage, never an allocation size.
constexpr uint64_t kMaxMessageBytes = uint64_t{INT_MAX} * 8;

using gloo_internal::Bytes;
using gloo_internal::kHeaderSlot;
using gloo_internal::kPayloadSlot;
using gloo_internal::ShmGroup;

}  // namespace

void GlooCommunicator::WaitSend(gloo::transport::UnboundBuffer& buffer) {
  // False: abort() interrupted it (a timeout or a lost peer throws).
  if (!buffer.waitSend()) throw std::runtime_error("send interrupted by abort");
}

void GlooCommunicator::WaitRecv(gloo::transport::UnboundBuffer& buffer) {
  if (!buffer.waitRecv()) throw std::runtime_error("recv interrupted by abort");
}

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
  // One issuing thread at a time: each peer's messages are counted and
  // posted in one order.
  std::lock_guard<std::mutex> lock(p2p_mu_);
  for (const P2POp& p : job.op.p2p) {
    if (p.kind != P2POp::Kind::kSend || p.peer == rank_) continue;
    const size_t bytes = p.count * SizeOf(p.type);
    sent_[p.peer] += 1;
    if (p2p_shm_ != nullptr) {
      absl::StatusOr<bool> in_ring = p2p_shm_->P2PSend(p.peer, p.data, bytes);
      if (!in_ring.ok()) {
        job.posted = absl::Status(
            in_ring.status().code(),
            absl::StrCat("gloo ", job.name,
                         " (shared memory): ", in_ring.status().message()));
        return;
      }
      if (*in_ring) continue;  // else its payload goes by TCP
    }
    job.posted = RunGloo(absl::StrCat("gloo ", job.name), [&] {
      job.outgoing.push_back(
          std::make_unique<Outgoing>(*this, p.peer, p.data, bytes));
    });
    if (!job.posted.ok()) return;
  }
}

absl::Status GlooCommunicator::ReceiveFrom(absl::string_view op, int peer,
                                           void* data, size_t count,
                                           DataType type,
                                           absl::Status* failed) {
  const uint64_t k = received_[peer]++;
  if (shm_ == nullptr || !ShmGroup::HasP2P(size_)) {
    return Receive(op, peer, data, count, type);
  }
  const auto aborted_now = [this] { return aborted(); };
  if (tcp_before_[peer] < 0) {
    absl::StatusOr<uint64_t> before =
        shm_->P2PTcpBefore(peer, gloo_timeout_, aborted_now);
    if (!before.ok()) {
      *failed = before.status();
      return absl::OkStatus();
    }
    tcp_before_[peer] = static_cast<int64_t>(*before);
  }
  if (k < static_cast<uint64_t>(tcp_before_[peer])) {
    return Receive(op, peer, data, count, type);
  }
  absl::StatusOr<ShmGroup::P2PMessage> message =
      shm_->P2PNext(peer, gloo_timeout_, aborted_now);
  if (!message.ok()) {
    *failed = message.status();
    return absl::OkStatus();
  }
  if (!message->in_ring) {  // its payload follows by TCP
    shm_->P2PTake(peer, *message, nullptr);
    // The pair closed: the rest of the stream is TCP's.
    if (message->closes) tcp_before_[peer] = INT64_MAX;
    return Receive(op, peer, data, count, type);
  }
  const size_t bytes = count * SizeOf(type);
  // A message of the wrong length is dropped: the stream stays in step.
  shm_->P2PTake(peer, *message, message->bytes == bytes ? data : nullptr);
  if (message->bytes != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, " expected ", count, " elements from rank ", peer,
                     " but got ", message->bytes / SizeOf(type)));
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::RunBatch(Job& job, absl::Status* failed) {
  const Operation& op = job.op;
  // Receives in order: two from one peer match its sends in order. A
  // mismatched length is reported after the others completed.
  absl::Status first_error;
  for (const P2POp& p : op.p2p) {
    if (p.kind != P2POp::Kind::kRecv) continue;
    absl::Status s =
        p.peer == rank_
            ? TakeFromSelf(op.Name(), p.data, p.count, p.type)
            : ReceiveFrom(op.Name(), p.peer, p.data, p.count, p.type, failed);
    if (!failed->ok()) return first_error;
    if (first_error.ok()) first_error = s;
  }
  for (auto& message : job.outgoing) message->Wait();
  job.outgoing.clear();
  return first_error;
}

}  // namespace vemesh
