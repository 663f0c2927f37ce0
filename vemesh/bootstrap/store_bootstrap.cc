#include "vemesh/bootstrap/store_bootstrap.h"

#include <cstdint>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/comm/gloo/gloo_communicator.h"

namespace vemesh {
namespace {

// A verdict is 'O' + the ranks' values (each u64 length + bytes), or
// 'E' + the failure text.
std::string Combine(const std::vector<std::string>& values) {
  std::string out = "O";
  for (const std::string& v : values) {
    const uint64_t n = v.size();
    out.append(reinterpret_cast<const char*>(&n), sizeof(n));
    out.append(v);
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> Split(absl::string_view verdict,
                                               int size) {
  if (verdict.empty()) {
    return absl::InternalError("bootstrap verdict is empty");
  }
  if (verdict[0] == 'E') {
    return absl::DeadlineExceededError(verdict.substr(1));
  }
  std::vector<std::string> out;
  verdict.remove_prefix(1);
  for (int r = 0; r < size; ++r) {
    uint64_t n = 0;
    if (verdict.size() < sizeof(n)) break;
    std::memcpy(&n, verdict.data(), sizeof(n));
    verdict.remove_prefix(sizeof(n));
    if (n > verdict.size()) break;
    out.emplace_back(verdict.substr(0, n));
    verdict.remove_prefix(n);
  }
  if (static_cast<int>(out.size()) != size || !verdict.empty()) {
    return absl::InternalError(absl::StrCat(
        "bootstrap verdict is malformed: expected ", size, " values"));
  }
  return out;
}

}  // namespace

StoreBootstrap::StoreBootstrap(std::shared_ptr<Store> store, int rank,
                               int size, std::string prefix,
                               std::string reason, std::string gloo_host)
    : store_(std::move(store)), rank_(rank), size_(size),
      prefix_(std::move(prefix)), reason_(std::move(reason)),
      gloo_host_(std::move(gloo_host)) {}

absl::StatusOr<std::vector<std::string>> StoreBootstrap::all_gather(
    absl::string_view data, absl::Time deadline) {
  if (broken_) {
    return absl::FailedPreconditionError(
        "the store bootstrap failed an earlier round (see that error): the "
        "ranks no longer agree on where they are; end the job or start a "
        "new bootstrap");
  }
  const std::string round = absl::StrCat(prefix_, "/ag/", round_++);
  const std::string verdict_key = absl::StrCat(round, "/verdict");
  auto fail = [&](absl::Status status) {
    broken_ = true;
    return status;
  };
  absl::Status status = store_->set(absl::StrCat(round, "/", rank_), data);
  if (!status.ok()) return fail(status);

  std::string proposal;
  if (rank_ == 0) {
    std::vector<std::string> keys;
    keys.reserve(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) keys.push_back(absl::StrCat(round, "/", r));
    auto values = store_->wait_get(keys, deadline);
    if (values.ok()) {
      proposal = Combine(*values);
    } else if (absl::IsDeadlineExceeded(values.status())) {
      // Name the ranks whose keys are missing.
      std::vector<int> missing;
      for (int r = 0; r < size_; ++r) {
        if (!store_->get(keys[r]).ok()) missing.push_back(r);
      }
      proposal = absl::StrCat(
          "E", "rank(s) ", absl::StrJoin(missing, ", "), " of ", size_,
          " never arrived before the deadline (rank 0 gave up waiting); "
          "every rank gets this error");
    } else {
      return fail(values.status());
    }
  } else {
    // Rank 0 decides; wait for its verdict a little past our own deadline.
    status = store_->wait({verdict_key}, deadline + grace_);
    if (status.ok()) {
      auto verdict = store_->get(verdict_key);
      if (!verdict.ok()) return fail(verdict.status());
      auto values = Split(*verdict, size_);
      if (!values.ok()) return fail(values.status());
      return values;
    }
    if (!absl::IsDeadlineExceeded(status)) return fail(status);
    proposal = absl::StrCat(
        "E", "rank 0 (which collects the ranks) gave no verdict before the "
        "deadline: rank 0 never arrived, or some rank did not; rank ",
        rank_, " gave up and every rank gets this error");
  }
  // One proposal wins; everybody reads the winner.
  auto winner = store_->compare_set(verdict_key, "", proposal);
  if (!winner.ok()) return fail(winner.status());
  auto values = Split(*winner, size_);
  if (!values.ok()) return fail(values.status());
  return values;
}

absl::StatusOr<std::shared_ptr<Communicator>> StoreBootstrap::world(
    absl::Time deadline) {
  std::vector<int> ranks(static_cast<size_t>(size_));
  std::iota(ranks.begin(), ranks.end(), 0);
  const std::string prefix = absl::StrCat(prefix_, "/world/", worlds_++);
  auto world = GlooCommunicator::Create(store_, prefix, rank_, size_,
                                        std::move(ranks),
                                        deadline - absl::Now(), gloo_host_);
  if (!world.ok()) return world.status();
  return std::shared_ptr<Communicator>(*std::move(world));
}

}  // namespace vemesh
