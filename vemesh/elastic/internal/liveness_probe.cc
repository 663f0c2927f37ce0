#include "vemesh/elastic/internal/liveness_probe.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace vemesh {
namespace {

// "HOST:PORT" -> an IPv4 socket address.
bool Resolve(absl::string_view address, sockaddr_in* out) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return false;
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port <= 0 ||
      port > 65535) {
    return false;
  }
  const std::string host(address.substr(0, colon));
  std::memset(out, 0, sizeof(*out));
  out->sin_family = AF_INET;
  out->sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &out->sin_addr) == 1) return true;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) {
    return false;
  }
  out->sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return true;
}

// A non-blocking connect to `address` within `timeout`: the socket, or -1
// with `*refused` set when nobody listens there.
int ConnectWithin(absl::string_view address, absl::Duration timeout,
                  bool* refused) {
  *refused = false;
  sockaddr_in addr;
  if (!Resolve(address, &addr)) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    return fd;
  }
  if (errno == ECONNREFUSED) *refused = true;
  if (errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(timeout));
    if (poll(&p, 1, ms < 1 ? 1 : ms) == 1) {
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err == 0) return fd;
      *refused = err == ECONNREFUSED;
    }
  }
  close(fd);
  return -1;
}

// How long the listener waits for a message after a connection arrives.
constexpr int kMessageWaitMs = 20;
// The listener's bounds: the backlog asked for (the kernel caps it at
// net.core.somaxconn), connections accepted per wake-up, and connections
// whose message is awaited at once.
constexpr int kBacklog = 4096;
constexpr int kMaxAcceptsPerWake = 4096;
constexpr size_t kMaxPendingMessages = 64;

// Every listener address this process opened (a handful per mesh).
std::mutex started_mu;
std::set<std::string>& Started() {
  static auto* started = new std::set<std::string>();
  return *started;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LivenessListener>> LivenessListener::Start(
    const std::string& host, OnMessage on_message) {
  sockaddr_in addr;
  if (!Resolve(absl::StrCat(host, ":1"), &addr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "liveness listener: '", host, "' is not an IPv4 address or name"));
  }
  addr.sin_port = 0;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("liveness listener: socket: ", std::strerror(errno)));
  }
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, kBacklog) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int e = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("liveness listener on ", host, ": ", std::strerror(e)));
  }
  std::unique_ptr<LivenessListener> l(
      new LivenessListener(fd, absl::StrCat(host, ":", ntohs(addr.sin_port)),
                           std::move(on_message)));
  {
    std::lock_guard<std::mutex> lock(started_mu);
    Started().insert(l->address());
  }
  l->thread_ = std::thread([p = l.get()] { p->Run(); });
  return l;
}

LivenessListener::LivenessListener(int fd, std::string address,
                                   OnMessage on_message)
    : fd_(fd),
      address_(std::move(address)),
      on_message_(std::move(on_message)) {}

LivenessListener::~LivenessListener() {
  stop_ = true;
  shutdown(fd_, SHUT_RDWR);  // wakes the accepting thread
  if (thread_.joinable()) thread_.join();
  close(fd_);
}

void LivenessListener::Run() {
  // Connections whose message is still awaited, oldest first: polled
  // together with the listening socket, so that a silent or slow peer
  // holds one slot, never the accepting thread.
  struct Pending {
    int fd = -1;
    absl::Time until;
    size_t got = 0;
    char buf[kMaxListenerMessage];
  };
  std::deque<Pending> pending;
  std::vector<pollfd> fds;
  auto finish = [&](Pending& c) {
    if (c.got > 0) on_message_(absl::string_view(c.buf, c.got));
    close(c.fd);
  };
  while (!stop_) {
    fds.assign(1, pollfd{fd_, POLLIN, 0});
    absl::Time wake = absl::Now() + absl::Milliseconds(200);
    for (const Pending& c : pending) {
      fds.push_back(pollfd{c.fd, POLLIN, 0});
      wake = std::min(wake, c.until);
    }
    const int64_t ms = absl::ToInt64Milliseconds(wake - absl::Now());
    const int ready = poll(fds.data(), fds.size(),
                           static_cast<int>(std::max<int64_t>(ms, 0)));
    if (stop_) break;
    if (ready < 0 && errno != EINTR) poll(nullptr, 0, 10);
    // Every connection waiting in the backlog, not one per wake-up: a
    // flood never leaves a probe to a full backlog (bounded per round so
    // that the pending messages are read too).
    for (int i = 0;
         ready > 0 && (fds[0].revents & POLLIN) != 0 && i < kMaxAcceptsPerWake;
         ++i) {
      const int c =
          accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (c < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          poll(nullptr, 0, 10);  // e.g. out of descriptors: do not spin
        }
        break;
      }
      if (!on_message_) {  // a probe needs nothing but the handshake
        close(c);
        continue;
      }
      if (pending.size() >= kMaxPendingMessages) {
        // The oldest silent connection gives way (a flood of them must not
        // keep the port from the next peer).
        finish(pending.front());
        pending.pop_front();
      }
      pending.emplace_back();
      pending.back().fd = c;
      pending.back().until = absl::Now() + absl::Milliseconds(kMessageWaitMs);
    }
    // Reads what arrived; a peer that closed, filled the bound or ran out
    // of time is done.
    const absl::Time now = absl::Now();
    std::deque<Pending> still;
    for (size_t i = 0; i < pending.size(); ++i) {
      Pending& c = pending[i];
      bool done = now >= c.until;
      const size_t at = i + 1;
      if (at < fds.size() && fds[at].fd == c.fd && fds[at].revents != 0) {
        const ssize_t n =
            recv(c.fd, c.buf + c.got, sizeof(c.buf) - c.got, MSG_DONTWAIT);
        if (n > 0) c.got += static_cast<size_t>(n);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) done = true;
        if (c.got == sizeof(c.buf)) done = true;
      }
      if (done) {
        finish(c);
      } else {
        still.push_back(c);
      }
    }
    pending.swap(still);
  }
  for (Pending& c : pending) close(c.fd);
}

bool ListenerStartedHere(absl::string_view address) {
  std::lock_guard<std::mutex> lock(started_mu);
  return Started().count(std::string(address)) != 0;
}

Liveness ProbeLiveness(absl::string_view address, absl::Duration timeout) {
  bool refused = false;
  const int fd = ConnectWithin(address, timeout, &refused);
  if (fd < 0) return refused ? Liveness::kGone : Liveness::kUnknown;
  close(fd);
  return Liveness::kListening;
}

bool SendToListener(absl::string_view address, absl::string_view text,
                    absl::Duration timeout) {
  if (text.empty() || text.size() > kMaxListenerMessage) return false;
  bool refused = false;
  const int fd = ConnectWithin(address, timeout, &refused);
  if (fd < 0) return false;
  // A few bytes into an empty socket buffer: never blocks.
  const ssize_t n = send(fd, text.data(), text.size(), MSG_NOSIGNAL);
  close(fd);
  return n == static_cast<ssize_t>(text.size());
}

}  // namespace vemesh
