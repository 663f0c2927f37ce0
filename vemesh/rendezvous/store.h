// vemesh/rendezvous/store.h
//
// A Store is a small key-value service that every rank of a job can reach:
// the control plane through which ranks find each other (env:// bootstrap,
// Gloo rendezvous, NCCL unique ids) and, for elastic jobs, the place that
// outlives them. Keys are strings, values are bytes.
//
//   std::shared_ptr<Store> store = ...;        // TcpStore, MemoryStore, ...
//   absl::Status s = store->set("rank/3/addr", "10.0.0.7:4242");
//   s = store->wait({"rank/0/addr", "rank/1/addr"},
//                   absl::Now() + absl::Seconds(30));
//   absl::StatusOr<std::string> addr = store->get("rank/0/addr");
//   absl::StatusOr<int64_t> n = store->add("arrived", 1);  // counter
//   auto prev = store->compare_set("epoch", "7", "8");      // CAS
//   s = store->set_lease("alive/3", "1", absl::Seconds(10));  // heartbeat
//
// Semantics every implementation keeps:
//   * set        stores (or replaces) a value.
//   * get        the value now; NotFound naming the key when it is absent.
//                get never blocks: wait first.
//   * wait       returns OK once every key exists; DeadlineExceeded naming
//                the keys still missing when `deadline` passes.
//   * add        adds `delta` to a 64-bit counter stored as decimal text
//                (an absent key counts as 0) and returns the new value;
//                InvalidArgument when the key holds something that is not
//                a counter.
//   * compare_set  when the key's value equals `expected` (an absent key
//                equals the empty string), stores `desired`. Returns the
//                value the key holds afterwards: `desired` on success, the
//                current value otherwise.
//   * remove     deletes the key; returns whether it existed.
//   * set_lease  stores a value that disappears `ttl` after the call unless
//                set again: a heartbeat, so that a rank that died stops
//                being seen. 0 < ttl <= kMaxStoreLease, else InvalidArgument
//                naming it; Unimplemented on stores without expiring keys
//                (TcpStore). An expired key is absent to every method. set
//                and compare_set store a value that never expires; add
//                keeps a lease's expiry (as Redis's INCRBY does).
// A lost or unreachable store is Unavailable; a value or key over the
// store's bounds is InvalidArgument (nothing is sent).
//
// Threads: every method may be called from any thread.

#ifndef VEMESH_RENDEZVOUS_STORE_H_
#define VEMESH_RENDEZVOUS_STORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace vemesh {

// Bounds every Store enforces, so that a value from the network never sizes
// an allocation unchecked.
inline constexpr size_t kMaxStoreKeyBytes = 4096;
inline constexpr size_t kMaxStoreValueBytes = size_t{64} << 20;  // 64 MiB
inline constexpr size_t kMaxStoreKeysPerCall = 65536;
// The longest lease: a heartbeat is seconds to minutes, so a ttl past a
// day is more likely a unit mistake (ms taken for s) than a lease.
inline constexpr absl::Duration kMaxStoreLease = absl::Hours(24);

class Store {
 public:
  virtual ~Store() = default;

  virtual absl::Status set(absl::string_view key, absl::string_view value) = 0;
  virtual absl::StatusOr<std::string> get(absl::string_view key) = 0;
  virtual absl::Status wait(absl::Span<const std::string> keys,
                            absl::Time deadline) = 0;
  virtual absl::StatusOr<int64_t> add(absl::string_view key, int64_t delta) = 0;
  virtual absl::StatusOr<std::string> compare_set(
      absl::string_view key, absl::string_view expected,
      absl::string_view desired) = 0;
  virtual absl::StatusOr<bool> remove(absl::string_view key) = 0;
  // Stores that keep no expiry answer Unimplemented, naming their kind.
  virtual absl::Status set_lease(absl::string_view key, absl::string_view value,
                                 absl::Duration ttl);

  // wait() then get() of each key, in order. Stores that can do it in one
  // round trip override it.
  virtual absl::StatusOr<std::vector<std::string>> wait_get(
      absl::Span<const std::string> keys, absl::Time deadline);
};

// The checks every implementation makes before it does anything.
absl::Status CheckStoreKey(absl::string_view key);
absl::Status CheckStoreValue(absl::string_view key, absl::string_view value);
absl::Status CheckStoreKeys(absl::Span<const std::string> keys);
// CheckStoreValue, and 0 < ttl <= kMaxStoreLease.
absl::Status CheckStoreLease(absl::string_view key, absl::string_view value,
                             absl::Duration ttl);

}  // namespace vemesh

#endif  // VEMESH_RENDEZVOUS_STORE_H_
