// vemesh/rendezvous/tcp/socket.h
//
// The few POSIX socket chores the TCP store's client and server share:
// an owning file descriptor, "host:port" text for error messages, address
// resolution, and turning a deadline into a poll() timeout.
//
//   absl::StatusOr<std::vector<SocketAddress>> addrs =
//       ResolveTcp("127.0.0.1", 29500, /*passive=*/false);
//   UniqueFd fd(::socket(addrs->front().family, SOCK_STREAM, 0));
//   ::poll(&pfd, 1, PollMillis(deadline));  // never past the deadline

#ifndef VEMESH_RENDEZVOUS_TCP_SOCKET_H_
#define VEMESH_RENDEZVOUS_TCP_SOCKET_H_

#include <sys/socket.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace vemesh {

// Owns a file descriptor; closes it when destroyed or reset.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct SocketAddress {
  sockaddr_storage addr{};
  socklen_t len = 0;
  int family = 0;
};

// "10.0.0.7:29500", or "[::1]:29500" for an IPv6 literal.
std::string HostPortText(absl::string_view host, int port);

// strerror, thread safe.
std::string ErrnoText(int err);

// The TCP addresses of host:port. `passive`: for bind(); an empty host then
// means every local address. InvalidArgument for a port outside 0..65535,
// Unavailable when the name does not resolve (it may later: DNS of a pod
// that is still starting).
absl::StatusOr<std::vector<SocketAddress>> ResolveTcp(absl::string_view host,
                                                      int port, bool passive);

absl::Status SetNonBlocking(int fd);
// Requests and replies are small and latency bound: no Nagle delay.
void SetNoDelay(int fd);

// Milliseconds from now to `deadline`, rounded up (so that a poll never
// returns just before it and spins), clamped to 0..INT_MAX.
int PollMillis(absl::Time deadline);

}  // namespace vemesh

#endif  // VEMESH_RENDEZVOUS_TCP_SOCKET_H_
