// vemesh/comm/gloo/internal/gloo_job.h
//
// The parts of GlooCommunicator that its files share: an issued operation
// (Job) and its Work, and the point-to-point messages (Outgoing, whose
// waits abort can interrupt). Private: not installed.

#ifndef VEMESH_COMM_GLOO_INTERNAL_GLOO_JOB_H_
#define VEMESH_COMM_GLOO_INTERNAL_GLOO_JOB_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gloo/context.h"
#include "gloo/transport/unbound_buffer.h"
#include "vemesh/comm/gloo/gloo_communicator.h"

namespace vemesh {
namespace gloo_internal {

// Point-to-point slots. Gloo's collectives use slot prefixes 0x01..0x08 in
// the top byte (gloo/types.h); 0x7e is ours. Every message is a header
// (its byte count) on one slot, then its payload on the next.
constexpr uint64_t kHeaderSlot = uint64_t{0x7e} << 56;
constexpr uint64_t kPayloadSlot = kHeaderSlot + 1;

// Where an empty buffer points: Gloo copies zero bytes from or to it, and a
// null pointer would make even that undefined.
inline char empty_buffer[1];

// All-reduces of at most this many bytes (verdicts, flags, losses) take
// Gloo's bcube algorithm: recursive halving/doubling when the group's size
// is a power of two, log2(n) rounds instead of the ring's 2(n-1) hops one
// after another, whose latency grows linearly with the group
// (docs/ELASTIC.md, "The per-step cost"). Larger ones keep the ring, whose
// bandwidth does not depend on how the size factors.
constexpr size_t kLogDepthAllReduceBytes = 4096;

inline char* Bytes(void* data) {
  return data == nullptr ? empty_buffer : static_cast<char*>(data);
}
inline char* Bytes(const void* data) {
  // Gloo only reads a buffer it sends from.
  return Bytes(const_cast<void*>(data));
}

}  // namespace gloo_internal

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
    header_buffer_->send(peer, gloo_internal::kHeaderSlot);
    if (bytes > 0) {
      payload_ = owner.context_->createUnboundBuffer(gloo_internal::Bytes(data),
                                                     bytes);
      payload_guard_.emplace(owner, payload_.get());
      payload_->send(peer, gloo_internal::kPayloadSlot);
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
    // A copy of its own, not a second reference to the worker's: the Job
    // may be destroyed on the worker thread, and Debian's Abseil (not built
    // with TSan) counts a Status's references where TSan cannot see them,
    // so a shared message freed there read as a race with the caller's
    // reading it. (vemesh sets no Status payloads.)
    const absl::Status& s = job_->status;
    if (s.ok()) return absl::OkStatus();
    return absl::Status(s.code(), std::string(s.message()));
  }
  // After a failure or an abort Gloo's I/O thread may still write into the
  // operation's buffers until the worker has left it (it closes the pairs
  // first): a waiter returns only then, so its caller never frees a buffer
  // Gloo still touches (a TSan report in train_nd's elastic mode).
  bool LeavesOnAbort() const override { return false; }

 private:
  std::shared_ptr<Job> job_;
};

}  // namespace vemesh

#endif  // VEMESH_COMM_GLOO_INTERNAL_GLOO_JOB_H_
