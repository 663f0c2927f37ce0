#include "vemesh/rendezvous/tcp/tcp_store.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/rendezvous/internal/keys_text.h"
#include "vemesh/rendezvous/tcp/sha256.h"

namespace vemesh {
namespace {

constexpr size_t kRecvChunkBytes = 64 << 10;

// One connection attempt to each address in turn, bounded by `deadline`.
absl::StatusOr<UniqueFd> ConnectOnce(
    const std::vector<SocketAddress>& addresses, absl::Time deadline) {
  std::string error = "no address";
  for (const SocketAddress& address : addresses) {
    UniqueFd fd(::socket(address.family,
                         SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid()) {
      error = absl::StrCat("socket: ", ErrnoText(errno));
      continue;
    }
    int rc =
        ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address.addr),
                  address.len);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd pfd{fd.get(), POLLOUT, 0};
      do {
        rc = ::poll(&pfd, 1, PollMillis(deadline));
      } while (rc < 0 && errno == EINTR);
      if (rc == 0) {
        error = "connection timed out";
        continue;
      }
      int so_error = 0;
      socklen_t len = sizeof(so_error);
      if (rc < 0 ||
          ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) {
        so_error = errno;
      }
      if (so_error != 0) {
        error = ErrnoText(so_error);
        continue;
      }
    } else if (rc != 0) {
      error = ErrnoText(errno);
      continue;
    }
    SetNoDelay(fd.get());
    return fd;
  }
  return absl::UnavailableError(error);
}

using rendezvous_internal::KeysText;

StoreRequest KeyRequest(StoreOp op, absl::string_view key) {
  StoreRequest r;
  r.op = op;
  r.keys.emplace_back(key);
  return r;
}

StoreRequest KeysRequest(StoreOp op, absl::Span<const std::string> keys,
                         absl::Time deadline) {
  StoreRequest r;
  r.op = op;
  r.keys.assign(keys.begin(), keys.end());
  if (op == StoreOp::kWait) {
    const absl::Duration left =
        std::max(deadline - absl::Now(), absl::ZeroDuration());
    r.timeout_ms =
        absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)));
  }
  return r;
}

}  // namespace

TcpStore::TcpStore(std::string host, int port, TcpStoreOptions options,
                   UniqueFd fd)
    : host_(std::move(host)),
      port_(port),
      options_(options),
      fd_(std::move(fd)) {}

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Connect(
    absl::string_view host, int port, absl::Time deadline,
    TcpStoreOptions options) {
  if (port < 1 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("store server port ", port,
                                                   " for host '", host,
                                                   "': expected 1..65535"));
  }
  // The server may not be up yet: back off from 10 ms to 500 ms between
  // attempts, the last one cut to the deadline.
  absl::Duration backoff = absl::Milliseconds(10);
  std::string last_error;
  absl::Status refusal;        // another job's store answered
  absl::Status claim_refused;  // our rank was claimed by another
  std::string refusing_job;
  int attempts = 0;
  for (;;) {
    ++attempts;
    absl::StatusOr<std::vector<SocketAddress>> addresses =
        ResolveTcp(host, port, /*passive=*/false);
    if (addresses.ok()) {
      absl::StatusOr<UniqueFd> fd = ConnectOnce(*addresses, deadline);
      if (fd.ok()) {
        if (options.rank >= 0 && options.claim.empty()) {
          options.claim = HexText(RandomBytes(16));
        }
        std::unique_ptr<TcpStore> store(
            new TcpStore(std::string(host), port, options, *std::move(fd)));
        // A rank refused by another store on this port (its rank claimed
        // twice there) keeps trying until the deadline: should that store
        // go and another take the port (its own job's rank 0, late), it
        // tells that one, so that its job fails naming the conflict
        // instead of waiting for this rank.
        absl::Status shook;
        std::string job;
        {
          std::lock_guard<std::mutex> lock(store->mu_);
          shook =
              store->Handshake(deadline, /*refused=*/!claim_refused.ok(), &job);
        }
        if (!claim_refused.ok()) {
          if (shook.ok() || job != refusing_job) return claim_refused;
        } else if (absl::IsAlreadyExists(shook) && !options.token.empty()) {
          // With a token the claim was refused after the store proved it:
          // our own job's store (it failed the job): no other will come.
          return shook;
        } else if (absl::IsAlreadyExists(shook)) {
          claim_refused = shook;
          refusing_job = job;
        } else if (shook.ok()) {
          return store;
        } else if (absl::IsResourceExhausted(shook)) {
          // The store is at its connection cap: room is made as unproven
          // or quiet connections give way; try again.
        } else if (absl::IsFailedPrecondition(shook) ||
                   absl::IsUnauthenticated(shook)) {
          // Another job's store (or one with another token): ours may take
          // the port once it ends.
          refusal = shook;
        } else if (!absl::IsUnavailable(shook) &&
                   !absl::IsDeadlineExceeded(shook)) {
          // Our own token refused, a malformed handshake: final.
          return shook;
        }
        last_error = std::string(shook.message());
      } else {
        last_error = std::string(fd.status().message());
      }
    } else {
      last_error = std::string(addresses.status().message());
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    absl::SleepFor(std::min(backoff, left));
    backoff = std::min(backoff * 2, absl::Milliseconds(500));
  }
  if (!claim_refused.ok()) return claim_refused;
  if (!refusal.ok()) return refusal;
  return absl::UnavailableError(absl::StrCat(
      "cannot reach the store server at ", HostPortText(host, port),
      " before the deadline (", attempts, " attempts): ", last_error,
      ": expected rank 0's server listening there (MASTER_ADDR:MASTER_PORT)"));
}

