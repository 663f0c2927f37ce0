#include "vemesh/elastic/internal/control_plane.h"

#include <algorithm>

#include <utility>

#include "absl/strings/str_cat.h"
#include "vemesh/elastic/internal/job_descriptor.h"

namespace vemesh {

ControlPlane::ControlPlane(std::shared_ptr<Store> store, std::string job,
                           int ranks_per_replica)
    : store_(std::move(store)),
      root_(absl::StrCat("vemesh/elastic/", job, "/")),
      ranks_per_replica_(ranks_per_replica) {}

absl::StatusOr<ControlPlane::Reading> ControlPlane::Read() const {
  // An unreachable store (Redis restarting) is retried with backoff within
  // the bound: a restart is ridden out in a step and in a recovery alike.
  const absl::Time until = absl::Now() + retry_for_;
  absl::Duration backoff = absl::Milliseconds(20);
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<Reading> r = ReadOnce();
    if (r.ok() || !absl::IsUnavailable(r.status()) || attempt >= 64 ||
        absl::Now() + backoff > until) {
      return r;
    }
    absl::SleepFor(backoff);
    backoff = std::min(2 * backoff, absl::Milliseconds(320));
  }
}

absl::StatusOr<ControlPlane::Reading> ControlPlane::ReadOnce() const {
  auto text = store_->get(root_ + "membership");
  if (absl::IsNotFound(text.status())) return Reading{};
  if (!text.ok()) return text.status();
  auto record = ParseMembership(*text);
  if (!record.ok()) return record.status();
  return Reading{*std::move(record), *std::move(text)};
}

absl::StatusOr<ControlPlane::Reading> ControlPlane::Transition(
    const Reading& from, const MembershipRecord& to) const {
  auto now = store_->compare_set(root_ + "membership", from.text,
                                 EncodeMembership(to));
  if (!now.ok()) return now.status();
  auto record = ParseMembership(*now);
  if (!record.ok()) return record.status();
  return Reading{*std::move(record), *std::move(now)};
}

absl::Status ControlPlane::CheckDescriptor(const std::string& mine,
                                           int replica) const {
  auto job = store_->compare_set(root_ + "descriptor", "", mine);
  if (!job.ok()) return job.status();
  if (*job == mine) return absl::OkStatus();
  const absl::Status differs = CompareJobDescriptors(mine, *job);
  if (differs.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "replica ", replica, " cannot join elastic job '", root_,
      "': it differs from the running job: ", differs.message(),
      " (relaunch it with the job's settings, or use another --job)"));
}

absl::Status ControlPlane::SetDescriptor(const std::string& descriptor) const {
  return store_->set(root_ + "descriptor", descriptor);
}

absl::Status ControlPlane::RestoreIfAbsent(
    const std::string& record_text, const std::string& descriptor) const {
  if (record_text.empty()) return absl::OkStatus();
  auto r = store_->compare_set(root_ + "membership", "", record_text);
  if (!r.ok()) return r.status();
  if (descriptor.empty()) return absl::OkStatus();
  return store_->compare_set(root_ + "descriptor", "", descriptor).status();
}

absl::Status ControlPlane::NoteStoreUp(absl::Duration grace) const {
  absl::StatusOr<std::string> up = store_->get(root_ + "store_up");
  if (up.ok()) return absl::OkStatus();
  if (!absl::IsNotFound(up.status())) return up.status();
  // The grace before the mark: whoever sees the mark sees the grace too
  // until it expires (two noters both start one; the later one counts).
  absl::Status s = store_->set_lease(root_ + "store_back", "1", grace);
  if (!s.ok()) return s;
  return store_->set(root_ + "store_up", "1");
}

absl::StatusOr<bool> ControlPlane::LeasesTrusted() const {
  absl::StatusOr<std::string> back = store_->get(root_ + "store_back");
  if (back.ok()) return false;
  if (!absl::IsNotFound(back.status())) return back.status();
  absl::StatusOr<std::string> up = store_->get(root_ + "store_up");
  if (up.ok()) return true;
  if (absl::IsNotFound(up.status())) return false;
  return up.status();
}

std::string ControlPlane::LeaseKey(int replica, uint64_t incarnation,
                                   int rank) const {
  return absl::StrCat(root_, "hb/", replica, "/", absl::Hex(incarnation), "/",
                      rank);
}

std::string ControlPlane::GroupPrefix(int64_t epoch, int pos) const {
  return absl::StrCat(root_, "epoch/", epoch, "/dp/", pos);
}

std::string ControlPlane::ProbeKey(int replica, uint64_t incarnation,
                                   int rank) const {
  std::string key =
      absl::StrCat(root_, "probe/", replica, "/", absl::Hex(incarnation));
  if (rank != 0) absl::StrAppend(&key, "/", rank);
  return key;
}

