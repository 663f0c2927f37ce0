// The semantics of store.h, checked on every Store: MemoryStore, PrefixStore
// over it, TcpStore (a TcpStoreServer on 127.0.0.1), RedisStore (a
// redis-server of this test's own on 127.0.0.1) and PrefixStore over each.
// A backend hands out clients; for TcpStore and RedisStore each is its own
// connection, so "another client" is really another socket. Leases are
// checked where the store has them, and answer Unimplemented elsewhere.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "redis_server.h"
#include "vemesh/rendezvous/memory_store.h"
#include "vemesh/rendezvous/prefix_store.h"
#include "vemesh/rendezvous/redis/redis_store.h"
#include "vemesh/rendezvous/store.h"
#include "vemesh/rendezvous/tcp/tcp_store.h"
#include "vemesh/rendezvous/tcp/tcp_store_server.h"

namespace vemesh {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A store and the clients of it.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::shared_ptr<Store> NewClient() = 0;
  // Whether set_lease works (else it is Unimplemented).
  virtual bool has_leases() const = 0;
};

class MemoryBackend : public Backend {
 public:
  std::shared_ptr<Store> NewClient() override { return store_; }
  bool has_leases() const override { return true; }

 private:
  std::shared_ptr<MemoryStore> store_ = std::make_shared<MemoryStore>();
};

class TcpBackend : public Backend {
 public:
  TcpBackend() {
    auto server = TcpStoreServer::Start("127.0.0.1", 0);
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) server_ = *std::move(server);
  }
  std::shared_ptr<Store> NewClient() override {
    if (server_ == nullptr) return nullptr;
    auto store = TcpStore::Connect("127.0.0.1", server_->port(),
                                   absl::Now() + absl::Seconds(10));
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return nullptr;
    return std::shared_ptr<Store>(*std::move(store));
  }
  bool has_leases() const override { return false; }

 private:
  std::unique_ptr<TcpStoreServer> server_;
};

// One redis-server for the whole binary (ctest runs each case in a process
// of its own); each backend works under a key prefix of its own, so no case
// sees another's keys.
const absl::StatusOr<std::unique_ptr<testing::RedisServer>>& SharedRedis() {
  static const absl::StatusOr<std::unique_ptr<testing::RedisServer>> server =
      testing::RedisServer::Start();
  return server;
}

class RedisBackend : public Backend {
 public:
  RedisBackend() {
    static std::atomic<int> backends{0};
    prefix_ = absl::StrCat("conformance/", backends++, "/");
  }
  std::shared_ptr<Store> NewClient() override {
    const auto& server = SharedRedis();
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return nullptr;
    RedisStoreOptions options;
    options.key_prefix = prefix_;
    auto store = RedisStore::Connect((*server)->address(), options);
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return nullptr;
    return *std::move(store);
  }
  bool has_leases() const override { return true; }

 private:
  std::string prefix_;
};

class PrefixBackend : public Backend {
 public:
  explicit PrefixBackend(std::unique_ptr<Backend> base)
      : base_(std::move(base)) {}
  std::shared_ptr<Store> NewClient() override {
    std::shared_ptr<Store> base = base_->NewClient();
    if (base == nullptr) return nullptr;
    return std::make_shared<PrefixStore>(base, "job/7");
  }
  bool has_leases() const override { return base_->has_leases(); }

 private:
  std::unique_ptr<Backend> base_;
};

struct BackendCase {
  std::string name;
  std::function<std::unique_ptr<Backend>()> make;
};

class StoreConformanceTest : public ::testing::TestWithParam<BackendCase> {
 protected:
  void SetUp() override {
    backend_ = GetParam().make();
    store_ = backend_->NewClient();
    ASSERT_NE(store_, nullptr);
  }
  std::shared_ptr<Store> Other() {
    std::shared_ptr<Store> other = backend_->NewClient();
    EXPECT_NE(other, nullptr);
    return other;
  }

