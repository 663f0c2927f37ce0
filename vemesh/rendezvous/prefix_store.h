// vemesh/rendezvous/prefix_store.h
//
// A view of a Store whose every key is put under `prefix/`. Each mesh
// creation (and each Gloo group) works under its own prefix, so a value left
// by an earlier init is never read by a later one.
//
//   PrefixStore init(store, "vemesh/init/3");
//   init.set("host/0", "node7");      // stores "vemesh/init/3/host/0"

#ifndef VEMESH_RENDEZVOUS_PREFIX_STORE_H_
#define VEMESH_RENDEZVOUS_PREFIX_STORE_H_

#include <memory>
#include <string>

#include "vemesh/rendezvous/store.h"

namespace vemesh {

class PrefixStore final : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> base, absl::string_view prefix);

  const std::string& prefix() const { return prefix_; }

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
  absl::StatusOr<std::vector<std::string>> wait_get(
      absl::Span<const std::string> keys, absl::Time deadline) override;

 private:
  std::string Key(absl::string_view key) const;
  std::vector<std::string> Keys(absl::Span<const std::string> keys) const;

  std::shared_ptr<Store> base_;
  std::string prefix_;
};

}  // namespace vemesh

#endif  // VEMESH_RENDEZVOUS_PREFIX_STORE_H_
