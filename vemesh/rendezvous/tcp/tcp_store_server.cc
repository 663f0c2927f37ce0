#include "vemesh/rendezvous/tcp/tcp_store_server.h"

#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/rendezvous/memory_store.h"
#include "vemesh/rendezvous/tcp/sha256.h"
#include "vemesh/rendezvous/tcp/socket.h"
#include "vemesh/rendezvous/tcp/wire.h"

namespace vemesh {
namespace {

// epoll user data of the two descriptors that are not connections.
constexpr uint64_t kListenId = 0;
constexpr uint64_t kWakeId = 1;
constexpr uint64_t kFirstConnectionId = 2;

// A connection holds at most one whole largest frame of unparsed input, and
// more than a chunk only once the memory budget admitted it.
constexpr size_t kReadChunkBytes = 64 << 10;
// After accept() ran out of descriptors, try again this often.
constexpr absl::Duration kAcceptRetry = absl::Milliseconds(100);

// A WAIT whose keys are not all set yet. It is parked on one missing key,
// keys[next]; a write to that key moves it on to the next missing one.
struct Waiter {
  std::vector<std::string> keys;
  size_t next = 0;
  absl::Time deadline;
};

struct Connection {
  uint64_t id = 0;
  UniqueFd fd;
  std::string in;  // bytes received, parsed from in_off on
  size_t in_off = 0;
  std::string out;  // reply bytes, sent up to out_off
  size_t out_off = 0;
  uint32_t interest = 0;   // the epoll events registered now
  absl::Time last_active;  // the last byte moved (the idle clock)
  size_t admitted = 0;     // a large frame being received: its admitted size
  size_t discard = 0;      // bytes of a refused frame still to drop
  size_t accounted = 0;    // bytes counted against the memory budget
  bool dead = false;       // closed at the end of this loop turn
  bool queued = false;     // in the ready list
  std::optional<Waiter> waiter;  // a parked WAIT: no request is read meanwhile
  // The handshake (wire.h, HELLO/AUTH).
  std::string server_nonce;  // hex, sent in the HELLO reply
  std::string client_nonce;  // hex, from HELLO
  bool authenticated = false;
  bool owner = false;    // proved the owner secret: rank 0's own client
  int64_t rank = -1;     // the rank it claims (-1: none)
  std::string claim;     // the claimer's nonce
  bool refused = false;  // refused by another store on this port
};

// A rank's claim: who made it, for the conflict message.
struct Claim {
  std::string claim;  // the claimer's nonce
  uint64_t connection = 0;
};

}  // namespace

// Everything the serving thread owns. Only RequestStop() and connections()
// are called from other threads.
class TcpStoreServer::Loop {
 public:
  Loop(UniqueFd listen_fd, UniqueFd epoll_fd, UniqueFd wake_fd,
       TcpStoreServerOptions options, size_t descriptor_limit,
       std::string owner_secret)
      : listen_fd_(std::move(listen_fd)),
        epoll_fd_(std::move(epoll_fd)),
        wake_fd_(std::move(wake_fd)),
        options_(std::move(options)),
        descriptor_limit_(descriptor_limit),
        owner_secret_(std::move(owner_secret)) {}

  void Run();
  void RequestStop() {
    stop_.store(true);
    const uint64_t one = 1;
    // An eventfd write only fails when the counter would overflow, which
    // means a wake-up is already pending.
    (void)!::write(wake_fd_.get(), &one, sizeof(one));
  }
  size_t connections() const { return open_.load(); }

