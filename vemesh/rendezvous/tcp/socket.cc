#include "vemesh/rendezvous/tcp/socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <climits>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace vemesh {
namespace {

// strerror_r is the GNU variant (returns the text) or the XSI one (fills
// the buffer); overloads pick whichever this libc declares.
[[maybe_unused]] const char* StrerrorResult(int /*xsi*/, const char* buf) {
  return buf;
}
[[maybe_unused]] const char* StrerrorResult(const char* gnu,
                                            const char* /*buf*/) {
  return gnu;
}

}  // namespace

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string HostPortText(absl::string_view host, int port) {
  if (absl::StrContains(host, ':')) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host.empty() ? "*" : host, ":", port);
}

std::string ErrnoText(int err) {
  char buf[256] = {};
  return StrerrorResult(::strerror_r(err, buf, sizeof(buf)), buf);
}

absl::StatusOr<std::vector<SocketAddress>> ResolveTcp(absl::string_view host,
                                                      int port, bool passive) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store port ", port, " for host '", host, "': expected 0..65535"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  const std::string host_text(host);
  const std::string port_text = std::to_string(port);
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host_text.empty() ? nullptr : host_text.c_str(),
                               port_text.c_str(), &hints, &found);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot resolve store address ", HostPortText(host, port), ": ",
        rc == EAI_SYSTEM ? ErrnoText(errno) : gai_strerror(rc)));
  }
  std::vector<SocketAddress> out;
  for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_addrlen > sizeof(sockaddr_storage)) continue;
    SocketAddress address;
    std::memcpy(&address.addr, ai->ai_addr, ai->ai_addrlen);
    address.len = ai->ai_addrlen;
    address.family = ai->ai_family;
    out.push_back(address);
  }
  ::freeaddrinfo(found);
  if (out.empty()) {
    return absl::UnavailableError(absl::StrCat("store address ",
                                               HostPortText(host, port),
                                               " resolves to no TCP address"));
  }
  return out;
}

absl::Status SetNonBlocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return absl::InternalError(
        absl::StrCat("cannot make socket non-blocking: ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

void SetNoDelay(int fd) {
  const int one = 1;
  // Best effort: a socket without it still works, only slower.
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int PollMillis(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  const int64_t ms =
      absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)));
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

}  // namespace vemesh
