#include "vemesh/elastic/internal/liveness_probe.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

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

}  // namespace

absl::StatusOr<std::unique_ptr<LivenessListener>> LivenessListener::Start(
    const std::string& host) {
  sockaddr_in addr;
  if (!Resolve(absl::StrCat(host, ":1"), &addr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "liveness listener: '", host, "' is not an IPv4 address or name"));
  }
  addr.sin_port = 0;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("liveness listener: socket: ", std::strerror(errno)));
  }
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, 128) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int e = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("liveness listener on ", host, ": ", std::strerror(e)));
  }
  std::unique_ptr<LivenessListener> l(
      new LivenessListener(fd, absl::StrCat(host, ":", ntohs(addr.sin_port))));
  l->thread_ = std::thread([p = l.get()] { p->Run(); });
  return l;
}

LivenessListener::LivenessListener(int fd, std::string address)
    : fd_(fd), address_(std::move(address)) {}

LivenessListener::~LivenessListener() {
  stop_ = true;
  shutdown(fd_, SHUT_RDWR);  // wakes the accepting thread
  if (thread_.joinable()) thread_.join();
  close(fd_);
}

void LivenessListener::Run() {
  while (!stop_) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c >= 0) {
      close(c);
    } else if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
      if (stop_) return;
      poll(nullptr, 0, 10);  // e.g. out of descriptors: do not spin
    }
  }
}

Liveness ProbeLiveness(absl::string_view address, absl::Duration timeout) {
  sockaddr_in addr;
  if (!Resolve(address, &addr)) return Liveness::kUnknown;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Liveness::kUnknown;
  Liveness verdict = Liveness::kUnknown;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    verdict = Liveness::kListening;
  } else if (errno == ECONNREFUSED) {
    verdict = Liveness::kGone;
  } else if (errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(timeout));
    if (poll(&p, 1, ms < 1 ? 1 : ms) == 1) {
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      verdict = err == 0              ? Liveness::kListening
                : err == ECONNREFUSED ? Liveness::kGone
                                      : Liveness::kUnknown;
    }
  }
  close(fd);
  return verdict;
}

}  // namespace vemesh