void TcpStore::Drop() {
  fd_.reset();
  rx_.clear();
}

absl::Status TcpStore::Send(absl::string_view bytes, absl::Time deadline) {
  while (!bytes.empty()) {
    // MSG_NOSIGNAL: a server that went away is an error, not a SIGPIPE.
    const ssize_t n =
        ::send(fd_.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n >= 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      const int err = errno;
      Drop();
      return absl::UnavailableError(absl::StrCat(
          "store server ", Where(), " is gone: send: ", ErrnoText(err)));
    }
    pollfd pfd{fd_.get(), POLLOUT, 0};
    const int rc = ::poll(&pfd, 1, PollMillis(deadline));
    if (rc == 0) {
      Drop();
      return absl::DeadlineExceededError(
          absl::StrCat("store server ", Where(),
                       " took no request bytes before the deadline"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StoreReply> TcpStore::Receive(absl::Time deadline) {
  char buffer[kRecvChunkBytes];
  for (;;) {
    ParsedReply p = ParseReply(rx_);
    if (p.outcome == ParsedReply::kComplete) {
      rx_.erase(0, p.consumed);
      return std::move(p.message);
    }
    if (p.outcome == ParsedReply::kMalformed) {
      Drop();
      return absl::UnavailableError(absl::StrCat(
          "store server ", Where(), " sent a malformed reply (", p.error,
          "): expected a vemesh TcpStoreServer on that port"));
    }
    pollfd pfd{fd_.get(), POLLIN, 0};
    const int rc = ::poll(&pfd, 1, PollMillis(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) {
      Drop();
      return absl::DeadlineExceededError(absl::StrCat(
          "store server ", Where(), " did not reply before the deadline"));
    }
    const ssize_t n = ::recv(fd_.get(), buffer, sizeof(buffer), 0);
    if (n > 0) {
      rx_.append(buffer, static_cast<size_t>(n));
    } else if (n == 0) {
      Drop();
      return absl::UnavailableError(
          absl::StrCat("store server ", Where(),
                       " closed the connection (stopped or crashed)"));
    } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      const int err = errno;
      Drop();
      return absl::UnavailableError(absl::StrCat(
          "store server ", Where(), " is gone: recv: ", ErrnoText(err)));
    }
  }
}

absl::Status TcpStore::Handshake(absl::Time deadline, bool refused,
                                 std::string* server_job) {
  const TcpStoreOptions& o = options_;
  if (o.token.empty() && o.job.empty() && o.rank < 0 &&
      o.owner_secret.empty()) {
    return absl::OkStatus();
  }
  StoreHello hello;
  hello.job = o.job;
  hello.rank = o.rank;
  hello.claim = o.claim;
  hello.nonce = HexText(RandomBytes(16));
  hello.refused = refused;
  StoreRequest request;
  request.op = StoreOp::kHello;
  request.keys = HelloFields(hello);
  VEMESH_ASSIGN_OR_RETURN(std::string frame, EncodeRequest(request));
  VEMESH_RETURN_IF_ERROR(Send(frame, deadline));
  VEMESH_ASSIGN_OR_RETURN(StoreReply reply, Receive(deadline));
  auto refusal = [&](const absl::Status& status) {
    Drop();
    return absl::Status(status.code(), absl::StrCat("store server ", Where(),
                                                    " refused this client: ",
                                                    status.message()));
  };
  if (server_job != nullptr && !reply.values.empty()) {
    *server_job = reply.values.back();
  }
  if (!ReplyStatus(reply).ok()) return refusal(ReplyStatus(reply));
  if (reply.values.size() != 3) {
    return refusal(absl::UnavailableError(
        "its HELLO reply is malformed: expected a nonce, a proof and a job"));
  }
  const std::string& server_nonce = reply.values[0];
  // A server that cannot prove our token (or proves one we do not have) is
  // not trusted; a client that claims a rank still sends its AUTH, so that
  // the store can tell its job that this rank's proof failed (issue 44:
  // every rank then hears of it at once, not after its timeout).
  bool server_proved = reply.values[1].empty();
  if (!o.token.empty()) {
    const std::string expected = HexText(HmacSha256(
        o.token, HelloProofText("server", server_nonce, hello.nonce)));
    server_proved = ConstantTimeEquals(expected, reply.values[1]);
  }
  const absl::Status unproved = absl::UnauthenticatedError(
      o.token.empty()
          ? "it needs a token (VEMESH_STORE_TOKEN) and this client has none"
          : "it does not know this job's token (VEMESH_STORE_TOKEN): another "
            "job's store, or the ranks were given different tokens");
  if (!server_proved && o.rank < 0) return refusal(unproved);
  StoreHello auth;
  if (!o.token.empty()) {
    auth.proof = HexText(HmacSha256(
        o.token, HelloProofText("client", server_nonce, hello.nonce)));
  }
  if (!o.owner_secret.empty()) {
    auth.owner = HexText(HmacSha256(
        o.owner_secret, HelloProofText("owner", server_nonce, hello.nonce)));
  }
  request.op = StoreOp::kAuth;
  request.keys = HelloFields(auth);
  VEMESH_ASSIGN_OR_RETURN(frame, EncodeRequest(request));
  VEMESH_RETURN_IF_ERROR(Send(frame, deadline));
  VEMESH_ASSIGN_OR_RETURN(reply, Receive(deadline));
  if (!ReplyStatus(reply).ok()) return refusal(ReplyStatus(reply));
  if (!server_proved) return refusal(unproved);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<StoreReply>> TcpStore::Call(
    absl::Span<const StoreRequest> requests, absl::Time deadline) {
  std::string frames;
  for (const StoreRequest& request : requests) {
    absl::StatusOr<std::string> frame = EncodeRequest(request);
    if (!frame.ok()) return frame.status();  // nothing sent
    frames += *frame;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_.valid() && rx_.empty()) {
    // The server closes a connection left idle (or makes room at its cap
    // with it): found closed between calls, it is reopened, nothing lost.
    char byte = 0;
    const ssize_t n = ::recv(fd_.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 ||
        (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      Drop();
    }
  }
  if (!fd_.valid()) {
    // The connection was lost: one attempt, no retries, so that calls to a
    // dead server fail fast.
    absl::StatusOr<std::vector<SocketAddress>> addresses =
        ResolveTcp(host_, port_, /*passive=*/false);
    absl::StatusOr<UniqueFd> fd =
        addresses.ok() ? ConnectOnce(*addresses, deadline)
                       : absl::StatusOr<UniqueFd>(addresses.status());
    if (!fd.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "store server ", Where(),
          " is unreachable after a lost connection: ", fd.status().message()));
    }
    fd_ = *std::move(fd);
    VEMESH_RETURN_IF_ERROR(Handshake(deadline));
  }
  VEMESH_RETURN_IF_ERROR(Send(frames, deadline));
  std::vector<StoreReply> replies;
  replies.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    absl::StatusOr<StoreReply> reply = Receive(deadline);
    if (!reply.ok()) {
      // A server that refused a request (at its cap, over its budget) and
      // then closed: its refusal says more than the close.
      if (!replies.empty() && !ReplyStatus(replies.back()).ok()) {
        return ReplyStatus(replies.back());
      }
      return reply.status();
    }
    replies.push_back(*std::move(reply));
  }
  return replies;
}

absl::StatusOr<StoreReply> TcpStore::CallOne(StoreRequest request,
                                             size_t values,
                                             absl::Time deadline) {
  absl::StatusOr<std::vector<StoreReply>> replies =
      Call(absl::MakeConstSpan(&request, 1), deadline);
  if (!replies.ok()) {
    if (replies.status().code() == absl::StatusCode::kDeadlineExceeded &&
        request.op != StoreOp::kWait) {
      return absl::DeadlineExceededError(absl::StrCat(
          replies.status().message(), " (", StoreOpName(request.op),
          ", timeout ", absl::FormatDuration(options_.timeout), ")"));
    }
    return replies.status();
  }
  StoreReply& reply = (*replies)[0];
  VEMESH_RETURN_IF_ERROR(ReplyStatus(reply));
  if (reply.values.size() != values) {
    std::lock_guard<std::mutex> lock(mu_);
    Drop();
    return absl::UnavailableError(absl::StrCat(
        "store server ", Where(), " answered ", StoreOpName(request.op),
        " with ", reply.values.size(), " values: expected ", values));
  }
  return std::move(reply);
}

absl::Status TcpStore::set(absl::string_view key, absl::string_view value) {
  absl::Status status = CheckStoreValue(key, value);
  if (!status.ok()) return status;
  StoreRequest r = KeyRequest(StoreOp::kSet, key);
  r.value = std::string(value);
  return CallOne(std::move(r), 0, CallDeadline()).status();
}

absl::StatusOr<std::string> TcpStore::get(absl::string_view key) {
  absl::Status status = CheckStoreKey(key);
  if (!status.ok()) return status;
  VEMESH_ASSIGN_OR_RETURN(
      StoreReply reply,
      CallOne(KeyRequest(StoreOp::kGet, key), 1, CallDeadline()));
  return std::move(reply.values[0]);
}

absl::Status TcpStore::wait(absl::Span<const std::string> keys,
                            absl::Time deadline) {
  absl::Status status = CheckStoreKeys(keys);
  if (!status.ok()) return status;
  const StoreRequest request = KeysRequest(StoreOp::kWait, keys, deadline);
  // The server answers at the deadline, naming the missing keys; the grace
  // covers the trip back.
  absl::StatusOr<std::vector<StoreReply>> replies =
      Call(absl::MakeConstSpan(&request, 1), deadline + options_.wait_grace);
  if (!replies.ok()) {
    if (replies.status().code() == absl::StatusCode::kDeadlineExceeded) {
      return absl::DeadlineExceededError(
          absl::StrCat("store keys not all set before the deadline (",
                       replies.status().message(), "): ", KeysText(keys)));
    }
    return replies.status();
  }
  return ReplyStatus((*replies)[0]);
}

absl::StatusOr<std::vector<std::string>> TcpStore::wait_get(
    absl::Span<const std::string> keys, absl::Time deadline) {
  absl::Status status = CheckStoreKeys(keys);
  if (!status.ok()) return status;
  const StoreRequest requests[2] = {KeysRequest(StoreOp::kWait, keys, deadline),
                                    KeysRequest(StoreOp::kGet, keys, deadline)};
  absl::StatusOr<std::vector<StoreReply>> replies =
      Call(requests, deadline + options_.wait_grace);
  if (!replies.ok()) {
    if (replies.status().code() == absl::StatusCode::kDeadlineExceeded) {
      return absl::DeadlineExceededError(
          absl::StrCat("store keys not all set before the deadline (",
                       replies.status().message(), "): ", KeysText(keys)));
    }
    return replies.status();
  }
  status = ReplyStatus((*replies)[0]);
  if (status.ok()) status = ReplyStatus((*replies)[1]);
  if (!status.ok()) return status;
  std::vector<std::string>& values = (*replies)[1].values;
  if (values.size() != keys.size()) {
    std::lock_guard<std::mutex> lock(mu_);
    Drop();
    return absl::UnavailableError(
        absl::StrCat("store server ", Where(), " answered GET of ", keys.size(),
                     " keys with ", values.size(), " values"));
  }
  return std::move(values);
}

absl::StatusOr<int64_t> TcpStore::add(absl::string_view key, int64_t delta) {
  absl::Status status = CheckStoreKey(key);
  if (!status.ok()) return status;
  StoreRequest r = KeyRequest(StoreOp::kAdd, key);
  r.delta = delta;
  VEMESH_ASSIGN_OR_RETURN(StoreReply reply,
                          CallOne(std::move(r), 1, CallDeadline()));
  int64_t value = 0;
  if (!absl::SimpleAtoi(reply.values[0], &value)) {
    return absl::UnavailableError(absl::StrCat(
        "store server ", Where(), " answered ADD '", key, "' with '",
        reply.values[0].substr(0, 32), "': expected a decimal int64"));
  }
  return value;
}

absl::StatusOr<std::string> TcpStore::compare_set(absl::string_view key,
                                                  absl::string_view expected,
                                                  absl::string_view desired) {
  absl::Status status = CheckStoreValue(key, desired);
  if (status.ok()) status = CheckStoreValue(key, expected);
  if (!status.ok()) return status;
  StoreRequest r = KeyRequest(StoreOp::kCompareSet, key);
  r.expected = std::string(expected);
  r.value = std::string(desired);
  VEMESH_ASSIGN_OR_RETURN(StoreReply reply,
                          CallOne(std::move(r), 1, CallDeadline()));
  return std::move(reply.values[0]);
}

absl::StatusOr<bool> TcpStore::remove(absl::string_view key) {
  absl::Status status = CheckStoreKey(key);
  if (!status.ok()) return status;
  VEMESH_ASSIGN_OR_RETURN(
      StoreReply reply,
      CallOne(KeyRequest(StoreOp::kRemove, key), 1, CallDeadline()));
  return reply.values[0] == "1";
}

absl::Status TcpStore::ping() {
  StoreRequest r;
  r.op = StoreOp::kPing;
  return CallOne(std::move(r), 0, CallDeadline()).status();
}

}  // namespace vemesh
