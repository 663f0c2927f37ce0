#include "vemesh/comm/gloo/internal/gloo_store.h"

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

std::vector<char> GlooStore::get(const std::string& key) {
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
  absl::Status status = store_->wait(keys, absl::Now() + bound);
  if (!status.ok()) Fail(std::move(status));
}

}  // namespace vemesh
