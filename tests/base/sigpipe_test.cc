// vemesh/base/sigpipe.h: a write to a closed socket under the policy is
// EPIPE, not the end of the process, and the process's SIGPIPE disposition
// is never changed.

#include "vemesh/base/sigpipe.h"

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

#include "gtest/gtest.h"

namespace vemesh {
namespace {

// A connected socket whose peer is closed: writing to it raises SIGPIPE.
int BrokenSocket() {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return -1;
  close(fds[1]);
  return fds[0];
}

bool SigpipeDispositionIsDefault() {
  struct sigaction current = {};
  sigaction(SIGPIPE, nullptr, &current);
  return current.sa_handler == SIG_DFL;
}

bool SigpipePendingHere() {
  sigset_t pending;
  sigemptyset(&pending);
  sigpending(&pending);
  return sigismember(&pending, SIGPIPE) == 1;
}

TEST(Sigpipe, AScopedBlockTurnsTheSignalIntoEpipeAndSwallowsIt) {
  ASSERT_TRUE(SigpipeDispositionIsDefault());
  const int fd = BrokenSocket();
  ASSERT_GE(fd, 0);
  {
    ScopedSigpipeBlock no_sigpipe;
    const char byte = 1;
    errno = 0;
    EXPECT_EQ(write(fd, &byte, 1), -1);
    EXPECT_EQ(errno, EPIPE);
  }
  // Still here, nothing left pending, the disposition untouched.
  EXPECT_FALSE(SigpipePendingHere());
  EXPECT_TRUE(SigpipeDispositionIsDefault());
  close(fd);
}

TEST(Sigpipe, AScopedBlockRestoresTheThreadMaskAndErrno) {
  sigset_t before;
  pthread_sigmask(SIG_SETMASK, nullptr, &before);
  {
    ScopedSigpipeBlock no_sigpipe;
    errno = EAGAIN;
  }
  EXPECT_EQ(errno, EAGAIN);
  sigset_t after;
  pthread_sigmask(SIG_SETMASK, nullptr, &after);
  EXPECT_EQ(sigismember(&before, SIGPIPE), sigismember(&after, SIGPIPE));
}

TEST(Sigpipe, AThreadStartedUnderTheBlockInheritsIt) {
  const int fd = BrokenSocket();
  ASSERT_GE(fd, 0);
  int error = 0;
  {
    ScopedSigpipeBlock no_sigpipe;  // as around Gloo's CreateDevice
    std::thread io([&] {
      const char byte = 1;
      if (write(fd, &byte, 1) < 0) error = errno;
    });
    io.join();
  }
  EXPECT_EQ(error, EPIPE);
  EXPECT_TRUE(SigpipeDispositionIsDefault());
  close(fd);
}

TEST(Sigpipe, BlockSigpipeOnThisThreadLastsForTheThread) {
  const int fd = BrokenSocket();
  ASSERT_GE(fd, 0);
  int error = 0;
  std::thread worker([&] {
    BlockSigpipeOnThisThread();
    const char byte = 1;
    if (write(fd, &byte, 1) < 0) error = errno;
    if (write(fd, &byte, 1) < 0) error = errno;  // and again
  });
  worker.join();
  EXPECT_EQ(error, EPIPE);
  EXPECT_TRUE(SigpipeDispositionIsDefault());
  close(fd);
}

}  // namespace
}  // namespace vemesh
