// tests/common/forwarding_store.h
//
// A Store that passes every call to a MemoryStore of its own. Tests derive
// from it and override only the calls they count or break:
//
//   class ReadCountingStore final : public testing::ForwardingStore {
//    public:
//     absl::StatusOr<std::string> get(absl::string_view key) override {
//       ++reads;
//       return ForwardingStore::get(key);
//     }
//     std::atomic<int> reads{0};
//   };
//
// wait_get is the base Store's (wait, then get of each key, through the
// overrides) unless a test overrides it.

#ifndef VEMESH_TESTS_COMMON_FORWARDING_STORE_H_
#define VEMESH_TESTS_COMMON_FORWARDING_STORE_H_

#include <cstdint>
#include <string>

#include "vemesh/rendezvous/memory_store.h"

namespace vemesh::testing {

class ForwardingStore : public Store {
 public:
  absl::Status set(absl::string_view key, absl::string_view value) override {
    return inner_.set(key, value);
  }
  absl::StatusOr<std::string> get(absl::string_view key) override {
    return inner_.get(key);
  }
  absl::Status wait(absl::Span<const std::string> keys,
                    absl::Time deadline) override {
    return inner_.wait(keys, deadline);
  }
  absl::StatusOr<int64_t> add(absl::string_view key, int64_t delta) override {
    return inner_.add(key, delta);
  }
  absl::StatusOr<std::string> compare_set(absl::string_view key,
                                          absl::string_view expected,
                                          absl::string_view desired) override {
    return inner_.compare_set(key, expected, desired);
  }
  absl::StatusOr<bool> remove(absl::string_view key) override {
    return inner_.remove(key);
  }
  absl::Status set_lease(absl::string_view key, absl::string_view value,
                         absl::Duration ttl) override {
    return inner_.set_lease(key, value, ttl);
  }

 protected:
  MemoryStore& inner() { return inner_; }

 private:
  MemoryStore inner_;
};

}  // namespace vemesh::testing

#endif  // VEMESH_TESTS_COMMON_FORWARDING_STORE_H_