absl::StatusOr<std::vector<std::string>> ControlPlane::ProbeAddresses(
    int replica, uint64_t incarnation) const {
  const std::pair<int, uint64_t> id{replica, incarnation};
  {
    std::lock_guard<std::mutex> lock(probe_mu_);
    auto at = probe_addresses_.find(id);
    if (at != probe_addresses_.end()) return at->second;
  }
  std::vector<std::string> addresses(ranks_per_replica_);
  bool complete = true;
  for (int r = 0; r < ranks_per_replica_; ++r) {
    auto where = store_->get(ProbeKey(replica, incarnation, r));
    if (absl::IsNotFound(where.status())) {
      complete = false;
      continue;
    }
    if (!where.ok()) return where.status();
    addresses[r] = *std::move(where);
  }
  if (complete) {
    std::lock_guard<std::mutex> lock(probe_mu_);
    if (probe_addresses_.size() >= kProbeCacheEntries) probe_addresses_.clear();
    probe_addresses_.emplace(id, addresses);
  }
  return addresses;
}

absl::StatusOr<ControlPlane::ReplicaLiveness> ControlPlane::Probe(
    int replica, uint64_t incarnation, absl::Duration timeout) const {
  absl::StatusOr<std::vector<std::string>> addresses =
      ProbeAddresses(replica, incarnation);
  if (!addresses.ok()) return addresses.status();
  ReplicaLiveness all{Liveness::kListening, ""};
  for (int r = 0; r < ranks_per_replica_; ++r) {
    const std::string& where = (*addresses)[r];
    const Liveness v =
        where.empty() ? Liveness::kUnknown : ProbeLiveness(where, timeout);
    if (v == Liveness::kGone) return ReplicaLiveness{v, where};
    if (v == Liveness::kUnknown) all.liveness = Liveness::kUnknown;
    if (r == 0) all.address = where;
  }
  return all;
}

std::string ControlPlane::AliveKey(int64_t epoch, int replica) const {
  return absl::StrCat(root_, "epoch/", epoch, "/alive/", replica);
}

absl::StatusOr<bool> ControlPlane::Alive(int replica,
                                         uint64_t incarnation) const {
  for (int r = 0; r < ranks_per_replica_; ++r) {
    auto lease = store_->get(LeaseKey(replica, incarnation, r));
    if (absl::IsNotFound(lease.status())) return false;
    if (!lease.ok()) return lease.status();
  }
  return true;
}

absl::StatusOr<std::vector<int>> ControlPlane::AliveOf(
    const MembershipRecord& record, const std::vector<int>& ids) const {
  std::vector<int> alive;
  for (int id : ids) {
    auto up = Alive(id, record.incarnation_of(id));
    if (!up.ok()) return up.status();
    if (*up) alive.push_back(id);
  }
  return alive;
}

absl::StatusOr<std::unique_ptr<Heartbeat>> Heartbeat::Start(
    std::shared_ptr<Store> store, std::string key, absl::Duration ttl,
    std::function<void()> after_renewal) {
  // The first lease is taken here, so that a bad TTL or an unreachable
  // store fails the caller, and the replica is alive when Start returns.
  absl::Status first = store->set_lease(key, "1", ttl);
  if (!first.ok()) return first;
  std::unique_ptr<Heartbeat> hb(new Heartbeat(std::move(store), std::move(key),
                                              ttl, std::move(after_renewal)));
  hb->thread_ = std::thread([p = hb.get()] { p->Run(); });
  return hb;
}

Heartbeat::Heartbeat(std::shared_ptr<Store> store, std::string key,
                     absl::Duration ttl, std::function<void()> after_renewal)
    : store_(std::move(store)),
      key_(std::move(key)),
      ttl_(ttl),
      after_renewal_(std::move(after_renewal)),
      last_success_(absl::Now()) {}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  // The lease is left to expire: a replica that ends cleanly stops being
  // alive within the TTL, like one that dies (removing it would race with
  // a renewal in flight on a stopped store).
}

absl::Status Heartbeat::lost() const {
  std::lock_guard<std::mutex> lock(mu_);
  // By the age of the last renewal alone: a renewal blocked in the store
  // has no error yet, and its lease may be gone already.
  if (absl::Now() - last_success_ < ttl_) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("this rank's lease '", key_, "' was not renewed for ",
                   absl::FormatDuration(absl::Now() - last_success_), " (TTL ",
                   absl::FormatDuration(ttl_), "): ",
                   last_error_.ok() ? "a renewal is still waiting for the store"
                                    : std::string(last_error_.message())));
}

void Heartbeat::Run() {
  const absl::Duration period = ttl_ / 4;
  absl::Time due = absl::Now() + period;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    wake_.wait_for(lock, absl::ToChronoNanoseconds(due - absl::Now()),
                   [this] { return stop_; });
    if (stop_) break;
    // The next renewal is due a period after this one starts, not after it
    // ends: a slow store must not stretch the period.
    due = absl::Now() + period;
    lock.unlock();
    absl::Status s = store_->set_lease(key_, "1", ttl_);
    lock.lock();
    if (s.ok()) {
      last_success_ = absl::Now();
      last_error_ = absl::OkStatus();
      if (after_renewal_) {
        lock.unlock();
        after_renewal_();
        lock.lock();
      }
    } else {
      last_error_ = s;
    }
  }
}

}  // namespace vemesh