  // For stores with leases, true. For the others, checks that set_lease
  // is Unimplemented and says so, and returns false: the case ends there.
  bool HasLeasesOrIsUnimplemented() {
    if (backend_->has_leases()) return true;
    absl::Status status = store_->set_lease("lease", "1", absl::Seconds(1));
    EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
    EXPECT_THAT(status.message(), HasSubstr("no expiring keys"));
    EXPECT_EQ(store_->get("lease").status().code(),
              absl::StatusCode::kNotFound);
    return false;
  }
  // Polls get() until `key` is absent, for at most `limit`.
  bool GoesAway(absl::string_view key, absl::Duration limit) {
    const absl::Time give_up = absl::Now() + limit;
    while (absl::Now() < give_up) {
      absl::StatusOr<std::string> value = store_->get(key);
      if (value.status().code() == absl::StatusCode::kNotFound) return true;
      EXPECT_TRUE(value.ok()) << value.status();
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  std::unique_ptr<Backend> backend_;
  std::shared_ptr<Store> store_;
};

TEST_P(StoreConformanceTest, SetThenGetReturnsTheBytes) {
  ASSERT_TRUE(store_->set("a", "1").ok());
  EXPECT_EQ(*store_->get("a"), "1");
  const std::string binary("\0\xff\x01zz\0", 6);
  ASSERT_TRUE(store_->set("binary", binary).ok());
  EXPECT_EQ(*store_->get("binary"), binary);
  ASSERT_TRUE(store_->set("empty", "").ok());
  EXPECT_EQ(*store_->get("empty"), "");
}

TEST_P(StoreConformanceTest, SetReplacesAndIsSeenByOtherClients) {
  std::shared_ptr<Store> other = Other();
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(store_->set("k", "old").ok());
  ASSERT_TRUE(store_->set("k", "new").ok());
  EXPECT_EQ(*other->get("k"), "new");
}

TEST_P(StoreConformanceTest, GetOfMissingKeyIsNotFoundNamingIt) {
  absl::StatusOr<std::string> value = store_->get("nobody/set/this");
  EXPECT_EQ(value.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(value.status().message(), HasSubstr("nobody/set/this"));
}

TEST_P(StoreConformanceTest, WaitForPresentKeysReturnsAtOnce) {
  ASSERT_TRUE(store_->set("x", "1").ok());
  ASSERT_TRUE(store_->set("y", "2").ok());
  const absl::Time start = absl::Now();
  EXPECT_TRUE(store_->wait({"x", "y"}, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_TRUE(store_->wait({}, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_P(StoreConformanceTest, WaitTimesOutNamingOnlyTheMissingKeys) {
  ASSERT_TRUE(store_->set("here", "1").ok());
  const absl::Time start = absl::Now();
  absl::Status status =
      store_->wait({"here", "never"}, absl::Now() + absl::Milliseconds(200));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(), HasSubstr("never"));
  EXPECT_THAT(status.message(), Not(HasSubstr("here")));
  EXPECT_GE(took, absl::Milliseconds(150));
  EXPECT_LT(took, absl::Seconds(5));
}

TEST_P(StoreConformanceTest, WaitWithPastDeadlineFailsAtOnce) {
  absl::Status status = store_->wait({"never"}, absl::Now() - absl::Seconds(1));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
}

TEST_P(StoreConformanceTest, WaitIsReleasedBySetsFromAnotherClient) {
  std::shared_ptr<Store> other = Other();
  ASSERT_NE(other, nullptr);
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_TRUE(other->set("first", "1").ok());
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_TRUE(other->set("second", "2").ok());
  });
  const absl::Time start = absl::Now();
  absl::Status status =
      store_->wait({"first", "second"}, absl::Now() + absl::Seconds(20));
  setter.join();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST_P(StoreConformanceTest, WaitGetReturnsValuesInKeyOrder) {
  std::shared_ptr<Store> other = Other();
  ASSERT_NE(other, nullptr);
  std::thread setter([&] {
    for (int i = 3; i >= 0; --i) {
      EXPECT_TRUE(
          other->set(absl::StrCat("rank/", i), absl::StrCat("v", i)).ok());
    }
  });
  absl::StatusOr<std::vector<std::string>> values =
      store_->wait_get({"rank/0", "rank/1", "rank/2", "rank/3"},
                       absl::Now() + absl::Seconds(20));
  setter.join();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ::testing::ElementsAre("v0", "v1", "v2", "v3"));
}

TEST_P(StoreConformanceTest, WaitGetTimesOutNamingTheMissingKey) {
  ASSERT_TRUE(store_->set("present", "1").ok());
  absl::StatusOr<std::vector<std::string>> values = store_->wait_get(
      {"present", "absent"}, absl::Now() + absl::Milliseconds(100));
  EXPECT_EQ(values.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(values.status().message(), HasSubstr("absent"));
}

TEST_P(StoreConformanceTest, AddCountsFromZeroAndWraps) {
  EXPECT_EQ(*store_->add("n", 5), 5);
  EXPECT_EQ(*store_->add("n", -2), 3);
  EXPECT_EQ(*store_->get("n"), "3");
  EXPECT_EQ(*store_->add("n", 0), 3);
  ASSERT_TRUE(store_->set("max", absl::StrCat(INT64_MAX)).ok());
  EXPECT_EQ(*store_->add("max", 1), INT64_MIN);
}

TEST_P(StoreConformanceTest, AddOnEmptyValueCountsFromZero) {
  ASSERT_TRUE(store_->set("e", "").ok());
  EXPECT_EQ(*store_->add("e", 2), 2);
  EXPECT_EQ(*store_->get("e"), "2");
}

TEST_P(StoreConformanceTest,
       AddOnNonCounterIsInvalidArgumentAndChangesNothing) {
  ASSERT_TRUE(store_->set("s", "hello").ok());
  absl::StatusOr<int64_t> n = store_->add("s", 1);
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(n.status().message(), HasSubstr("s' holds"));
  EXPECT_EQ(*store_->get("s"), "hello");
}

TEST_P(StoreConformanceTest, AddReleasesAWaiter) {
  std::shared_ptr<Store> other = Other();
  ASSERT_NE(other, nullptr);
  std::thread adder([&] {
    absl::SleepFor(absl::Milliseconds(30));
    EXPECT_TRUE(other->add("arrived", 1).ok());
  });
  EXPECT_TRUE(store_->wait({"arrived"}, absl::Now() + absl::Seconds(20)).ok());
  adder.join();
}

TEST_P(StoreConformanceTest, CompareSetSemantics) {
  // Absent equals "": the first writer wins.
  EXPECT_EQ(*store_->compare_set("epoch", "", "7"), "7");
  // A stale expectation changes nothing and says what is there.
  EXPECT_EQ(*store_->compare_set("epoch", "5", "6"), "7");
  EXPECT_EQ(*store_->get("epoch"), "7");
  EXPECT_EQ(*store_->compare_set("epoch", "7", "8"), "8");
  EXPECT_EQ(*store_->get("epoch"), "8");
  // Absent and not expected empty: stays absent.
  EXPECT_EQ(*store_->compare_set("unset", "x", "y"), "");
  EXPECT_EQ(store_->get("unset").status().code(), absl::StatusCode::kNotFound);
}

TEST_P(StoreConformanceTest, RemoveSaysWhetherTheKeyExisted) {
  ASSERT_TRUE(store_->set("gone", "1").ok());
  EXPECT_TRUE(*store_->remove("gone"));
  EXPECT_FALSE(*store_->remove("gone"));
  EXPECT_EQ(store_->get("gone").status().code(), absl::StatusCode::kNotFound);
}

TEST_P(StoreConformanceTest, BoundsAreRefusedAsInvalidArgument) {
  const std::string long_key(kMaxStoreKeyBytes + 1, 'k');
  EXPECT_EQ(store_->set("", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->set(long_key, "v").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->get("").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->add(long_key, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->remove("").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->wait({"ok", ""}, absl::Now() + absl::Seconds(1)).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<std::string> too_many(kMaxStoreKeysPerCall + 1, "k");
  EXPECT_EQ(store_->wait(too_many, absl::Now() + absl::Seconds(1)).code(),
            absl::StatusCode::kInvalidArgument);
  const std::string huge(kMaxStoreValueBytes + 1, 'v');
  absl::Status status = store_->set("big", huge);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat(kMaxStoreValueBytes)));
  EXPECT_EQ(store_->compare_set("big", "", huge).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->get("big").status().code(), absl::StatusCode::kNotFound);
}

TEST_P(StoreConformanceTest, ConcurrentAddsFromManyClientsAreAtomic) {
  constexpr int kThreads = 16;
  constexpr int kAdds = 25;
  std::vector<std::shared_ptr<Store>> clients;
  for (int t = 0; t < kThreads; ++t) {
    clients.push_back(Other());
    ASSERT_NE(clients.back(), nullptr);
  }
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAdds; ++i) {
        absl::StatusOr<int64_t> n = clients[t]->add("counter", 1);
        EXPECT_TRUE(n.ok()) << n.status();
        if (n.ok()) seen[t].push_back(*n);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  absl::flat_hash_set<int64_t> distinct;
  for (const auto& values : seen) distinct.insert(values.begin(), values.end());
  EXPECT_EQ(distinct.size(), size_t{kThreads * kAdds});
  EXPECT_EQ(*store_->get("counter"), absl::StrCat(kThreads * kAdds));
}

TEST_P(StoreConformanceTest, LeaseIsThereThenExpires) {
  if (!HasLeasesOrIsUnimplemented()) return;
  const absl::Time set_at = absl::Now();
  ASSERT_TRUE(
      store_->set_lease("heartbeat", "alive", absl::Milliseconds(200)).ok());
  absl::StatusOr<std::string> value = store_->get("heartbeat");
  // Unless this thread stalled for most of the ttl in between.
  if (absl::Now() - set_at < absl::Milliseconds(150)) {
    EXPECT_EQ(value.value_or("<absent>"), "alive") << value.status();
  }
  EXPECT_TRUE(GoesAway("heartbeat", absl::Seconds(5)));
}

TEST_P(StoreConformanceTest, RefreshedLeaseStays) {
  if (!HasLeasesOrIsUnimplemented()) return;
  // Refreshed every 100 ms for longer than its 1 s ttl: a heartbeat.
  const absl::Time start = absl::Now();
  while (absl::Now() - start < absl::Milliseconds(1500)) {
    ASSERT_TRUE(store_->set_lease("heartbeat", "alive", absl::Seconds(1)).ok());
    EXPECT_EQ(store_->get("heartbeat").value_or("<absent>"), "alive");
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(store_->get("heartbeat").value_or("<absent>"), "alive");
}

TEST_P(StoreConformanceTest, ExpiredKeyIsAbsentToEveryMethod) {
  if (!HasLeasesOrIsUnimplemented()) return;
  // 1 us: shorter than Redis's millisecond, which rounds it up.
  for (const char* key : {"gone/a", "gone/b", "gone/c", "gone/last"}) {
    ASSERT_TRUE(store_->set_lease(key, "7", absl::Microseconds(1)).ok());
  }
  // The others were set, so expire, before the last.
  ASSERT_TRUE(GoesAway("gone/last", absl::Seconds(5)));
  // Named as missing even behind a key that never was.
  absl::Status status = store_->wait({"gone/never", "gone/a"},
                                     absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(), HasSubstr("gone/never"));
  EXPECT_THAT(status.message(), HasSubstr("gone/a"));
  EXPECT_EQ(store_->wait_get({"gone/a"}, absl::Now() + absl::Milliseconds(20))
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(*store_->remove("gone/a"));
  // Absent equals "" and counts as 0.
  EXPECT_EQ(*store_->compare_set("gone/b", "", "new"), "new");
  EXPECT_EQ(*store_->add("gone/c", 1), 1);
}

TEST_P(StoreConformanceTest, SetAndCompareSetEndALeaseAndAddKeepsIt) {
  if (!HasLeasesOrIsUnimplemented()) return;
  const absl::Duration ttl = absl::Milliseconds(150);
  ASSERT_TRUE(store_->set_lease("set", "1", ttl).ok());
  ASSERT_TRUE(store_->set_lease("cas", "x", ttl).ok());
  ASSERT_TRUE(store_->set_lease("counter", "5", ttl).ok());
  ASSERT_TRUE(store_->set("set", "2").ok());
  EXPECT_EQ(*store_->compare_set("cas", "x", "y"), "y");
  EXPECT_EQ(*store_->add("counter", 1), 6);
  // The counter keeps its lease; once it is gone, the others' would have
  // run out too, had they kept theirs.
  EXPECT_TRUE(GoesAway("counter", absl::Seconds(5)));
  EXPECT_EQ(store_->get("set").value_or("<absent>"), "2");
  EXPECT_EQ(store_->get("cas").value_or("<absent>"), "y");
}

TEST_P(StoreConformanceTest, LeaseReleasesAWaiter) {
  if (!HasLeasesOrIsUnimplemented()) return;
  std::shared_ptr<Store> other = Other();
  ASSERT_NE(other, nullptr);
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(30));
    EXPECT_TRUE(other->set_lease("alive/1", "1", absl::Seconds(30)).ok());
  });
  EXPECT_TRUE(store_->wait({"alive/1"}, absl::Now() + absl::Seconds(20)).ok());
  setter.join();
}

TEST_P(StoreConformanceTest, LeaseBoundsAreRefusedAsInvalidArgument) {
  if (!HasLeasesOrIsUnimplemented()) return;
  for (absl::Duration ttl :
       {absl::ZeroDuration(), absl::Seconds(-1),
        kMaxStoreLease + absl::Milliseconds(1), absl::InfiniteDuration()}) {
    absl::Status status = store_->set_lease("bad", "1", ttl);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << ttl;
    EXPECT_THAT(
        status.message(),
        HasSubstr(absl::StrCat("lease ttl ", absl::FormatDuration(ttl))));
  }
  EXPECT_EQ(store_->get("bad").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->set_lease("", "1", absl::Seconds(1)).code(),
            absl::StatusCode::kInvalidArgument);
  const std::string huge(kMaxStoreValueBytes + 1, 'v');
  EXPECT_EQ(store_->set_lease("big", huge, absl::Seconds(1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->get("big").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store_->set_lease("day", "1", kMaxStoreLease).ok());
  EXPECT_EQ(*store_->get("day"), "1");
}

INSTANTIATE_TEST_SUITE_P(
    Stores, StoreConformanceTest,
    ::testing::Values(
        BackendCase{"Memory", [] { return std::make_unique<MemoryBackend>(); }},
        BackendCase{"PrefixOverMemory",
                    [] {
                      return std::make_unique<PrefixBackend>(
                          std::make_unique<MemoryBackend>());
                    }},
        BackendCase{"Tcp", [] { return std::make_unique<TcpBackend>(); }},
        BackendCase{"PrefixOverTcp",
                    [] {
                      return std::make_unique<PrefixBackend>(
                          std::make_unique<TcpBackend>());
                    }},
        BackendCase{"Redis", [] { return std::make_unique<RedisBackend>(); }},
        BackendCase{"PrefixOverRedis",
                    [] {
                      return std::make_unique<PrefixBackend>(
                          std::make_unique<RedisBackend>());
                    }}),
    [](const ::testing::TestParamInfo<BackendCase>& info) {
      return info.param.name;
    });

TEST(PrefixStoreTest, KeysLandUnderThePrefixAndPrefixesDoNotMix) {
  auto base = std::make_shared<MemoryStore>();
  PrefixStore one(base, "init/1");
  PrefixStore two(base, "init/2");
  ASSERT_TRUE(one.set("host/0", "node7").ok());
  EXPECT_EQ(*base->get("init/1/host/0"), "node7");
  EXPECT_EQ(two.get("host/0").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(two.wait({"host/0"}, absl::Now() + absl::Milliseconds(20)).code(),
            absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace vemesh
