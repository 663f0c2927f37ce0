#include "vemesh/rendezvous/prefix_store.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace vemesh {

PrefixStore::PrefixStore(std::shared_ptr<Store> base, absl::string_view prefix)
    : base_(std::move(base)), prefix_(prefix) {}

// Each method checks the key it was given before prefixing it: "" is no key
// even though "prefix/" would be one.
std::string PrefixStore::Key(absl::string_view key) const {
  return absl::StrCat(prefix_, "/", key);
}

std::vector<std::string> PrefixStore::Keys(
    absl::Span<const std::string> keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) out.push_back(Key(key));
  return out;
}

absl::Status PrefixStore::set(absl::string_view key, absl::string_view value) {
  if (absl::Status s = CheckStoreKey(key); !s.ok()) return s;
  return base_->set(Key(key), value);
}
absl::StatusOr<std::string> PrefixStore::get(absl::string_view key) {
  if (absl::Status s = CheckStoreKey(key); !s.ok()) return s;
  return base_->get(Key(key));
}
absl::Status PrefixStore::wait(absl::Span<const std::string> keys,
                               absl::Time deadline) {
  if (absl::Status s = CheckStoreKeys(keys); !s.ok()) return s;
  return base_->wait(Keys(keys), deadline);
}
absl::StatusOr<int64_t> PrefixStore::add(absl::string_view key, int64_t delta) {
  if (absl::Status s = CheckStoreKey(key); !s.ok()) return s;
  return base_->add(Key(key), delta);
}
absl::StatusOr<std::string> PrefixStore::compare_set(
    absl::string_view key, absl::string_view expected,
    absl::string_view desired) {
  if (absl::Status s = CheckStoreKey(key); !s.ok()) return s;
  return base_->compare_set(Key(key), expected, desired);
}
absl::StatusOr<bool> PrefixStore::remove(absl::string_view key) {
  if (absl::Status s = CheckStoreKey(key); !s.ok()) return s;
  return base_->remove(Key(key));
}
absl::Status PrefixStore::set_lease(absl::string_view key,
                                    absl::string_view value,
                                    absl::Duration ttl) {
  if (absl::Status s = CheckStoreKey(key); !s.ok()) return s;
  return base_->set_lease(Key(key), value, ttl);
}
absl::StatusOr<std::vector<std::string>> PrefixStore::wait_get(
    absl::Span<const std::string> keys, absl::Time deadline) {
  if (absl::Status s = CheckStoreKeys(keys); !s.ok()) return s;
  return base_->wait_get(Keys(keys), deadline);
}

}  // namespace vemesh
