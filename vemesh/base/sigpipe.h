// vemesh/base/sigpipe.h
//
// vemesh's one SIGPIPE policy. A write to a socket whose peer has gone
// raises SIGPIPE, whose default action ends the process; a lost peer must be
// an error (Unavailable) instead, and a library must not change how the
// whole program handles a signal. So:
//
//   - vemesh never changes the process's SIGPIPE disposition (no signal(),
//     no sigaction());
//   - vemesh's own sockets (vemesh/rendezvous/tcp/) send with MSG_NOSIGNAL;
//   - a library that writes with write()/writev() (hiredis, Gloo) is called
//     with SIGPIPE blocked on the calling thread: ScopedSigpipeBlock around
//     the call (a SIGPIPE the call raised is taken off this thread before
//     the old mask comes back), and BlockSigpipeOnThisThread() for a thread
//     that only ever does such I/O. A thread started while SIGPIPE is blocked
//     inherits the block (Gloo's I/O thread, started by its device).
//
//   {
//     ScopedSigpipeBlock no_sigpipe;
//     reply = redisCommand(context, "GET %s", key);  // EPIPE, not SIGPIPE
//   }

#ifndef VEMESH_BASE_SIGPIPE_H_
#define VEMESH_BASE_SIGPIPE_H_

#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <cerrno>

namespace vemesh {

// Blocks SIGPIPE on this thread for the scope; on leaving it, swallows the
// SIGPIPE raised in the scope (if one was not already pending before) and
// restores the thread's mask. errno is preserved across the destructor.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    blocked_ = pthread_sigmask(SIG_BLOCK, &pipe_, &old_) == 0;
  }
  ~ScopedSigpipeBlock() {
    if (!blocked_) return;
    const int saved_errno = errno;
    if (!was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
    errno = saved_errno;
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
  bool blocked_ = false;
};

// Blocks SIGPIPE on this thread for the rest of its life: for a thread that
// vemesh starts and that writes through a library (Gloo's worker). A
// SIGPIPE raised later stays pending on this thread and is never delivered.
inline void BlockSigpipeOnThisThread() {
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
}

}  // namespace vemesh

#endif  // VEMESH_BASE_SIGPIPE_H_
