// vemesh/comm/work.h
//
// A Work is the handle of one asynchronous operation (PyTorch's `Work`, an
// MPI request, an NCCL launch and its CUDA event): it completes once, with a
// final status.
//
//   VEMESH_ASSIGN_OR_RETURN(std::shared_ptr<Work> w,
//                           dp->iall_reduce(absl::MakeSpan(bucket),
//                           ReduceOp::kAvg));
//   ... backward of the next layer ...
//   VEMESH_RETURN_IF_ERROR(w->wait(absl::Now() + absl::Seconds(30)));
//
// - `test()` looks once without blocking: true when the operation finished
//   (then `status()` is its final status).
// - `wait(deadline)` blocks until it finishes, the communicator is aborted,
//   or the deadline passes. Past the deadline it answers DeadlineExceeded and
//   aborts the communicator: an unfinished collective cannot be taken back,
//   so later operations on that communicator would pair with the wrong
//   messages (PyTorch's NCCL watchdog does the same). After `abort()` (from
//   any thread) it answers Aborted at once.
// - The buffers of the operation must stay valid until it completed. After
//   an abort the backend may still hold them (MPI cannot free an unfinished
//   collective request): keep them alive, or end the process.
// - The handle keeps its communicator alive.
//
// One thread at a time may call a Work's methods; `abort()` of the
// communicator may come from any thread.

#ifndef VEMESH_COMM_WORK_H_
#define VEMESH_COMM_WORK_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace vemesh {

class Communicator;

class Work {
 public:
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  virtual ~Work();

  // Blocks until the operation finished (its status), the communicator was
  // aborted (Aborted) or `deadline` passed (DeadlineExceeded; the
  // communicator is then aborted).
  absl::Status wait(absl::Time deadline = absl::InfiniteFuture());
  // One look, never blocks: true once the operation finished.
  bool test();
  // The final status once finished; before that, FailedPrecondition
  // saying the operation is still running.
  absl::Status status() const;
  bool is_completed() const { return done_; }
  // What the operation is, for messages ("all_reduce of 1024 bfloat16").
  const std::string& name() const { return name_; }

 protected:
  // `owner` is the communicator that started the operation (kept alive).
  Work(std::shared_ptr<Communicator> owner, std::string name);

  // Backend hook, one non-blocking look: the final status once the
  // operation finished, nullopt while it runs. Called until it answers once.
  virtual std::optional<absl::Status> Poll() = 0;
  // Whether Poll gives the core away by itself when the host is
  // oversubscribed (MPI_Test does, under Open MPI's mpi_yield_when_idle).
  // Then wait() adds no yields of its own in its first milliseconds: they
  // made every short wait slower than MPI_Wait on shared cores.
  virtual bool PollYields() const { return false; }
  // Whether an abort may end the wait before Poll answers. False for a
  // backend whose threads may still touch the operation's buffers after the
  // abort (Gloo's I/O thread): the wait then lasts until Poll answers, so
  // that the caller never frees a buffer still in use.
  virtual bool LeavesOnAbort() const { return true; }

 private:
  void Finish(absl::Status status);

  std::shared_ptr<Communicator> owner_;
  std::string name_;
  bool done_ = false;
  absl::Status status_;
};

// A Work that finished when it was made (an empty operation, or a backend
// that completed it on the spot).
std::shared_ptr<Work> CompletedWork(std::shared_ptr<Communicator> owner,
                                    std::string name, absl::Status status);

}  // namespace vemesh

#endif  // VEMESH_COMM_WORK_H_
