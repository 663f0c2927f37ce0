#include "vemesh/rendezvous/store.h"

#include <cxxabi.h>

#include <cstdlib>
#include <typeinfo>

#include "absl/strings/str_cat.h"
#include "vemesh/base/status_macros.h"

namespace vemesh {

absl::Status CheckStoreKey(absl::string_view key) {
  if (key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store key is empty: expected 1..", kMaxStoreKeyBytes, " bytes"));
  }
  if (key.size() > kMaxStoreKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("store key '", key.substr(0, 64), "...' has ", key.size(),
                     " bytes: expected at most ", kMaxStoreKeyBytes));
  }
  return absl::OkStatus();
}

absl::Status CheckStoreValue(absl::string_view key, absl::string_view value) {
  VEMESH_RETURN_IF_ERROR(CheckStoreKey(key));
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
    VEMESH_RETURN_IF_ERROR(CheckStoreKey(key));
  }
  return absl::OkStatus();
}

absl::Status CheckStoreLease(absl::string_view key, absl::string_view value,
                             absl::Duration ttl) {
  VEMESH_RETURN_IF_ERROR(CheckStoreValue(key, value));
  if (ttl <= absl::ZeroDuration() || ttl > kMaxStoreLease) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lease ttl ", absl::FormatDuration(ttl), " for store key '",
        key.substr(0, 64), "': expected more than 0 and at most ",
        absl::FormatDuration(kMaxStoreLease)));
  }
  return absl::OkStatus();
}

namespace {

// "vemesh::TcpStore" for a TcpStore: the dynamic type, demangled.
std::string StoreKind(const Store& store) {
  const char* mangled = typeid(store).name();
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string kind = status == 0 && demangled != nullptr ? demangled : mangled;
  std::free(demangled);
  return kind;
}

}  // namespace

absl::Status Store::set_lease(absl::string_view key, absl::string_view,
                              absl::Duration) {
  return absl::UnimplementedError(absl::StrCat(
      StoreKind(*this), " has no expiring keys, so cannot set_lease '",
      key.substr(0, 64), "': use RedisStore or MemoryStore"));
}

absl::StatusOr<std::vector<std::string>> Store::wait_get(
    absl::Span<const std::string> keys, absl::Time deadline) {
  absl::Status status = wait(keys, deadline);
  if (!status.ok()) return status;
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const std::string& key : keys) {
    VEMESH_ASSIGN_OR_RETURN(std::string value, get(key));
    values.push_back(std::move(value));
  }
  return values;
}

}  // namespace vemesh
