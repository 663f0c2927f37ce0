// vemesh/comm/gloo/internal/gloo_store.h
//
// Lets Gloo rendezvous through a vemesh Store. Gloo's connectFullMesh wants a
// gloo::rendezvous::Store; GlooStore is one, backed by any vemesh::Store
// (MemoryStore in tests, TcpStore across machines, a PrefixStore per group).
//
//   auto group = std::make_shared<PrefixStore>(store, "gloo/world");
//   GlooStore adapter(group, absl::Seconds(30));
//   context->connectFullMesh(adapter, device);   // may throw, see below
//   if (!adapter.error().ok()) ...               // why it threw
//
// Gloo expects a store to block and to throw on failure, so:
//   * get waits for the key first (Gloo's get blocks until the key exists;
//     vemesh's get never blocks), bounded by the adapter's timeout;
//   * wait is bounded by the timeout Gloo passes, or the adapter's timeout
//     when Gloo passes none;
//   * any failure throws gloo::IoException with the vemesh Status's text,
//     and the first such Status is kept: error() gives the caller back its
//     code (DeadlineExceeded for a rank that never showed up, Unavailable
//     for a lost store), which Gloo's exception cannot carry.
// The exception must be caught where Gloo was called (RunGloo does).
//
// Fetched together (set_prefetch): Gloo's connectFullMesh asks for its
// peers' keys one at a time, a wait and a get each (about three store round
// trips per peer, twice over: the hostnames of the lower ranks, then every
// peer's addresses). Given the key families it will ask for, a request for
// a key not fetched yet waits for and reads the next `keys_per_fetch` keys
// of its family from it on in one wait_get, and the others are answered
// from memory (a get hands its value over and forgets it, so at most one
// run of values is held): two round trips per run instead of three per key,
// which is most of a group's creation time when many ranks share one store.
// The caller sizes the runs so that one reply stays small (a store bounds
// its replies; an address is (size - 1) pair addresses). Keys outside the
// families take the one-at-a-time path. One rendezvous per adapter.

#ifndef VEMESH_COMM_GLOO_INTERNAL_GLOO_STORE_H_
#define VEMESH_COMM_GLOO_INTERNAL_GLOO_STORE_H_

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"
#include "vemesh/rendezvous/store.h"

namespace vemesh {

class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(std::shared_ptr<vemesh::Store> store, absl::Duration timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // Key families fetched in runs of keys_per_fetch (at least 1) on first
  // use (see above); call before the rendezvous.
  void set_prefetch(std::vector<std::vector<std::string>> families,
                    size_t keys_per_fetch);

  // The first failure this adapter threw for; OK when none.
  absl::Status error() const;

 private:
  // Keeps `status` (the first one wins) and throws gloo::IoException.
  [[noreturn]] void Fail(absl::Status status);

  // Makes sure `key`'s value is in fetched_ (its run fetched now if not):
  // false for a key of no family.
  bool Fetch(const std::string& key, absl::Time deadline);

  std::shared_ptr<vemesh::Store> store_;
  absl::Duration timeout_;
  std::vector<std::vector<std::string>> families_;
  size_t keys_per_fetch_ = 1;
  // Each key's family and place in it.
  absl::flat_hash_map<std::string, std::pair<size_t, size_t>> family_of_;
  absl::flat_hash_map<std::string, std::vector<char>> fetched_;
  mutable std::mutex mu_;
  absl::Status error_;
};

}  // namespace vemesh

#endif  // VEMESH_COMM_GLOO_INTERNAL_GLOO_STORE_H_
