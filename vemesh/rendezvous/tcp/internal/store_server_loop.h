// vemesh/rendezvous/tcp/internal/store_server_loop.h
//
// The serving thread of TcpStoreServer (tcp_store_server.h), shared by the
// files that implement it: the loop (tcp_store_server.cc), admission and
// the memory budget (tcp_store_admission.cc), authentication and rank
// claims (tcp_store_auth.cc), requests and parked waits
// (tcp_store_requests.cc). Private: not installed.

#ifndef VEMESH_RENDEZVOUS_TCP_INTERNAL_STORE_SERVER_LOOP_H_
#define VEMESH_RENDEZVOUS_TCP_INTERNAL_STORE_SERVER_LOOP_H_

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "vemesh/rendezvous/tcp/socket.h"
#include "vemesh/rendezvous/tcp/tcp_store_server.h"
#include "vemesh/rendezvous/tcp/wire.h"

namespace vemesh {
namespace tcp_server_internal {

// epoll user data of the two descriptors that are not connections.
inline constexpr uint64_t kListenId = 0;
inline constexpr uint64_t kWakeId = 1;
inline constexpr uint64_t kFirstConnectionId = 2;

// A connection holds at most one whole largest frame of unparsed input, and
// more than a chunk only once the memory budget admitted it.
inline constexpr size_t kReadChunkBytes = 64 << 10;
// After accept() ran out of descriptors, try again this often.
inline constexpr absl::Duration kAcceptRetry = absl::Milliseconds(100);

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
  absl::Time accepted;     // when accept() returned it
  size_t admitted = 0;     // a large frame being received: its admitted size
  size_t discard = 0;      // bytes of a refused frame still to drop
  size_t accounted = 0;    // bytes counted against the memory budget
  bool dead = false;       // closed at the end of this loop turn
  bool queued = false;     // in the ready list
  std::optional<Waiter> waiter;  // a parked WAIT: no request is read meanwhile
  // The handshake (wire.h, HELLO/AUTH).
  std::string server_nonce;    // hex, sent in the HELLO reply
  std::string client_nonce;    // hex, from HELLO
  bool authenticated = false;  // its AUTH was accepted (with or without token)
  bool owner = false;          // proved the owner secret: rank 0's own client
  int64_t rank = -1;           // the rank it claims (-1: none)
  std::string claim;           // the claimer's nonce
  bool refused = false;        // refused by another store on this port
};

// A rank's claim: who made it, for the conflict message.
struct Claim {
  std::string claim;  // the claimer's nonce
  uint64_t connection = 0;
};

}  // namespace tcp_server_internal

using tcp_server_internal::Claim;
using tcp_server_internal::Connection;
using tcp_server_internal::kFirstConnectionId;
using tcp_server_internal::kReadChunkBytes;
using tcp_server_internal::Waiter;

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
  // Whether c's claim of `rank` stands: its handshake is complete and no
  // other claimer holds the rank (rank_key_patterns).
  bool ProvedRank(const Connection& c, int64_t rank) const;
  // A ranked client's failed proof of the token: recorded as the job's
  // conflict and answered PermissionDenied.
  void RefuseProof(Connection& c, absl::string_view why);
  // conflict_key was written: every parked WAIT whose keys are not all set
  // is answered AlreadyExists(text).
  void FailWaits(const std::string& text);
  // Writes the conflict (once: the first one stands) and fails the WAITs.
  void RecordConflict(const std::string& text);
  // A key of the job's rounds: a rank key or an owner key.
  bool JobKey(const std::string& key) const;
  // The conflict's text once conflict_key is set; nullptr before.
  const std::string* Conflict() const;
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
  // At the cap: the oldest connection past handshake_bound without a
  // completed handshake (and no WAIT parked) is closed; true if one was.
  bool EvictUnproven();
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
  // Connections whose handshake is not complete, oldest accept first.
  std::set<std::pair<absl::Time, uint64_t>> unproven_;
  // Every open connection by its last activity, longest quiet first.
  std::set<std::pair<absl::Time, uint64_t>> activity_;
  size_t table_bytes_ = 0;     // keys and values stored
  size_t buffered_bytes_ = 0;  // connections' accounted buffers
  std::vector<uint64_t> ready_;
  std::vector<uint64_t> dead_;
  std::optional<absl::Time> accept_paused_since_;
  char read_buffer_[kReadChunkBytes];
};

}  // namespace vemesh

#endif  // VEMESH_RENDEZVOUS_TCP_INTERNAL_STORE_SERVER_LOOP_H_
