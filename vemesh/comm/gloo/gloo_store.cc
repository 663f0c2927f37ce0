#include "vemesh/comm/gloo/internal/gloo_store.h"

#include <algorithm>
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

void GlooStore::set_prefetch(std::vector<std::vector<std::string>> families,
                             size_t keys_per_fetch) {
  families_ = std::move(families);
  keys_per_fetch_ = std::max<size_t>(1, keys_per_fetch);
  family_of_.clear();
  fetched_.clear();
  for (size_t f = 0; f < families_.size(); ++f) {
    for (size_t i = 0; i < families_[f].size(); ++i) {
      family_of_[families_[f][i]] = {f, i};
    }
  }
}

bool GlooStore::Fetch(const std::string& key, absl::Time deadline) {
  if (fetched_.contains(key)) return true;
  auto at = family_of_.find(key);
  if (at == family_of_.end()) return false;
  // The run of its family from `key` on (Gloo asks in family order).
  const std::vector<std::string>& family = families_[at->second.first];
  const size_t begin = at->second.second;
  const size_t end = std::min(family.size(), begin + keys_per_fetch_);
  const std::vector<std::string> keys(family.begin() + begin,
                                      family.begin() + end);
  absl::StatusOr<std::vector<std::string>> values =
      store_->wait_get(keys, deadline);
  if (!values.ok()) Fail(values.status());
  if (values->size() != keys.size()) {
    Fail(absl::InternalError(absl::StrCat("store: wait_get of ", keys.size(),
                                          " keys answered ", values->size(),
                                          " values")));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string& v = (*values)[i];
    fetched_[keys[i]] = std::vector<char>(v.begin(), v.end());
  }
  return true;
}

std::vector<char> GlooStore::get(const std::string& key) {
  if (Fetch(key, absl::Now() + timeout_)) {
    // Gloo reads each key once: the copy here is dropped.
    auto node = fetched_.extract(key);
    return std::move(node.mapped());
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
  const absl::Time deadline =
      absl::Now() + (timeout > std::chrono::milliseconds::zero()
                         ? absl::FromChrono(timeout)
                         : timeout_);
  // Keys of a prefetched family are there once they are fetched; one
  // deadline bounds the whole wait.
  bool all_fetched = true;
  for (const std::string& key : keys) {
    all_fetched = Fetch(key, deadline) && all_fetched;
  }
  if (all_fetched) return;
  absl::Status status = store_->wait(keys, deadline);
  if (!status.ok()) Fail(std::move(status));
}

}  // namespace vemesh
