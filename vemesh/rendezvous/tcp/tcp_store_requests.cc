// TcpStoreServer's requests: each store operation on the table, and the
// WAITs parked on a missing key until a write or their deadline.

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "vemesh/rendezvous/memory_store.h"
#include "vemesh/rendezvous/tcp/internal/store_server_loop.h"
#include "vemesh/rendezvous/tcp/wire.h"

namespace vemesh {

void TcpStoreServer::Loop::Handle(Connection& c, StoreRequest r) {
  StoreReply reply;
  if (absl::Status refused = Refusal(c, r); !refused.ok()) {
    ReplyStatus(c, std::move(refused));
    return;
  }
  switch (r.op) {
    case StoreOp::kHello:
      Hello(c, r);
      return;
    case StoreOp::kAuth:
      Auth(c, r);
      return;
    case StoreOp::kSet: {
      auto it = table_.find(r.keys[0]);
      const size_t old = it == table_.end() ? 0 : it->second.size();
      const size_t limit = r.value.size() > kReadChunkBytes
                               ? LargeLimit()
                               : options_.max_total_bytes;
      if (r.value.size() > old &&
          table_bytes_ + (r.value.size() - old) + r.keys[0].size() > limit) {
        ReplyStatus(c, absl::ResourceExhaustedError(
                           absl::StrCat(BudgetText(r.value.size()), " (SET '",
                                        r.keys[0].substr(0, 64), "')")));
        return;
      }
      Put(r.keys[0], std::move(r.value));
      Reply(c, std::move(reply));
      Notify(r.keys[0]);
      if (!options_.conflict_key.empty() && r.keys[0] == options_.conflict_key)
        FailWaits(table_[r.keys[0]]);
      return;
    }
    case StoreOp::kGet: {
      size_t bytes = 0;
      for (const std::string& key : r.keys) {
        auto it = table_.find(key);
        if (it != table_.end()) bytes += it->second.size();
      }
      if (bytes > kReadChunkBytes &&
          table_bytes_ + buffered_bytes_ + bytes > LargeLimit()) {
        ReplyStatus(c, absl::ResourceExhaustedError(
                           absl::StrCat(BudgetText(bytes), " (GET reply)")));
        return;
      }
    }
      reply.values.reserve(r.keys.size());
      for (const std::string& key : r.keys) {
        auto it = table_.find(key);
        if (it == table_.end()) {
          ReplyStatus(c, absl::NotFoundError(
                             absl::StrCat("store has no key '", key, "'")));
          return;
        }
        reply.values.push_back(it->second);
      }
      Reply(c, std::move(reply));
      return;
    case StoreOp::kWait: {
      const size_t missing = FirstMissing(r.keys, 0);
      if (missing == r.keys.size()) {
        Reply(c, std::move(reply));
      } else if (const std::string* conflict = Conflict();
                 conflict != nullptr && JobKey(r.keys[missing])) {
        // The job failed: nobody it waits for is coming.
        ReplyStatus(c, absl::AlreadyExistsError(*conflict));
      } else if (r.timeout_ms == 0) {
        ReplyStatus(c, absl::DeadlineExceededError(absl::StrCat(
                           "store keys never set before the deadline: ",
                           MissingKeysText(r.keys, table_))));
      } else {
        c.waiter = Waiter{std::move(r.keys), missing,
                          absl::Now() + absl::Milliseconds(r.timeout_ms)};
        Park(c, missing);
        deadlines_.emplace(c.waiter->deadline, c.id);
      }
      return;
    }
    case StoreOp::kAdd: {
      const std::string& key = r.keys[0];
      auto it = table_.find(key);
      absl::StatusOr<int64_t> current = ParseCounter(
          key, it == table_.end() ? absl::string_view() : it->second);
      if (!current.ok()) {
        ReplyStatus(c, current.status());
        return;
      }
      // Wraps like a two's-complement counter, as MemoryStore does.
      const int64_t value = static_cast<int64_t>(
          static_cast<uint64_t>(*current) + static_cast<uint64_t>(r.delta));
      reply.values.push_back(absl::StrCat(value));
      Put(key, reply.values.back());
      Reply(c, std::move(reply));
      Notify(key);
      return;
    }
    case StoreOp::kCompareSet: {
      const std::string& key = r.keys[0];
      auto it = table_.find(key);
      const absl::string_view current = it == table_.end()
                                            ? absl::string_view()
                                            : absl::string_view(it->second);
      if (current != r.expected) {
        reply.values.emplace_back(current);
        Reply(c, std::move(reply));
        return;
      }
      if (r.value.size() > current.size() &&
          table_bytes_ + (r.value.size() - current.size()) >
              options_.max_total_bytes) {
        ReplyStatus(c, absl::ResourceExhaustedError(absl::StrCat(
                           BudgetText(r.value.size()), " (COMPARE_SET '",
                           key.substr(0, 64), "')")));
        return;
      }
      reply.values.push_back(r.value);
      Put(key, std::move(r.value));
      Reply(c, std::move(reply));
      Notify(key);
      if (!options_.conflict_key.empty() && key == options_.conflict_key)
        FailWaits(table_[key]);
      return;
    }
    case StoreOp::kRemove: {
      auto it = table_.find(r.keys[0]);
      const bool found = it != table_.end();
      if (found) {
        table_bytes_ -= it->first.size() + it->second.size();
        table_.erase(it);
      }
      reply.values.push_back(found ? "1" : "0");
      Reply(c, std::move(reply));
      return;
    }
    case StoreOp::kPing:
      Reply(c, std::move(reply));
      return;
  }
}

size_t TcpStoreServer::Loop::FirstMissing(const std::vector<std::string>& keys,
                                          size_t from) const {
  for (size_t i = from; i < keys.size(); ++i) {
    if (!table_.contains(keys[i])) return i;
  }
  return keys.size();
}

void TcpStoreServer::Loop::Park(Connection& c, size_t missing) {
  c.waiter->next = missing;
  parked_[c.waiter->keys[missing]].push_back(c.id);
}

void TcpStoreServer::Loop::Unpark(Connection& c) {
  if (!c.waiter) return;
  auto it = parked_.find(c.waiter->keys[c.waiter->next]);
  if (it != parked_.end()) {
    std::vector<uint64_t>& ids = it->second;
    auto pos = std::find(ids.begin(), ids.end(), c.id);
    if (pos != ids.end()) {
      *pos = ids.back();
      ids.pop_back();
    }
    if (ids.empty()) parked_.erase(it);
  }
  deadlines_.erase({c.waiter->deadline, c.id});
  c.waiter.reset();
}

void TcpStoreServer::Loop::Notify(const std::string& key) {
  auto it = parked_.find(key);
  if (it == parked_.end()) return;
  const std::vector<uint64_t> ids = std::move(it->second);
  parked_.erase(it);
  for (uint64_t id : ids) {
    Connection* c = Find(id);
    if (c == nullptr || !c->waiter) continue;
    Waiter& w = *c->waiter;
    size_t missing = FirstMissing(w.keys, w.next);
    // A REMOVE may have taken back a key passed earlier.
    if (missing == w.keys.size()) missing = FirstMissing(w.keys, 0);
    if (missing < w.keys.size()) {
      Park(*c, missing);
      continue;
    }
    deadlines_.erase({w.deadline, id});
    c->waiter.reset();
    Reply(*c, StoreReply());
    MakeReady(*c);  // it may have more requests buffered; flushes the reply
  }
}

void TcpStoreServer::Loop::ExpireWaits() {
  const absl::Time now = absl::Now();
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    Connection* c = Find(deadlines_.begin()->second);
    if (c == nullptr || !c->waiter) {
      deadlines_.erase(deadlines_.begin());
      continue;
    }
    const std::string missing = MissingKeysText(c->waiter->keys, table_);
    Unpark(*c);
    ReplyStatus(*c,
                absl::DeadlineExceededError(absl::StrCat(
                    "store keys never set before the deadline: ", missing)));
    MakeReady(*c);
  }
}

void TcpStoreServer::Loop::MakeReady(Connection& c) {
  Touch(c);  // a WAIT just answered: not idle while its reply goes out
  if (c.queued) return;
  c.queued = true;
  ready_.push_back(c.id);
}

void TcpStoreServer::Loop::RunReady() {
  // Processing one connection can release WAITs of others: until none left.
  while (!ready_.empty()) {
    const uint64_t id = ready_.back();
    ready_.pop_back();
    Connection* c = Find(id);
    if (c == nullptr) continue;
    c->queued = false;
    Process(*c);
  }
}

}  // namespace vemesh
