// GlooCommunicator's queue and worker: operations issued on any thread,
// run in order on one worker thread, and abort. The rest of the class:
// gloo_connect.cc, gloo_subgroups.cc, gloo_agreement.cc,
// gloo_collectives.cc, gloo_p2p.cc.

#include "vemesh/comm/gloo/gloo_communicator.h"

#include <climits>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "vemesh/base/sigpipe.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/gloo/internal/gloo_error.h"
#include "vemesh/comm/gloo/internal/gloo_job.h"
#include "vemesh/comm/gloo/internal/shm_group.h"

namespace vemesh {

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
      context_(std::move(context)),
      sent_(static_cast<size_t>(size)),
      received_(static_cast<size_t>(size)),
      tcp_before_(static_cast<size_t>(size), -1) {
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
  if (shm_ != nullptr) shm_->Leave();
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
    absl::Status shm_failed;
    status = RunGloo(absl::StrCat("gloo ", name), [&] {
      if (op.kind == OpKind::kBatch) {
        result = RunBatch(job, &shm_failed);
        return;
      }
      if (!shm_tried_) SetUpShm();
      bool finished = false;
      if (shm_ != nullptr) {
        // The check, and a small operation whole, on shared memory.
        shm_failed = ShmRound(op, &result, &finished);
        if (!shm_failed.ok()) return;
      } else {
        result = CheckAgreement(op);  // a mismatch breaks nothing
      }
      if (result.ok() && !finished) RunCollective(op);
    });
    if (status.ok() && !shm_failed.ok()) {
      status = absl::Status(shm_failed.code(),
                            absl::StrCat("gloo ", name, " (shared memory): ",
                                         shm_failed.message()));
    }
  }
  if (status.ok()) return result;
  // An abort that closed the connections under the operation made it fail.
  if (aborted()) return AbortedError(name);
  broken_ = status;
  if (shm_ != nullptr) shm_->Leave();
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
  if (gloo_internal::ShmGroup* shm = shm_shared_.load()) shm->Leave();
  if (!connected_.load()) return;  // a lazy world with no pairs yet
  RunGloo("close", [&] { context_->closeConnections(); }).IgnoreError();
}

}  // namespace vemesh
