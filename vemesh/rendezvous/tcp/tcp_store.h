// vemesh/rendezvous/tcp/tcp_store.h
//
// A Store reached over TCP: the client of TcpStoreServer, and what every
// rank of an env:// job talks to (MASTER_ADDR:MASTER_PORT).
//
//   absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::Connect(
//       master_addr, master_port, absl::Now() + absl::Minutes(5));
//   if (!store.ok()) return store.status();  // Unavailable naming host:port
//   (*store)->set("rank/3/addr", "10.0.0.7:4242");
//   auto all = (*store)->wait_get(keys, absl::Now() + absl::Seconds(30));
//
// Connect retries until its deadline, because rank 0 may start its server
// after the other ranks start connecting, or is at its connection cap
// (ResourceExhausted: room is made as unauthenticated or quiet connections
// give way). A client that claims a rank sends its AUTH even when the
// server cannot prove the token, so that the store can fail the job naming
// this rank (PermissionDenied, at once); with a token, a claim refused by a
// store that proved the token (AlreadyExists: the job failed) is final too.
// Every call is bounded: WAIT and wait_get by their deadline (DeadlineExceeded
// naming the missing keys), the others by TcpStoreOptions::timeout. A server
// that is gone (stopped, crashed, the connection reset) is Unavailable; the
// next call then tries one fresh connection, without waiting, so that a dead
// server fails fast.
//
// Threads: every method may be called from any thread; calls are serialised
// on the one connection, so a thread blocked in wait() holds up the others'
// calls on the same TcpStore until it returns. A thread that must set keys
// while another waits uses its own TcpStore.
//
// wait_get is one round trip: the WAIT and the multi-GET are sent together.
// A request or reply is at most kMaxStoreFrameBytes (wire.h): a call over
// that is InvalidArgument (nothing sent) or ResourceExhausted (reply).

#ifndef VEMESH_RENDEZVOUS_TCP_TCP_STORE_H_
#define VEMESH_RENDEZVOUS_TCP_TCP_STORE_H_

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "vemesh/rendezvous/store.h"
#include "vemesh/rendezvous/tcp/socket.h"
#include "vemesh/rendezvous/tcp/wire.h"

namespace vemesh {

struct TcpStoreOptions {
  // Bounds each call that has no deadline of its own (all but wait and
  // wait_get).
  absl::Duration timeout = absl::Minutes(5);
  // How long past a WAIT's deadline the client waits for the server to say
  // so, covering the network and a busy server.
  absl::Duration wait_grace = absl::Seconds(5);
  // The handshake (wire.h, HELLO/AUTH), made on every connection when any
  // of these is set: the server's token (proved by HMAC, never sent; the
  // server proves it back), the job, the rank this client claims (with
  // `claim`, a nonce of this process: made at random when empty), and the
  // server's owner secret (rank 0's own client only).
  std::string token;
  std::string job;
  int rank = -1;
  std::string claim;
  std::string owner_secret;
};

class TcpStore final : public Store {
 public:
  // Connects to the TcpStoreServer at host:port, retrying refused or failed
  // connections until `deadline`. Unavailable naming host:port and the last
  // error when it cannot; InvalidArgument for a port outside 1..65535.
  static absl::StatusOr<std::unique_ptr<TcpStore>> Connect(
      absl::string_view host, int port, absl::Time deadline,
      TcpStoreOptions options = {});

  const std::string& host() const { return host_; }
  int port() const { return port_; }

  absl::Status set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> get(absl::string_view key) override;
  absl::Status wait(absl::Span<const std::string> keys,
                    absl::Time deadline) override;
  absl::StatusOr<int64_t> add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> compare_set(absl::string_view key,
                                          absl::string_view expected,
                                          absl::string_view desired) override;
  absl::StatusOr<bool> remove(absl::string_view key) override;
  absl::StatusOr<std::vector<std::string>> wait_get(
      absl::Span<const std::string> keys, absl::Time deadline) override;

  // One round trip to the server; OK when it answers.
  absl::Status ping();

 private:
  TcpStore(std::string host, int port, TcpStoreOptions options, UniqueFd fd);

  // Sends the requests in one write and reads one reply per request, all by
  // `deadline`. The replies' own statuses are left to the caller.
  absl::StatusOr<std::vector<StoreReply>> Call(
      absl::Span<const StoreRequest> requests, absl::Time deadline);
  // One request whose OK reply carries `values` values; the reply's status
  // is returned when it is not OK.
  absl::StatusOr<StoreReply> CallOne(StoreRequest request, size_t values,
                                     absl::Time deadline);
  absl::Time CallDeadline() const { return absl::Now() + options_.timeout; }
  absl::Status Send(absl::string_view bytes, absl::Time deadline);
  absl::StatusOr<StoreReply> Receive(absl::Time deadline);
  // HELLO and AUTH on the connection just made (when the options ask).
  // `refused`: tell the store this rank was refused by the store of job
  // `*server_job` (set to the refusing store's job on AlreadyExists).
  absl::Status Handshake(absl::Time deadline, bool refused = false,
                         std::string* server_job = nullptr);
  // Forgets a connection whose state is unknown (an error, a timeout
  // mid-reply): the next call connects afresh.
  void Drop();
  std::string Where() const { return HostPortText(host_, port_); }

  const std::string host_;
  const int port_;
  const TcpStoreOptions options_;
  std::mutex mu_;
  UniqueFd fd_;     // invalid after a lost connection
  std::string rx_;  // received bytes not yet parsed
};

}  // namespace vemesh

#endif  // VEMESH_RENDEZVOUS_TCP_TCP_STORE_H_
