#include "vemesh/rendezvous/store.h"

#include "absl/strings/str_cat.h"

namespace vemesh {

absl::Status CheckStoreKey(absl::string_view key) {
  if (key.empty()) {
    return absl::InvalidArgumentError("store key is empty: expected 1.." +
                                      std::to_string(kMaxStoreKeyBytes) +
                                      " bytes");
  }
  if (key.size() > kMaxStoreKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("store key '", key.substr(0, 64), "...' has ", key.size(),
                     " bytes: expected at most ", kMaxStoreKeyBytes));
  }
  return absl::OkStatus();
}

absl::Status CheckStoreValue(absl::string_view key, absl::string_view value) {
  absl::Status status = CheckStoreKey(key);
  if (!status.ok()) return status;
  if (value.size() > kMaxStoreValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("store value for '", key, "' has ", value.size(),
                     " bytes: expected at most ", kMaxStoreValueBytes));
  }
  return absl::OkStatus();
}

absl::Status CheckStoreKeys(absl::Span<const std::string> keys) {
  if (keys.size() > kMaxStoreKeysPerCall) {
    return absl::InvalidArgumentError(
        absl::StrCat("store call names ", keys.size(),
                     " keys: expected at most ", kMaxStoreKeysPerCall));
  }
  for (const std::string& key : keys) {
    absl::Status status = CheckStoreKey(key);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> Store::wait_get(
    absl::Span<const std::string> keys, absl::Time deadline) {
  absl::Status status = wait(keys, deadline);
  if (!status.ok()) return status;
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const std::string& key : keys) {
    absl::StatusOr<std::string> value = get(key);
    if (!value.ok()) return value.status();
    values.push_back(*std::move(value));
  }
  return values;
}

}  // namespace vemesh
