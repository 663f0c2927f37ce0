#include "vemesh/comm/gloo/internal/gloo_store.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gloo/common/error.h"

namespace vemesh {

GlooStore::GlooStore(std::shared_ptr<vemesh::Store> store,
                     absl::Duration timeout)
    : store_(std::move(store)), timeout_(timeout) {}

void GlooStore::Fail(absl::Status status) {
  std::string text = status.ToString();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.ok()) error_ = std::move(status);
  }
  throw gloo::IoException(absl::StrCat("vemesh store: ", text));
}

absl::Status GlooStore::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status status =
      store_->set(key, absl::string_view(data.data(), data.size()));
  if (!status.ok()) Fail(std::move(status));
}

void GlooStore::set_prefetch(std::vector<std::vector<std::string>> families) {
  families_ = std::move(families);
  family_of_.clear();
  for (size_t f = 0; f < families_.size(); ++f) {
    for (const std::string& key : families_[f]) family_of_[key] = f;
  }
}

std::optional<std::vector<char>> GlooStore::Prefetched(const std::string& key,
                                                       absl::Time deadline) {
  auto fetched = fetched_.find(key);
  if (fetched != fetched_.end()) return fetched->second;
  auto family = family_of_.find(key);
  if (family == family_of_.end()) return std::nullopt;
  const std::vector<std::string>& keys = families_[family->second];
  absl::StatusOr<std::vector<std::string>> values =
      store_->wait_get(keys, deadline);
  if (!values.ok()) Fail(values.status());
  for (size_t i = 0; i < keys.size() && i < values->size(); ++i) {
    const std::string& v = (*values)[i];
    fetched_[keys[i]] = std::vector<char>(v.begin(), v.end());
  }
  fetched = fetched_.find(key);
  if (fetched == fetched_.end()) {
    Fail(absl::InternalError(absl::StrCat("store: wait_get of ", keys.size(),
                                          " keys answered ", values->size(),
                                          " values")));
  }
  return fetched->second;
}

std::vector<char> GlooStore::get(const std::string& key) {
  if (std::optional<std::vector<char>> v =
          Prefetched(key, absl::Now() + timeout_)) {
    return *std::move(v);
  }
  const std::string keys[] = {key};
  absl::StatusOr<std::vector<std::string>> values =
      store_->wait_get(keys, absl::Now() + timeout_);
  if (!values.ok()) Fail(values.status());
  const std::string& value = values->front();
  return std::vector<char>(value.begin(), value.end());
}

void GlooStore::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::milliseconds::zero());
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  // Gloo's "no timeout" is zero; a rendezvous must still end, so it gets
  // the adapter's bound.
  const absl::Duration bound = timeout > std::chrono::milliseconds::zero()
                                   ? absl::FromChrono(timeout)
                                   : timeout_;
  // Keys of a prefetched family are there once it is fetched.
  bool all_fetched = true;
  for (const std::string& key : keys) {
    all_fetched =
        Prefetched(key, absl::Now() + bound).has_value() && all_fetched;
  }
  if (all_fetched) return;
  absl::Status status = store_->wait(keys, absl::Now() + bound);
  if (!status.ok()) Fail(std::move(status));
}

}  // namespace vemesh