 private:
  void Accept();
  void SetInterest(Connection& c, uint32_t events);
  void OnEvent(uint64_t id, uint32_t events);
  // Reads what the socket has; false at end of stream or on an error.
  bool Read(Connection& c);
  // Answers the complete requests buffered, then sends what it can.
  void Process(Connection& c);
  void Flush(Connection& c);
  void Handle(Connection& c, StoreRequest request);
  // HELLO and AUTH; the refusal of a request the connection may not make.
  void Hello(Connection& c, const StoreRequest& r);
  void Auth(Connection& c, const StoreRequest& r);
  absl::Status Refusal(const Connection& c, const StoreRequest& r) const;
  // Records c's claim of its rank; AlreadyExists (and the conflict key
  // written) when another claimer holds it.
  absl::Status ClaimRank(const Connection& c);
  void RefuseClaim(Connection& c, const absl::Status& status);
  // A HELLO saying its rank was refused by another store on this port:
  // records the conflict and refuses it (true), or false when it says not.
  bool ReportRefusal(Connection& c);
  void Reply(Connection& c, StoreReply reply);
  void ReplyStatus(Connection& c, absl::Status status);
  // A write set `key`: the WAITs parked on it move on or are answered.
  void Notify(const std::string& key);
  size_t FirstMissing(const std::vector<std::string>& keys, size_t from) const;
  void Park(Connection& c, size_t missing);
  void Unpark(Connection& c);
  void ExpireWaits();
  void MakeReady(Connection& c);
  void RunReady();
  void Kill(Connection& c);
  void CloseDead();
  Connection* Find(uint64_t id);
  int EpollTimeoutMillis() const;
  // Exhaustion guards (see tcp_store_server.h).
  void Touch(Connection& c);
  void CloseIdle();
  bool EvictQuiet();
  void RefuseAtCap(UniqueFd fd);
  size_t InputLimit(const Connection& c) const;
  // Large requests and values stop an eighth short of the budget: a flood of
  // them leaves room for the small keys of a rendezvous.
  size_t LargeLimit() const {
    return options_.max_total_bytes - options_.max_total_bytes / 8;
  }
  void Admit(Connection& c);
  void Account(Connection& c);
  void Put(const std::string& key, std::string value);
  std::string BudgetText(size_t request) const;

  UniqueFd listen_fd_;
  UniqueFd epoll_fd_;
  UniqueFd wake_fd_;
  const TcpStoreServerOptions options_;
  const size_t descriptor_limit_;  // RLIMIT_NOFILE; 0: unlimited
  const std::string owner_secret_;
  absl::flat_hash_map<int64_t, Claim> claims_;
  absl::flat_hash_set<std::string> refused_claims_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> open_{0};

