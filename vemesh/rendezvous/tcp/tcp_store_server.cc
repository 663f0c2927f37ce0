// TcpStoreServer and its serving loop: listen, accept, read, parse, reply
// and close, on one epoll thread. Admission, authentication and the
// requests themselves: tcp_store_admission.cc, tcp_store_auth.cc,
// tcp_store_requests.cc.

#include "vemesh/rendezvous/tcp/tcp_store_server.h"

#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/rendezvous/tcp/internal/store_server_loop.h"
#include "vemesh/rendezvous/tcp/sha256.h"
#include "vemesh/rendezvous/tcp/socket.h"
#include "vemesh/rendezvous/tcp/wire.h"

namespace vemesh {

using tcp_server_internal::kAcceptRetry;
using tcp_server_internal::kListenId;
using tcp_server_internal::kWakeId;

Connection* TcpStoreServer::Loop::Find(uint64_t id) {
  auto it = conns_.find(id);
  if (it == conns_.end() || it->second->dead) return nullptr;
  return it->second.get();
}

int TcpStoreServer::Loop::EpollTimeoutMillis() const {
  std::optional<absl::Time> wake;
  if (!deadlines_.empty()) wake = deadlines_.begin()->first;
  if (!activity_.empty()) {
    const absl::Time idle = activity_.begin()->first + options_.idle_timeout;
    if (!wake || idle < *wake) wake = idle;
  }
  if (accept_paused_since_) {
    const absl::Time retry = *accept_paused_since_ + kAcceptRetry;
    if (!wake || retry < *wake) wake = retry;
  }
  if (!wake) return -1;
  return PollMillis(*wake);
}

void TcpStoreServer::Loop::Run() {
  std::vector<epoll_event> events(256);
  while (!stop_.load()) {
    const int n =
        ::epoll_wait(epoll_fd_.get(), events.data(),
                     static_cast<int>(events.size()), EpollTimeoutMillis());
    if (n < 0) {
      if (errno == EINTR) continue;
      break;  // the epoll descriptor itself is broken: nothing to serve with
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == kWakeId) {
        uint64_t count = 0;
        (void)!::read(wake_fd_.get(), &count, sizeof(count));
      } else if (id == kListenId) {
        Accept();
      } else {
        OnEvent(id, events[i].events);
      }
    }
    if (accept_paused_since_ &&
        absl::Now() - *accept_paused_since_ >= kAcceptRetry) {
      accept_paused_since_.reset();
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = kListenId;
      ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, listen_fd_.get(), &ev);
    }
    ExpireWaits();
    CloseIdle();
    RunReady();
    CloseDead();
  }
  // Stopping: every client sees its connection close, and a client that
  // connects later is refused rather than left unanswered in the backlog.
  conns_.clear();
  open_.store(0);
  listen_fd_.reset();
}

void TcpStoreServer::Loop::Accept() {
  for (;;) {
    const int fd = ::accept4(listen_fd_.get(), nullptr, nullptr,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        // Out of descriptors: the pending connection would make the
        // level-triggered listen socket fire forever. Stop listening for a
        // moment; closing connections frees descriptors meanwhile.
        epoll_event ev{};
        ev.data.u64 = kListenId;
        ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, listen_fd_.get(), &ev);
        accept_paused_since_ = absl::Now();
      }
      return;  // EAGAIN: none left; anything else: try on the next event
    }
    UniqueFd owned(fd);
    if (conns_.size() - dead_.size() >= options_.max_connections &&
        !EvictUnproven() && !EvictQuiet()) {
      RefuseAtCap(std::move(owned));
      continue;
    }
    SetNoDelay(fd);
    auto c = std::make_unique<Connection>();
    c->id = next_id_++;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = c->id;
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) continue;
    c->interest = ev.events;
    c->fd = std::move(owned);
    c->accepted = absl::Now();
    unproven_.emplace(c->accepted, c->id);
    Touch(*c);
    conns_.emplace(c->id, std::move(c));
    open_.store(conns_.size());
  }
}

void TcpStoreServer::Loop::SetInterest(Connection& c, uint32_t events) {
  if (c.dead || c.interest == events) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = c.id;
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev) != 0) {
    Kill(c);
    return;
  }
  c.interest = events;
}

