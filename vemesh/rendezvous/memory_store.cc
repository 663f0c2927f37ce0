#include "vemesh/rendezvous/memory_store.h"

#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/base/status_macros.h"

namespace vemesh {

std::string MissingKeysText(
    absl::Span<const std::string> keys,
    const absl::flat_hash_map<std::string, std::string>& values) {
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    if (!values.contains(key)) missing.push_back(key);
    if (missing.size() == 8) {
      missing.push_back("...");
      break;
    }
  }
  return absl::StrJoin(missing, ", ");
}

absl::StatusOr<int64_t> ParseCounter(absl::string_view key,
                                     absl::string_view text) {
  int64_t value = 0;
  if (!text.empty() && !absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("store key '", key, "' holds '", text.substr(0, 32),
                     "', not a counter: expected a decimal int64"));
  }
  return value;
}

void MemoryStore::ExpireLocked(absl::string_view key, absl::Time now) {
  auto it = expiries_.find(key);
  if (it == expiries_.end() || it->second > now) return;
  expiries_.erase(it);
  values_.erase(key);
}

absl::Status MemoryStore::set(absl::string_view key, absl::string_view value) {
  VEMESH_RETURN_IF_ERROR(CheckStoreValue(key, value));
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = std::string(value);
    expiries_.erase(key);
  }
  changed_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::string> MemoryStore::get(absl::string_view key) {
  VEMESH_RETURN_IF_ERROR(CheckStoreKey(key));
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(key, absl::Now());
  auto it = values_.find(key);
  if (it == values_.end()) {
    return absl::NotFoundError(absl::StrCat("store has no key '", key, "'"));
  }
  return it->second;
}

absl::Status MemoryStore::wait(absl::Span<const std::string> keys,
                               absl::Time deadline) {
  VEMESH_RETURN_IF_ERROR(CheckStoreKeys(keys));
  std::unique_lock<std::mutex> lock(mu_);
  auto all_present = [&] {
    const absl::Time now = absl::Now();
    for (const std::string& key : keys) {
      ExpireLocked(key, now);
      if (!values_.contains(key)) return false;
    }
    return true;
  };
  while (!all_present()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      // all_present stopped at the first missing key: expire the rest too,
      // so that only what is really absent is named.
      const absl::Time now = absl::Now();
      for (const std::string& key : keys) ExpireLocked(key, now);
      return absl::DeadlineExceededError(
          absl::StrCat("store keys never set before the deadline: ",
                       MissingKeysText(keys, values_)));
    }
    changed_.wait_for(
        lock, absl::ToChronoMilliseconds(left) + std::chrono::milliseconds(1));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> MemoryStore::add(absl::string_view key, int64_t delta) {
  absl::Status status = CheckStoreKey(key);
  if (!status.ok()) return status;
  int64_t value = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ExpireLocked(key, absl::Now());
    // A leased counter keeps its expiry.
    std::string& slot = values_[key];
    VEMESH_ASSIGN_OR_RETURN(int64_t current, ParseCounter(key, slot));
    // Wraps like a two's-complement counter rather than overflowing.
    value = static_cast<int64_t>(static_cast<uint64_t>(current) +
                                 static_cast<uint64_t>(delta));
    slot = absl::StrCat(value);
  }
  changed_.notify_all();
  return value;
}

absl::StatusOr<std::string> MemoryStore::compare_set(
    absl::string_view key, absl::string_view expected,
    absl::string_view desired) {
  VEMESH_RETURN_IF_ERROR(CheckStoreValue(key, desired));
  std::string result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ExpireLocked(key, absl::Now());
    auto it = values_.find(key);
    const absl::string_view current = it == values_.end()
                                          ? absl::string_view()
                                          : absl::string_view(it->second);
    if (current != expected) return std::string(current);
    values_[key] = std::string(desired);
    expiries_.erase(key);
    result = std::string(desired);
  }
  changed_.notify_all();
  return result;
}

absl::StatusOr<bool> MemoryStore::remove(absl::string_view key) {
  VEMESH_RETURN_IF_ERROR(CheckStoreKey(key));
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(key, absl::Now());
  expiries_.erase(key);
  return values_.erase(key) > 0;
}

absl::Status MemoryStore::set_lease(absl::string_view key,
                                    absl::string_view value,
                                    absl::Duration ttl) {
  VEMESH_RETURN_IF_ERROR(CheckStoreLease(key, value, ttl));
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = std::string(value);
    expiries_[key] = absl::Now() + ttl;
  }
  changed_.notify_all();
  return absl::OkStatus();
}

}  // namespace vemesh
