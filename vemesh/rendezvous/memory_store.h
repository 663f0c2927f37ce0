// vemesh/rendezvous/memory_store.h
//
// A Store inside one process: the threads of a test (each playing a rank)
// rendezvous through it, and the TCP store server keeps its table in one.
//
//   auto store = std::make_shared<MemoryStore>();
//   std::thread t([&] { store->set("ready", "1"); });
//   store->wait({"ready"}, absl::Now() + absl::Seconds(1));  // OK
//
// Leases are checked when a key is touched: an expired key is dropped by
// the next call that names it, so until then it only costs memory.

#ifndef VEMESH_RENDEZVOUS_MEMORY_STORE_H_
#define VEMESH_RENDEZVOUS_MEMORY_STORE_H_

#include <condition_variable>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "vemesh/rendezvous/store.h"

namespace vemesh {

class MemoryStore final : public Store {
 public:
  absl::Status set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> get(absl::string_view key) override;
  absl::Status wait(absl::Span<const std::string> keys,
                    absl::Time deadline) override;
  absl::StatusOr<int64_t> add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> compare_set(absl::string_view key,
                                          absl::string_view expected,
                                          absl::string_view desired) override;
  absl::StatusOr<bool> remove(absl::string_view key) override;
  absl::Status set_lease(absl::string_view key, absl::string_view value,
                         absl::Duration ttl) override;

 private:
  // Drops `key` when its lease ran out by `now`. Called, under mu_, by
  // every method before it looks at a key.
  void ExpireLocked(absl::string_view key, absl::Time now);

  std::mutex mu_;
  std::condition_variable changed_;
  absl::flat_hash_map<std::string, std::string> values_;
  // When each leased key of values_ expires; keys set otherwise have none.
  absl::flat_hash_map<std::string, absl::Time> expiries_;
};

// The keys of `keys` that `has` says are absent, joined for an error text.
std::string MissingKeysText(
    absl::Span<const std::string> keys,
    const absl::flat_hash_map<std::string, std::string>& values);

// Parses a counter value; InvalidArgument naming the key otherwise.
absl::StatusOr<int64_t> ParseCounter(absl::string_view key,
                                     absl::string_view text);

}  // namespace vemesh

#endif  // VEMESH_RENDEZVOUS_MEMORY_STORE_H_
