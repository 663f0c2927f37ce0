#include "vemesh/bootstrap/store_bootstrap.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/gloo/gloo_communicator.h"

namespace vemesh {
namespace {

// "3, 5, 9, ... (65535 in all)": a message about a huge world stays one
// readable line (the whole list of 65,535 ranks was a 447 KB line).
std::string FirstFew(const std::vector<int>& ranks) {
  constexpr size_t kShown = 8;
  if (ranks.size() <= kShown) return absl::StrJoin(ranks, ", ");
  return absl::StrCat(
      absl::StrJoin(ranks.begin(), ranks.begin() + kShown, ", "), ", ... (",
      ranks.size(), " in all)");
}

// A verdict is 'O' + the number of ranks (u64) + their values (each u64
// length + bytes), 'E' + the failure text, or 'C' + the text of a conflict
// (a rank claimed twice).
std::string Combine(const std::vector<std::string>& values) {
  std::string out = "O";
  const uint64_t count = values.size();
  out.append(reinterpret_cast<const char*>(&count), sizeof(count));
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
  if (verdict[0] == 'C') {  // a rank claimed twice: two jobs on one store
    return absl::AlreadyExistsError(verdict.substr(1));
  }
  std::vector<std::string> out;
  verdict.remove_prefix(1);
  uint64_t count = 0;
  if (verdict.size() < sizeof(count)) {
    return absl::InternalError("bootstrap verdict is truncated");
  }
  std::memcpy(&count, verdict.data(), sizeof(count));
  verdict.remove_prefix(sizeof(count));
  if (count != static_cast<uint64_t>(size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank 0 collected ", count,
                     " ranks but this rank was told the job "
                     "has ",
                     size, " (WORLD_SIZE differs between ranks?)"));
  }
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

StoreBootstrap::StoreBootstrap(std::shared_ptr<Store> store, int rank, int size,
                               std::string prefix, std::string reason,
                               std::string gloo_host)
    : store_(std::move(store)),
      rank_(rank),
      size_(size),
      prefix_(std::move(prefix)),
      reason_(std::move(reason)),
      gloo_host_(std::move(gloo_host)) {}

absl::StatusOr<std::vector<std::string>> StoreBootstrap::all_gather(
    absl::string_view data, absl::Time deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_) {
    return absl::FailedPreconditionError(
        "the store bootstrap failed an earlier round (see that error): the "
        "ranks no longer agree on where they are; end the job or start a "
        "new bootstrap");
  }
  const std::string round = absl::StrCat(prefix_, "/ag/", round_++);
  auto result = Round(round, data, deadline);
  if (!result.ok()) broken_ = true;
  return result;
}

absl::StatusOr<std::vector<std::string>> StoreBootstrap::Round(
    const std::string& round, absl::string_view data, absl::Time deadline) {
  const std::string verdict_key = absl::StrCat(round, "/verdict");
  auto ack_key = [&](int r) { return absl::StrCat(round, "/ack/", r); };
  absl::Status status = store_->set(absl::StrCat(round, "/", rank_), data);
  if (!status.ok()) return status;

  if (rank_ != 0) {
    // Rank 0 decides; wait for its verdict a little past our own deadline.
    std::string proposal;
    status = store_->wait({verdict_key}, deadline + grace_);
    if (absl::IsAlreadyExists(status)) {
      // The store failed the job (a conflict) before rank 0 decided: we
      // propose it as the verdict, so that every rank reads one outcome
      // (rank 0's, should it have decided first).
      proposal = absl::StrCat("C", status.message());
    } else if (!status.ok() && !absl::IsDeadlineExceeded(status)) {
      return status;
    } else if (absl::IsDeadlineExceeded(status)) {
      proposal = absl::StrCat(
          "E",
          "rank 0 (which collects the ranks) gave no verdict before the "
          "deadline: rank 0 never arrived, or some rank did not; rank ",
          rank_, " gave up and every rank gets this error");
    }
    // One proposal wins (an empty one only reads); everybody reads the
    // winner, then tells rank 0, whose store must stay up until then.
    VEMESH_ASSIGN_OR_RETURN(
        auto winner, proposal.empty()
                         ? store_->get(verdict_key)
                         : store_->compare_set(verdict_key, "", proposal));
    (void)store_->set(ack_key(rank_), "");
    return Split(winner, size_);
  }

  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) keys.push_back(absl::StrCat(round, "/", r));
  std::vector<int> arrived;
  std::string proposal;
  auto values = store_->wait_get(keys, deadline);
  if (values.ok()) {
    proposal = Combine(*values);
    for (int r = 1; r < size_; ++r) arrived.push_back(r);
  } else if (absl::IsDeadlineExceeded(values.status())) {
    std::vector<int> missing;
    for (int r = 0; r < size_; ++r) {
      (store_->get(keys[r]).ok() ? arrived : missing).push_back(r);
    }
    if (!arrived.empty() && arrived.front() == 0)
      arrived.erase(arrived.begin());
    // Everybody came just after the deadline: the round is whole after all.
    auto late = missing.empty()
                    ? store_->wait_get(keys, absl::Now() + grace_)
                    : absl::StatusOr<std::vector<std::string>>(values.status());
    proposal =
        late.ok()
            ? Combine(*late)
            : absl::StrCat("E", "rank(s) ", FirstFew(missing), " of ", size_,
                           " never arrived before the deadline (rank 0 "
                           "gave up waiting); every rank gets this error");
  } else if (absl::IsAlreadyExists(values.status())) {
    // The store failed the job (a rank claimed twice, a rank's proof of the
    // token refused) while we waited: the late ranks read it as the
    // verdict.
    proposal = absl::StrCat("C", values.status().message());
  } else {
    return values.status();
  }
  if (!conflict_key_.empty()) {
    if (round_ == 1 && settle_ > absl::ZeroDuration()) {
      (void)store_->wait({conflict_key_}, absl::Now() + settle_);
    }
    if (auto conflict = store_->get(conflict_key_); conflict.ok()) {
      proposal = absl::StrCat("C", *conflict);
    }
  }
  VEMESH_ASSIGN_OR_RETURN(auto winner,
                          store_->compare_set(verdict_key, "", proposal));
  auto result = Split(winner, size_);
  // Keep the store up until the ranks that came have read the verdict: a
  // program that fails (or ends) right after this round must not take the
  // store away from them. Bounded by the grace: a rank that died after
  // setting its key is not waited for long.
  std::vector<std::string> acks;
  for (int r : arrived) acks.push_back(ack_key(r));
  if (absl::IsAlreadyExists(store_->wait(acks, absl::Now() + grace_)) &&
      winner[0] != 'C') {
    // A conflict answered the wait at once: still give the ranks the grace
    // to read the verdict before this store may go.
    absl::SleepFor(grace_);
  }
  // A conflict (two jobs on one store): the store stays up a little longer
  // to tell the late ranks of either job, who would otherwise wait for a
  // rank 0 that is gone.
  if (winner[0] == 'C') absl::SleepFor(grace_);
  return result;
}

absl::StatusOr<std::shared_ptr<Communicator>> StoreBootstrap::world(
    absl::Time deadline, absl::Duration op_timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> ranks(static_cast<size_t>(size_));
  std::iota(ranks.begin(), ranks.end(), 0);
  const std::string prefix = absl::StrCat(prefix_, "/world/", worlds_++);
  // Gloo has one timeout for its rendezvous and its operations: the
  // operations' bound, never less than what is left of the deadline. The
  // world connects its pairs on first use only: a mesh's groups connect
  // their own members (GlooCommunicator::subgroup), so that no rank holds a
  // socket per world member unless the world itself is used.
  VEMESH_ASSIGN_OR_RETURN(
      auto world,
      GlooCommunicator::CreateLazy(
          store_, prefix, rank_, size_, std::move(ranks),
          std::max(op_timeout, deadline - absl::Now()), gloo_host_));
  return std::shared_ptr<Communicator>(std::move(world));
}

}  // namespace vemesh
