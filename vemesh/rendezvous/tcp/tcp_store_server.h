// vemesh/rendezvous/tcp/tcp_store_server.h
//
// The server behind TcpStore: rank 0 of an env:// job hosts it at
// MASTER_ADDR:MASTER_PORT and every rank (rank 0 included) connects to it.
//
//   absl::StatusOr<std::unique_ptr<TcpStoreServer>> server =
//       TcpStoreServer::Start("0.0.0.0", 29500);   // port 0: any free port
//   if (!server.ok()) return server.status();     // port taken: AlreadyExists
//   int port = (*server)->port();                  // the port actually bound
//   ...                                            // clients:
//   TcpStore::Connect
//   (*server)->Stop();                             // or let it go out of scope
//
// One thread serves every client: non-blocking sockets under epoll, a read
// and a write buffer per connection, no thread per client, so thousands of
// ranks cost thousands of buffers and not thousands of stacks. A WAIT whose
// keys are not all set is parked on the first missing key and answered when
// a write sets it, or with DeadlineExceeded when its timeout passes (the
// loop sleeps until the earliest parked deadline).
//
// The server trusts no client: a connection that sends a malformed frame
// (unknown op, a length over the bounds, a key too long) is closed and the
// others are not disturbed. It cannot be exhausted:
//  - connections: at most max_connections, and never more than the
//    descriptor limit (RLIMIT_NOFILE) allows with room to spare; at the cap
//    a new connection takes the place of the oldest one that has not
//    completed its handshake (AUTH) within handshake_bound of its accept,
//    partial frame or not, else of the longest-quiet one (quiet for
//    min_quiet_to_evict, no WAIT parked), else it is told ResourceExhausted
//    naming the cap and closed (TcpStore::Connect tries again);
//  - after a conflict (conflict_key written: a rank claimed twice, a
//    rank's proof refused), every WAIT parked or made on a missing key of
//    the job's rounds (a rank key, an owner key) is answered AlreadyExists
//    with the conflict's text, so that no rank waits for a job that has
//    failed;
//  - time: a connection that moves no byte for idle_timeout while no WAIT
//    of it is parked (idle, or half-open: stopped mid-frame, or not reading
//    its replies) is closed. TcpStore reconnects by itself when it finds
//    its idle connection closed;
//  - memory: stored keys and values, buffered requests and unsent replies
//    together stay under max_total_bytes; a request that would pass it is
//    answered ResourceExhausted naming the budget (its bytes are read and
//    dropped, the connection stays usable).
//
// Stopping closes every connection: clients then see Unavailable. The table
// lives and dies with the server.

#ifndef VEMESH_RENDEZVOUS_TCP_TCP_STORE_SERVER_H_
#define VEMESH_RENDEZVOUS_TCP_TCP_STORE_SERVER_H_

#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace vemesh {

struct TcpStoreServerOptions {
  // Open client connections at most; Start lowers it below the descriptor
  // limit (RLIMIT_NOFILE), keeping descriptors for the rest of the process.
  size_t max_connections = 65536;
  // A connection with no parked WAIT that moves no byte for this long is
  // closed.
  absl::Duration idle_timeout = absl::Seconds(120);
  // At the cap, a connection quiet at least this long gives way to a new one.
  absl::Duration min_quiet_to_evict = absl::Seconds(1);
  // At the cap, a connection that has not completed its HELLO/AUTH this long
  // after it was accepted gives way to a new one, even mid-frame (a flood
  // of half frames cannot hold the cap). A plain client (no handshake) with
  // no WAIT parked counts as such.
  absl::Duration handshake_bound = absl::Seconds(1);
  // Stored keys and values plus buffered requests and replies, in bytes.
  size_t max_total_bytes = size_t{512} << 20;
  // Stop answering a connection's requests while this many reply bytes are
  // waiting for it to read them.
  size_t max_pending_reply_bytes = size_t{1} << 20;
  // A shared secret: when set, a connection is served only after its
  // HELLO/AUTH handshake proves it (HMAC-SHA-256 over both sides' nonces;
  // the token never crosses the wire). Every other request before that is
  // Unauthenticated. A client that claims a rank and fails the proof (a
  // wrong token, or a token where the store has none, or none where it has
  // one) is PermissionDenied, and the refusal is written to conflict_key
  // so that every rank of the job hears of it at once.
  std::string token;
  // The job this store belongs to: a HELLO naming another job is refused
  // (FailedPrecondition naming both), so that a rank of a second job on
  // the same port fails instead of joining.
  std::string job;
  // Where a second claim of one rank (two processes saying "rank 3" with
  // different claim nonces) is written, for rank 0 to see: every rank of
  // the job then fails. Empty: not written.
  std::string conflict_key;
  // Keys ending in one of these may be written only by the owner (rank 0's
  // own client, which proves the server's owner secret in AUTH), or set by
  // anybody to a value starting with one of `open_value_prefixes` (an error
  // or conflict verdict: a forged one can only fail the job, never steer it).
  std::vector<std::string> owner_key_suffixes;
  std::vector<std::string> open_value_prefixes;
  // Keys tied to a rank (internal/rank_keys.h: "vemesh/ag/*/{rank}"): such
  // a key may be written only by a connection whose claim of that rank
  // stands (its HELLO claimed the rank first, and its AUTH proved the token
  // when there is one); any other write is PermissionDenied naming the
  // rank. Without a token a claim proves nothing but being first: a rank's
  // later second claimer fails the job (conflict_key).
  std::vector<std::string> rank_key_patterns;
};

class TcpStoreServer {
 public:
  // Binds host:port (port 0: an ephemeral port; host "0.0.0.0": every IPv4
  // address; "": the first wildcard address the resolver gives) and starts
  // the serving thread. AlreadyExists naming
  // host:port when the port is taken; InvalidArgument for a port outside
  // 0..65535; Unavailable when the host does not resolve to a local address.
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(
      absl::string_view host, int port, TcpStoreServerOptions options = {});

  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  // Stops.
  ~TcpStoreServer();

  const std::string& host() const { return host_; }
  // The bound port (the ephemeral one when Start was given 0).
  int port() const { return port_; }
  // Client connections open now (for tests and monitoring).
  size_t connections() const;
  // The connection cap in force (options' max_connections, lowered below
  // the descriptor limit).
  size_t max_connections() const { return max_connections_; }
  // A random secret made at Start that only this process knows: rank 0's
  // own client proves it (TcpStoreOptions::owner_secret) to be the owner.
  const std::string& owner_secret() const { return owner_secret_; }

  // Closes every connection and joins the thread. Idempotent.
  void Stop();

 private:
  class Loop;
  TcpStoreServer(std::string host, int port, std::unique_ptr<Loop> loop);

  std::string host_;
  int port_ = 0;
  size_t max_connections_ = 0;
  std::string owner_secret_;
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
};

}  // namespace vemesh

#endif  // VEMESH_RENDEZVOUS_TCP_TCP_STORE_SERVER_H_