void TcpStoreServer::Loop::OnEvent(uint64_t id, uint32_t events) {
  Connection* c = Find(id);
  if (c == nullptr) return;
  bool open = true;
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) open = Read(*c);
  // Requests that arrived whole before the end of the stream are still
  // served (a client may set a key and hang up).
  Process(*c);
  // EPOLLHUP/EPOLLERR with reading switched off would fire forever.
  if (!open || (events & (EPOLLHUP | EPOLLERR))) Kill(*c);
}

bool TcpStoreServer::Loop::Read(Connection& c) {
  for (;;) {
    const size_t have = c.in.size() - c.in_off;
    const size_t limit = InputLimit(c);
    if (c.discard == 0 && have >= limit) break;
    // A refused frame's bytes are read and dropped, never buffered.
    const size_t want =
        std::min(kReadChunkBytes, c.discard > 0 ? c.discard : limit - have);
    const ssize_t n = ::recv(c.fd.get(), read_buffer_, want, 0);
    if (n > 0) {
      Touch(c);
      if (c.discard > 0) {
        c.discard -= static_cast<size_t>(n);
      } else {
        c.in.append(read_buffer_, static_cast<size_t>(n));
      }
      if (static_cast<size_t>(n) < want) return true;  // drained for now
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
  return true;  // full: reading resumes once requests are consumed
}

void TcpStoreServer::Loop::Process(Connection& c) {
  while (!c.dead && !c.waiter &&
         c.out.size() - c.out_off < options_.max_pending_reply_bytes) {
    if (c.discard > 0) break;
    ParsedRequest p = ParseRequest(absl::string_view(c.in).substr(c.in_off));
    if (p.outcome == ParsedRequest::kIncomplete) {
      Admit(c);  // a large frame: counted against the budget, or refused
      if (c.discard > 0 || c.admitted > 0 || c.in_off == c.in.size()) break;
      if (c.in.size() - c.in_off < kReadChunkBytes) break;
      continue;  // refused whole: the next frame follows
    }
    if (p.outcome == ParsedRequest::kMalformed) {
      // Nothing after a malformed frame can be framed: drop the client.
      Kill(c);
      return;
    }
    c.in_off += p.consumed;
    c.admitted = 0;
    Handle(c, std::move(p.message));
  }
  // Consumed input is dropped once it is at least half the buffer, so each
  // byte is moved a bounded number of times.
  if (c.in_off == c.in.size()) {
    c.in.clear();
    c.in_off = 0;
    if (c.in.capacity() > kReadChunkBytes * 4) std::string().swap(c.in);
  } else if (c.in_off > c.in.size() / 2) {
    c.in.erase(0, c.in_off);
    c.in_off = 0;
  }
  Flush(c);
  Account(c);
  if (c.dead) return;
  uint32_t interest = 0;
  if (c.discard > 0 || c.in.size() - c.in_off < InputLimit(c)) {
    interest |= EPOLLIN | EPOLLRDHUP;
  }
  if (c.out_off < c.out.size()) interest |= EPOLLOUT;
  SetInterest(c, interest);
}

void TcpStoreServer::Loop::Flush(Connection& c) {
  while (!c.dead && c.out_off < c.out.size()) {
    const ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_off,
                             c.out.size() - c.out_off, MSG_NOSIGNAL);
    if (n >= 0) {
      c.out_off += static_cast<size_t>(n);
      if (n > 0) Touch(c);
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return;
    } else {
      Kill(c);  // the client is gone
      return;
    }
  }
  c.out.clear();
  c.out_off = 0;
  if (c.out.capacity() > options_.max_pending_reply_bytes)
    std::string().swap(c.out);
}

void TcpStoreServer::Loop::Reply(Connection& c, StoreReply reply) {
  c.out += EncodeReply(reply);
}

void TcpStoreServer::Loop::ReplyStatus(Connection& c, absl::Status status) {
  StoreReply reply;
  reply.code = status.code();
  reply.message = std::string(status.message());
  Reply(c, std::move(reply));
}

void TcpStoreServer::Loop::Kill(Connection& c) {
  if (c.dead) return;
  Unpark(c);
  c.dead = true;
  dead_.push_back(c.id);
}

void TcpStoreServer::Loop::CloseDead() {
  for (uint64_t id : dead_) {
    auto it = conns_.find(id);
    if (it == conns_.end()) continue;
    buffered_bytes_ -= it->second->accounted;
    activity_.erase({it->second->last_active, id});
    unproven_.erase({it->second->accepted, id});
    // Closing the descriptor also removes it from the epoll set.
    conns_.erase(it);
  }
  dead_.clear();
  open_.store(conns_.size());
}

TcpStoreServer::TcpStoreServer(std::string host, int port,
                               std::unique_ptr<Loop> loop)
    : host_(std::move(host)), port_(port), loop_(std::move(loop)) {}

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(
    absl::string_view host, int port, TcpStoreServerOptions options) {
  VEMESH_ASSIGN_OR_RETURN(std::vector<SocketAddress> addresses,
                          ResolveTcp(host, port, /*passive=*/true));
  const std::string where = HostPortText(host, port);
  UniqueFd listen_fd;
  std::string last_error = "no address to bind";
  for (const SocketAddress& address : addresses) {
    UniqueFd fd(::socket(address.family,
                         SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid()) {
      last_error = absl::StrCat("socket: ", ErrnoText(errno));
      continue;
    }
    // A restarted job can rebind while the old sockets sit in TIME_WAIT.
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address.addr),
               address.len) != 0) {
      if (errno == EADDRINUSE) {
        return absl::AlreadyExistsError(absl::StrCat(
            "store server cannot listen on ", where,
            ": address already in use: expected a free port (another job or "
            "store server holds this one), or port 0 for any free port"));
      }
      last_error = absl::StrCat("bind: ", ErrnoText(errno));
      continue;
    }
    if (::listen(fd.get(), 65535) != 0) {  // the kernel caps it at somaxconn
      last_error = absl::StrCat("listen: ", ErrnoText(errno));
      continue;
    }
    listen_fd = std::move(fd);
    break;
  }
  if (!listen_fd.valid()) {
    return absl::UnavailableError(absl::StrCat("store server cannot listen on ",
                                               where, ": ", last_error));
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  if (::getsockname(listen_fd.get(), reinterpret_cast<sockaddr*>(&bound),
                    &bound_len) != 0) {
    return absl::InternalError(absl::StrCat(
        "store server on ", where, ": getsockname: ", ErrnoText(errno)));
  }
  const int bound_port =
      bound.ss_family == AF_INET6
          ? ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port)
          : ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);

  UniqueFd epoll_fd(::epoll_create1(EPOLL_CLOEXEC));
  UniqueFd wake_fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!epoll_fd.valid() || !wake_fd.valid()) {
    return absl::InternalError(absl::StrCat(
        "store server on ", where, ": epoll/eventfd: ", ErrnoText(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenId;
  const bool listen_added =
      ::epoll_ctl(epoll_fd.get(), EPOLL_CTL_ADD, listen_fd.get(), &ev) == 0;
  ev.data.u64 = kWakeId;
  if (!listen_added ||
      ::epoll_ctl(epoll_fd.get(), EPOLL_CTL_ADD, wake_fd.get(), &ev) != 0) {
    return absl::InternalError(absl::StrCat("store server on ", where,
                                            ": epoll_ctl: ", ErrnoText(errno)));
  }
  // The cap stays under the descriptor limit, leaving a quarter of it (at
  // least 32) to the rest of the process: accept() never runs out first.
  size_t descriptor_limit = 0;
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 &&
      limit.rlim_cur != RLIM_INFINITY) {
    descriptor_limit = static_cast<size_t>(limit.rlim_cur);
    const size_t reserve = std::max<size_t>(32, descriptor_limit / 4);
    const size_t room = descriptor_limit > 2 * reserve
                            ? descriptor_limit - reserve
                            : std::max<size_t>(descriptor_limit / 2, 1);
    options.max_connections = std::min(options.max_connections, room);
  }
  options.max_connections = std::max<size_t>(options.max_connections, 1);
  const size_t max_connections = options.max_connections;
  std::string owner_secret = RandomBytes(32);
  auto loop = std::make_unique<Loop>(std::move(listen_fd), std::move(epoll_fd),
                                     std::move(wake_fd), std::move(options),
                                     descriptor_limit, owner_secret);
  std::unique_ptr<TcpStoreServer> server(
      new TcpStoreServer(std::string(host), bound_port, std::move(loop)));
  server->max_connections_ = max_connections;
  server->owner_secret_ = std::move(owner_secret);
  Loop* raw = server->loop_.get();
  server->thread_ = std::thread([raw] { raw->Run(); });
  return server;
}

TcpStoreServer::~TcpStoreServer() { Stop(); }

size_t TcpStoreServer::connections() const {
  return loop_ == nullptr ? 0 : loop_->connections();
}

void TcpStoreServer::Stop() {
  if (!thread_.joinable()) return;
  loop_->RequestStop();
  thread_.join();
}

}  // namespace vemesh
