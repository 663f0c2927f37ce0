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
// peer's addresses). Given the key families it will ask for, the first
// request for a key of a family waits for and reads the whole family in one
// wait_get, and the rest are answered from memory: two round trips per
// family instead of three per key, which is most of a group's creation time
// when many ranks share one store. Keys outside the families take the
// one-at-a-time path.
//
// Threads: Gloo calls it from the thread that called connectFullMesh.

#ifndef VEMESH_COMM_GLOO_INTERNAL_GLOO_STORE_H_
#define VEMESH_COMM_GLOO_INTERNAL_GLOO_STORE_H_

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
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

  // Key families fetched whole on first use (see above); call before the
  // rendezvous.
  void set_prefetch(std::vector<std::vector<std::string>> families);

  // The first failure this adapter threw for; OK when none.
  absl::Status error() const;

 private:
  // Keeps `status` (the first one wins) and throws gloo::IoException.
  [[noreturn]] void Fail(absl::Status status);

  // The value of `key` from its family, fetched whole now if it is not
  // yet; nullopt for a key of no family.
  std::optional<std::vector<char>> Prefetched(const std::string& key,
                                              absl::Time deadline);

  std::shared_ptr<vemesh::Store> store_;
  absl::Duration timeout_;
  std::vector<std::vector<std::string>> families_;
  absl::flat_hash_map<std::string, size_t> family_of_;
  absl::flat_hash_map<std::string, std::vector<char>> fetched_;
  mutable std::mutex mu_;
  absl::Status error_;
};

}  // namespace vemesh

#endif  // VEMESH_COMM_GLOO_INTERNAL_GLOO_STORE_H_
