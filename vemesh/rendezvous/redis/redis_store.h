// vemesh/rendezvous/redis/redis_store.h
//
// A Store kept in Redis: the control plane of elastic jobs, which must
// outlive every rank (a TcpStore dies with rank 0). Ranks that come and go
// find each other there, and heartbeat with leases (set_lease, Redis's
// SET ... PX) so that a rank that died stops being seen.
//
//   absl::StatusOr<std::shared_ptr<RedisStore>> store =
//       RedisStore::Connect("redis://10.0.0.2:6379", {.key_prefix = "job42/"});
//   if (!store.ok()) return store.status();  // Unavailable naming the address
//   (*store)->set_lease("alive/3", "10.0.0.7:4242", absl::Seconds(10));
//   auto epoch = (*store)->compare_set("epoch", "7", "8");
//
// Addresses are "redis://HOST:PORT" or "HOST:PORT" (an IPv6 literal in
// brackets: "[::1]:6379"), with credentials as "redis://USER:PASSWORD@HOST:
// PORT" (an ACL user) or "redis://:PASSWORD@HOST:PORT" (requirepass): each
// connection then sends AUTH before anything else. No database. Messages
// never show the password.
//
// The Store operations map onto Redis commands: set SET, get GET, remove
// DEL, set_lease SET PX (the ttl rounded up to whole milliseconds), add
// INCRBY, compare_set one Lua script (EVAL, atomic in Redis), wait_get a
// wait then MGET. wait polls EXISTS, sleeping 1 ms growing to 20 ms between
// polls; Redis has no blocking wait for keys. add accepts what MemoryStore
// accepts: where INCRBY refuses (an empty value, "+5", or a sum past int64,
// which wraps), it falls back to a compare_set loop, which is Aborted if
// other writers win every round for op_timeout.
//
// Bounds: a call gives up when Redis stays silent for op_timeout (hiredis's
// socket timeout: each read or write, so a 64 MiB value that keeps moving
// may take longer), and a reconnect when it takes connect_timeout. wait
// and wait_get poll until their deadline and end at most about 200 ms past
// it when Redis is slow (100 ms for the last poll, 100 ms to name the
// missing keys); wait_get's MGET after the wait is one more call. A Redis
// that is gone (refused, timed out, closed the connection, an I/O error)
// is Unavailable naming the address, and raises no SIGPIPE; the connection
// is then dropped and the next call tries one fresh connection, bounded by
// connect_timeout, before it fails the same way. An error reply from Redis
// (WRONGTYPE, a script error, ...) is Internal with Redis's text.
//
// Threads: every method may be called from any thread. Calls share one
// connection and are serialised on it, one command at a time, so a thread
// in wait() holds it only while it polls: other threads' sets through the
// same RedisStore go through between polls.
//
// A vemesh built with VEMESH_WITH_REDIS=OFF has no hiredis: Connect then
// answers Unimplemented naming the option (rendezvous/redis/redis_stub.cc).

#ifndef VEMESH_RENDEZVOUS_REDIS_REDIS_STORE_H_
#define VEMESH_RENDEZVOUS_REDIS_REDIS_STORE_H_

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "vemesh/rendezvous/store.h"

// hiredis's types, kept out of this header so that including it needs no
// hiredis headers.
struct redisContext;
struct redisReply;

namespace vemesh {

struct RedisStoreOptions {
  // Bounds connecting: the first connection and each reconnect.
  absl::Duration connect_timeout = absl::Seconds(5);
  // Bounds each command's round trip (each poll of a wait).
  absl::Duration op_timeout = absl::Seconds(5);
  // Put before every key sent to Redis (raw, so "job42/" or "job42:"), so
  // that jobs sharing one Redis never see each other's keys. Error texts
  // name the key as the caller gave it.
  std::string key_prefix;
  // AUTH's user and password; taken from the address when it has them.
  std::string user;
  std::string password;
};

class RedisStore final : public Store {
 public:
  // Connects to the Redis at `address` and checks that it answers PING.
  // InvalidArgument naming the address when it is not "redis://HOST:PORT"
  // or "HOST:PORT" with a port in 1..65535, or naming an option that is
  // not a positive, finite duration; Unavailable naming the address when
  // no Redis answers within the timeouts. One attempt: a Redis server is
  // expected to be up before the job starts.
  static absl::StatusOr<std::shared_ptr<RedisStore>> Connect(
      absl::string_view address, RedisStoreOptions options = {});

  ~RedisStore() override;
  RedisStore(const RedisStore&) = delete;
  RedisStore& operator=(const RedisStore&) = delete;

  // "HOST:PORT", for messages.
  const std::string& address() const { return address_; }

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
  absl::Status set_lease(absl::string_view key, absl::string_view value,
                         absl::Duration ttl) override;

 private:
  struct ReplyFree {
    void operator()(redisReply* reply) const;
  };
  using Reply = std::unique_ptr<redisReply, ReplyFree>;
  // The outcome of compare_set's script: whether it stored, and the value
  // the key holds afterwards.
  struct Swap {
    bool stored = false;
    std::string value;
  };

  RedisStore(std::string host, int port, RedisStoreOptions options,
             redisContext* context);

  // Sends one command and reads its reply, within `timeout` (connecting
  // first, within connect_timeout or `timeout` if less, when the last call
  // lost the connection). Unavailable when Redis is gone, `*timed_out`
  // (if given) then saying whether it was silent for `timeout`; an error
  // reply is returned as a reply, for the caller to judge. `what` names the
  // call.
  absl::StatusOr<Reply> Command(absl::Span<const absl::string_view> args,
                                absl::Duration timeout, absl::string_view what,
                                bool* timed_out = nullptr);
  // Command within op_timeout, an error reply made Internal.
  absl::StatusOr<Reply> Call(absl::Span<const absl::string_view> args,
                             absl::string_view what);
  // compare_set's script; `keep_lease` keeps the key's expiry (add's
  // fallback) rather than storing a value that never expires.
  absl::StatusOr<Swap> CompareSwap(absl::string_view key,
                                   absl::string_view expected,
                                   absl::string_view desired, bool keep_lease);
  // add where INCRBY refused: read, parse as MemoryStore does, and
  // compare_set until no one else wrote in between.
  absl::StatusOr<int64_t> AddByCompareSet(absl::string_view key, int64_t delta);
  // How many of `keys` exist (a key named twice counts twice), one poll of
  // wait within `timeout`.
  absl::StatusOr<int64_t> CountExisting(absl::Span<const std::string> keys,
                                        absl::Duration timeout,
                                        bool* timed_out);
  // The text naming the keys of `keys` still absent, for a DeadlineExceeded.
  std::string MissingKeys(absl::Span<const std::string> keys);
  // Forgets the connection (its state is unknown after an error): the next
  // call connects afresh. Called with mu_ held.
  void DropLocked();
  std::string Key(absl::string_view key) const;

  const std::string host_;
  const int port_;
  const std::string address_;
  const RedisStoreOptions options_;
  std::mutex mu_;          // std::mutex: the ThreadSanitizer build sees it
  redisContext* context_;  // null after a lost connection
  absl::Duration context_timeout_;  // the one redisSetTimeout last set
};

}  // namespace vemesh

#endif  // VEMESH_RENDEZVOUS_REDIS_REDIS_STORE_H_