  absl::flat_hash_map<std::string, std::string> table_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Connection>> conns_;
  uint64_t next_id_ = kFirstConnectionId;
  // Connection ids of the WAITs parked on each key.
  absl::flat_hash_map<std::string, std::vector<uint64_t>> parked_;
  std::set<std::pair<absl::Time, uint64_t>> deadlines_;
  // Every open connection by its last activity, longest quiet first.
  std::set<std::pair<absl::Time, uint64_t>> activity_;
  size_t table_bytes_ = 0;     // keys and values stored
  size_t buffered_bytes_ = 0;  // connections' accounted buffers
  std::vector<uint64_t> ready_;
  std::vector<uint64_t> dead_;
  std::optional<absl::Time> accept_paused_since_;
  char read_buffer_[kReadChunkBytes];
};

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
        !EvictQuiet()) {
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

size_t TcpStoreServer::Loop::InputLimit(const Connection& c) const {
  // Small requests are read a chunk at a time; a larger frame only once
  // Admit has counted it against the budget.
  return c.admitted > 0 ? c.admitted : kReadChunkBytes;
}

void TcpStoreServer::Loop::Admit(Connection& c) {
  const size_t have = c.in.size() - c.in_off;
  if (c.admitted > 0 || have < kStoreFrameHeaderBytes) return;
  const auto* h =
      reinterpret_cast<const unsigned char*>(c.in.data() + c.in_off);
  const size_t frame =
      kStoreFrameHeaderBytes + (size_t{h[0]} | size_t{h[1]} << 8 |
                                size_t{h[2]} << 16 | size_t{h[3]} << 24);
  if (frame <= kReadChunkBytes) return;
  const size_t others = table_bytes_ + buffered_bytes_ - c.accounted;
  if (others + frame <= LargeLimit()) {
    c.admitted = frame;
    return;
  }
  ReplyStatus(c, absl::ResourceExhaustedError(BudgetText(frame)));
  const size_t dropped = std::min(have, frame);
  c.in_off += dropped;
  c.discard = frame - dropped;
}

std::string TcpStoreServer::Loop::BudgetText(size_t request) const {
  return absl::StrCat(
      "store memory budget exceeded: a request of ", request,
      " bytes on top of ", table_bytes_,
      " bytes of stored keys and values and ", buffered_bytes_,
      " bytes buffered for ", conns_.size(),
      " connections would pass max_total_bytes=", options_.max_total_bytes,
      " (VEMESH_STORE_MAX_BYTES): a flood of large values?");
}

void TcpStoreServer::Loop::Account(Connection& c) {
  const size_t now =
      std::max(c.admitted, c.in.size() - c.in_off) + (c.out.size() - c.out_off);
  buffered_bytes_ = buffered_bytes_ - c.accounted + now;
  c.accounted = now;
}

void TcpStoreServer::Loop::Put(const std::string& key, std::string value) {
  auto [it, inserted] = table_.try_emplace(key);
  if (inserted) {
    table_bytes_ += key.size();
  } else {
    table_bytes_ -= it->second.size();
  }
  table_bytes_ += value.size();
  it->second = std::move(value);
}

void TcpStoreServer::Loop::Touch(Connection& c) {
  activity_.erase({c.last_active, c.id});
  c.last_active = absl::Now();
  activity_.emplace(c.last_active, c.id);
}

void TcpStoreServer::Loop::CloseIdle() {
  const absl::Time now = absl::Now();
  while (!activity_.empty() &&
         activity_.begin()->first + options_.idle_timeout <= now) {
    const uint64_t id = activity_.begin()->second;
    Connection* c = Find(id);
    if (c == nullptr) {
      activity_.erase(activity_.begin());
    } else if (c->waiter || c->queued) {
      Touch(*c);  // a parked WAIT is not idle: its own deadline rules
    } else {
      activity_.erase(activity_.begin());
      Kill(*c);  // idle, or half-open: stopped mid-frame or not reading
    }
  }
}

bool TcpStoreServer::Loop::EvictQuiet() {
  const absl::Time now = absl::Now();
  int looked = 0;
  for (auto it = activity_.begin(); it != activity_.end() && looked < 64;
       ++it, ++looked) {
    if (now - it->first < options_.min_quiet_to_evict) return false;
    Connection* c = Find(it->second);
    if (c == nullptr || c->waiter || c->admitted > 0 ||
        c->in_off != c->in.size() || c->out_off != c->out.size()) {
      continue;
    }
    activity_.erase(it);
    Kill(*c);  // TcpStore reconnects when it finds it closed
    return true;
  }
  return false;
}

void TcpStoreServer::Loop::RefuseAtCap(UniqueFd fd) {
  StoreReply reply;
  reply.code = absl::StatusCode::kResourceExhausted;
  reply.message = absl::StrCat(
      "store server at its connection cap: ", conns_.size() - dead_.size(),
      " connections open (max_connections ", options_.max_connections,
      descriptor_limit_ > 0
          ? absl::StrCat(", under the descriptor limit RLIMIT_NOFILE=",
                         descriptor_limit_)
          : std::string(),
      ") and none quiet for ",
      absl::FormatDuration(options_.min_quiet_to_evict),
      " to make room: a flood of connections? (raise ulimit -n or "
      "VEMESH_STORE_MAX_CONNECTIONS)");
  // The reply answers the client's first request; then the connection is
  // closed after reading what it sent, so that the close is no reset that
  // would discard the reply.
  const std::string frame = EncodeReply(reply);
  (void)!::send(fd.get(), frame.data(), frame.size(),
                MSG_NOSIGNAL | MSG_DONTWAIT);
  ::shutdown(fd.get(), SHUT_WR);
  for (int i = 0; i < 4; ++i) {
    if (::recv(fd.get(), read_buffer_, kReadChunkBytes, MSG_DONTWAIT) <= 0)
      break;
  }
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

absl::Status TcpStoreServer::Loop::Refusal(const Connection& c,
                                           const StoreRequest& r) const {
  if (r.op == StoreOp::kHello || r.op == StoreOp::kAuth) {
    return absl::OkStatus();
  }
  if (!options_.token.empty() && !c.authenticated) {
    return absl::UnauthenticatedError(absl::StrCat(
        "store ", StoreOpName(r.op),
        " refused: this store needs the job's token (VEMESH_STORE_TOKEN) "
        "proved in a HELLO/AUTH handshake first"));
  }
  const bool writes = r.op == StoreOp::kSet || r.op == StoreOp::kAdd ||
                      r.op == StoreOp::kCompareSet || r.op == StoreOp::kRemove;
  if (!writes || c.owner) return absl::OkStatus();
  for (const std::string& suffix : options_.owner_key_suffixes) {
    if (!absl::EndsWith(r.keys[0], suffix)) continue;
    const bool open = (r.op == StoreOp::kSet || r.op == StoreOp::kCompareSet) &&
                      !options_.open_value_prefix.empty() &&
                      absl::StartsWith(r.value, options_.open_value_prefix);
    if (open) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrCat(
        "store ", StoreOpName(r.op), " of '", r.keys[0].substr(0, 128),
        "' refused: only rank 0's own connection may write it (a verdict "
        "made by anybody else is ignored)"));
  }
  return absl::OkStatus();
}

void TcpStoreServer::Loop::Hello(Connection& c, const StoreRequest& r) {
  absl::StatusOr<StoreHello> hello = ParseHelloFields(r.keys);
  if (!hello.ok()) {
    ReplyStatus(c, hello.status());
    return;
  }
  if (!hello->job.empty() && !options_.job.empty() &&
      hello->job != options_.job) {
    ReplyStatus(c, absl::FailedPreconditionError(absl::StrCat(
                       "this store belongs to job '", options_.job,
                       "' but the client is of job '", hello->job,
                       "': two jobs on one MASTER_ADDR:MASTER_PORT; give "
                       "each job its own port")));
    return;
  }
  c.rank = hello->rank;
  c.claim = hello->claim;
  c.refused = hello->refused;
  // With a token, a rank is claimed (or a refusal elsewhere reported)
  // only once the claimer proved it.
  if (options_.token.empty()) {
    if (ReportRefusal(c)) return;
    if (absl::Status claimed = ClaimRank(c); !claimed.ok()) {
      RefuseClaim(c, claimed);
      return;
    }
  }
  c.client_nonce = hello->nonce;
  c.server_nonce = HexText(RandomBytes(16));
  StoreReply reply;
  reply.values.push_back(c.server_nonce);
  reply.values.push_back(
      options_.token.empty()
          ? std::string()
          : HexText(HmacSha256(
                options_.token,
                HelloProofText("server", c.server_nonce, c.client_nonce))));
  reply.values.push_back(options_.job);
  Reply(c, std::move(reply));
}

absl::Status TcpStoreServer::Loop::ClaimRank(const Connection& c) {
  if (c.rank < 0) return absl::OkStatus();
  if (!options_.conflict_key.empty()) {
    // After a conflict, only the claims made before it stand: a late rank
    // of either job hears of the conflict instead of waiting.
    auto conflict = table_.find(options_.conflict_key);
    auto held = claims_.find(c.rank);
    if (conflict != table_.end() &&
        (held == claims_.end() || held->second.claim != c.claim)) {
      return absl::AlreadyExistsError(conflict->second);
    }
  }
  auto [it, fresh] = claims_.try_emplace(c.rank, Claim{c.claim, c.id});
  if ((fresh || it->second.claim == c.claim) &&
      !refused_claims_.contains(c.claim)) {
    return absl::OkStatus();
  }
  const std::string text = absl::StrCat(
      "rank ", c.rank,
      " was claimed twice on this store (two processes say they are rank ",
      c.rank,
      "): two jobs on one MASTER_ADDR:MASTER_PORT, or a rank started twice; "
      "every rank involved fails");
  if (!options_.conflict_key.empty() &&
      !table_.contains(options_.conflict_key)) {
    Put(options_.conflict_key, text);
    Notify(options_.conflict_key);
  }
  return absl::AlreadyExistsError(text);
}

bool TcpStoreServer::Loop::ReportRefusal(Connection& c) {
  if (!c.refused || c.rank < 0) return false;
  if (refused_claims_.contains(c.claim)) {
    // The store that refused it: no news.
    RefuseClaim(c, ClaimRank(c));
    return true;
  }
  const std::string text = absl::StrCat(
      "rank ", c.rank,
      " was refused by another job's store on this port (the rank was "
      "claimed twice there): two jobs on one MASTER_ADDR:MASTER_PORT; "
      "every rank involved fails");
  if (!options_.conflict_key.empty() &&
      !table_.contains(options_.conflict_key)) {
    Put(options_.conflict_key, text);
    Notify(options_.conflict_key);
  }
  RefuseClaim(c, absl::AlreadyExistsError(text));
  return true;
}

void TcpStoreServer::Loop::RefuseClaim(Connection& c,
                                       const absl::Status& status) {
  // The refused claim is remembered: the same claimer is refused again.
  refused_claims_.insert(c.claim);
  StoreReply reply;
  reply.code = status.code();
  reply.message = std::string(status.message());
  reply.values.push_back(options_.job);  // which store refused it
  Reply(c, std::move(reply));
}

void TcpStoreServer::Loop::Auth(Connection& c, const StoreRequest& r) {
  absl::StatusOr<StoreHello> auth = ParseHelloFields(r.keys);
  if (!auth.ok()) {
    ReplyStatus(c, auth.status());
    return;
  }
  if (c.server_nonce.empty()) {
    ReplyStatus(c, absl::FailedPreconditionError(
                       "store AUTH before HELLO: expected HELLO first"));
    return;
  }
  if (!options_.token.empty()) {
    const std::string expected = HexText(
        HmacSha256(options_.token,
                   HelloProofText("client", c.server_nonce, c.client_nonce)));
    if (!ConstantTimeEquals(expected, auth->proof)) {
      c.server_nonce.clear();  // a new HELLO for another try
      ReplyStatus(c, absl::UnauthenticatedError(
                         "store AUTH refused: the proof does not match this "
                         "store's token (VEMESH_STORE_TOKEN differs between "
                         "ranks, or this is another job's store)"));
      return;
    }
  }
  if (!auth->owner.empty()) {
    const std::string expected = HexText(
        HmacSha256(owner_secret_,
                   HelloProofText("owner", c.server_nonce, c.client_nonce)));
    if (!ConstantTimeEquals(expected, auth->owner)) {
      ReplyStatus(c, absl::PermissionDeniedError(
                         "store AUTH refused: the owner proof does not match"));
      return;
    }
    c.owner = true;
  }
  if (!options_.token.empty()) {
    if (ReportRefusal(c)) return;
    if (absl::Status claimed = ClaimRank(c); !claimed.ok()) {
      RefuseClaim(c, claimed);
      return;
    }
  }
  c.authenticated = true;
  c.server_nonce.clear();  // a nonce proves one AUTH only
  Reply(c, StoreReply());
}

void TcpStoreServer::Loop::Handle(Connection& c, StoreRequest r) {
  StoreReply reply;
  if (absl::Status refused = Refusal(c, r); !refused.ok()) {
    ReplyStatus(c, std::move(refused));
    return;
  }
  switch (r.op) {
    case StoreOp::kHello:
      Hello(c, r);
      return;
    case StoreOp::kAuth:
      Auth(c, r);
      return;
    case StoreOp::kSet: {
      auto it = table_.find(r.keys[0]);
      const size_t old = it == table_.end() ? 0 : it->second.size();
      const size_t limit = r.value.size() > kReadChunkBytes
                               ? LargeLimit()
                               : options_.max_total_bytes;
      if (r.value.size() > old &&
          table_bytes_ + (r.value.size() - old) + r.keys[0].size() > limit) {
        ReplyStatus(c, absl::ResourceExhaustedError(
                           absl::StrCat(BudgetText(r.value.size()), " (SET '",
                                        r.keys[0].substr(0, 64), "')")));
        return;
      }
      Put(r.keys[0], std::move(r.value));
      Reply(c, std::move(reply));
      Notify(r.keys[0]);
      return;
    }
    case StoreOp::kGet: {
      size_t bytes = 0;
      for (const std::string& key : r.keys) {
        auto it = table_.find(key);
        if (it != table_.end()) bytes += it->second.size();
      }
      if (bytes > kReadChunkBytes &&
          table_bytes_ + buffered_bytes_ + bytes > LargeLimit()) {
        ReplyStatus(c, absl::ResourceExhaustedError(
                           absl::StrCat(BudgetText(bytes), " (GET reply)")));
        return;
      }
    }
      reply.values.reserve(r.keys.size());
      for (const std::string& key : r.keys) {
        auto it = table_.find(key);
        if (it == table_.end()) {
          ReplyStatus(c, absl::NotFoundError(
                             absl::StrCat("store has no key '", key, "'")));
          return;
        }
        reply.values.push_back(it->second);
      }
      Reply(c, std::move(reply));
      return;
    case StoreOp::kWait: {
      const size_t missing = FirstMissing(r.keys, 0);
      if (missing == r.keys.size()) {
        Reply(c, std::move(reply));
      } else if (r.timeout_ms == 0) {
        ReplyStatus(c, absl::DeadlineExceededError(absl::StrCat(
                           "store keys never set before the deadline: ",
                           MissingKeysText(r.keys, table_))));
      } else {
        c.waiter = Waiter{std::move(r.keys), missing,
                          absl::Now() + absl::Milliseconds(r.timeout_ms)};
        Park(c, missing);
        deadlines_.emplace(c.waiter->deadline, c.id);
      }
      return;
    }
    case StoreOp::kAdd: {
      const std::string& key = r.keys[0];
      auto it = table_.find(key);
      absl::StatusOr<int64_t> current = ParseCounter(
          key, it == table_.end() ? absl::string_view() : it->second);
      if (!current.ok()) {
        ReplyStatus(c, current.status());
        return;
      }
      // Wraps like a two's-complement counter, as MemoryStore does.
      const int64_t value = static_cast<int64_t>(
          static_cast<uint64_t>(*current) + static_cast<uint64_t>(r.delta));
      reply.values.push_back(absl::StrCat(value));
      Put(key, reply.values.back());
      Reply(c, std::move(reply));
      Notify(key);
      return;
    }
    case StoreOp::kCompareSet: {
      const std::string& key = r.keys[0];
      auto it = table_.find(key);
      const absl::string_view current = it == table_.end()
                                            ? absl::string_view()
                                            : absl::string_view(it->second);
      if (current != r.expected) {
        reply.values.emplace_back(current);
        Reply(c, std::move(reply));
        return;
      }
      if (r.value.size() > current.size() &&
          table_bytes_ + (r.value.size() - current.size()) >
              options_.max_total_bytes) {
        ReplyStatus(c, absl::ResourceExhaustedError(absl::StrCat(
                           BudgetText(r.value.size()), " (COMPARE_SET '",
                           key.substr(0, 64), "')")));
        return;
      }
      reply.values.push_back(r.value);
      Put(key, std::move(r.value));
      Reply(c, std::move(reply));
      Notify(key);
      return;
    }
    case StoreOp::kRemove: {
      auto it = table_.find(r.keys[0]);
      const bool found = it != table_.end();
      if (found) {
        table_bytes_ -= it->first.size() + it->second.size();
        table_.erase(it);
      }
      reply.values.push_back(found ? "1" : "0");
      Reply(c, std::move(reply));
      return;
    }
    case StoreOp::kPing:
      Reply(c, std::move(reply));
      return;
  }
}

size_t TcpStoreServer::Loop::FirstMissing(const std::vector<std::string>& keys,
                                          size_t from) const {
  for (size_t i = from; i < keys.size(); ++i) {
    if (!table_.contains(keys[i])) return i;
  }
  return keys.size();
}

void TcpStoreServer::Loop::Park(Connection& c, size_t missing) {
  c.waiter->next = missing;
  parked_[c.waiter->keys[missing]].push_back(c.id);
}

void TcpStoreServer::Loop::Unpark(Connection& c) {
  if (!c.waiter) return;
  auto it = parked_.find(c.waiter->keys[c.waiter->next]);
  if (it != parked_.end()) {
    std::vector<uint64_t>& ids = it->second;
    auto pos = std::find(ids.begin(), ids.end(), c.id);
    if (pos != ids.end()) {
      *pos = ids.back();
      ids.pop_back();
    }
    if (ids.empty()) parked_.erase(it);
  }
  deadlines_.erase({c.waiter->deadline, c.id});
  c.waiter.reset();
}

void TcpStoreServer::Loop::Notify(const std::string& key) {
  auto it = parked_.find(key);
  if (it == parked_.end()) return;
  const std::vector<uint64_t> ids = std::move(it->second);
  parked_.erase(it);
  for (uint64_t id : ids) {
    Connection* c = Find(id);
    if (c == nullptr || !c->waiter) continue;
    Waiter& w = *c->waiter;
    size_t missing = FirstMissing(w.keys, w.next);
    // A REMOVE may have taken back a key passed earlier.
    if (missing == w.keys.size()) missing = FirstMissing(w.keys, 0);
    if (missing < w.keys.size()) {
      Park(*c, missing);
      continue;
    }
    deadlines_.erase({w.deadline, id});
    c->waiter.reset();
    Reply(*c, StoreReply());
    MakeReady(*c);  // it may have more requests buffered; flushes the reply
  }
}

void TcpStoreServer::Loop::ExpireWaits() {
  const absl::Time now = absl::Now();
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    Connection* c = Find(deadlines_.begin()->second);
    if (c == nullptr || !c->waiter) {
      deadlines_.erase(deadlines_.begin());
      continue;
    }
    const std::string missing = MissingKeysText(c->waiter->keys, table_);
    Unpark(*c);
    ReplyStatus(*c,
                absl::DeadlineExceededError(absl::StrCat(
                    "store keys never set before the deadline: ", missing)));
    MakeReady(*c);
  }
}

void TcpStoreServer::Loop::MakeReady(Connection& c) {
  Touch(c);  // a WAIT just answered: not idle while its reply goes out
  if (c.queued) return;
  c.queued = true;
  ready_.push_back(c.id);
}

void TcpStoreServer::Loop::RunReady() {
  // Processing one connection can release WAITs of others: until none left.
  while (!ready_.empty()) {
    const uint64_t id = ready_.back();
    ready_.pop_back();
    Connection* c = Find(id);
    if (c == nullptr) continue;
    c->queued = false;
    Process(*c);
  }
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
