// TcpStoreServer's exhaustion guards: a large frame admitted against the
// memory budget or refused, idle and quiet connections closed, a
// connection over the cap refused (tcp_store_server.h).

#include <sys/socket.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "vemesh/rendezvous/tcp/internal/store_server_loop.h"
#include "vemesh/rendezvous/tcp/wire.h"

namespace vemesh {

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

bool TcpStoreServer::Loop::EvictUnproven() {
  // Not "quiet": a peer trickling a byte a second is still no rank. A
  // parked WAIT (a plain client of a store without a token) is kept.
  const absl::Time now = absl::Now();
  int looked = 0;
  for (auto it = unproven_.begin(); it != unproven_.end() && looked < 64;
       ++looked) {
    if (now - it->first < options_.handshake_bound) return false;
    Connection* c = Find(it->second);
    if (c == nullptr) {
      it = unproven_.erase(it);
      continue;
    }
    if (c->waiter || c->authenticated) {
      ++it;
      continue;
    }
    unproven_.erase(it);
    Kill(*c);
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
      " or unauthenticated for ",
      absl::FormatDuration(options_.handshake_bound),
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

}  // namespace vemesh
