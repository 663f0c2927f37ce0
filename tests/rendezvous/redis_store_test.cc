// RedisStore beyond the Store semantics (those are in
// store_conformance_test.cc): addresses, a Redis that is gone, stopped or
// silent, leases as Redis keeps them, Redis's own errors, many writers at
// once, and bounds checked before anything is sent. Every case has a
// redis-server of its own on 127.0.0.1, and every wait has a deadline.

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "redis_server.h"
#include "vemesh/rendezvous/redis/redis_store.h"
#include "vemesh/rendezvous/store.h"

namespace vemesh {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::vemesh::testing::RedisServer;

// A port nobody listens on: one the kernel just handed out and took back.
int ClosedPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

class RedisStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::shared_ptr<RedisStore> Client(RedisStoreOptions options = {}) {
    auto store = RedisStore::Connect(server_->address(), options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }
  static RedisStoreOptions Timeouts(absl::Duration connect, absl::Duration op) {
    RedisStoreOptions options;
    options.connect_timeout = connect;
    options.op_timeout = op;
    return options;
  }

  std::unique_ptr<RedisServer> server_;
};

TEST(RedisStoreAddressTest, MalformedAddressesAreInvalidArgumentNamingThem) {
  for (const char* address : {"",
                              "localhost",
                              "redis://",
                              "redis://host",
                              "host:",
                              ":6379",
                              "host:0",
                              "host:65536",
                              "host:-1",
                              "host:+80",
                              "host:12a",
                              "host:6379 ",
                              " host:6379",
                              "http://host:6379",
                              "redis://host:6379/0",
                              "::1:6379",
                              "[::1",
                              "[::1]",
                              "[::1]6379",
                              "[]:6379",
                              "[host]:6379",
                              "host:99999999999"}) {
    SCOPED_TRACE(address);
    auto store = RedisStore::Connect(address);
    EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument)
        << store.status();
    EXPECT_THAT(store.status().message(),
                HasSubstr(absl::StrCat("'", address, "'")));
    EXPECT_THAT(store.status().message(),
                HasSubstr("redis://HOST:PORT or HOST:PORT"));
  }
}

TEST(RedisStoreAddressTest, CredentialsNeedAColonAndAreNeverShown) {
  auto store = RedisStore::Connect("redis://hunter2@host:6379");
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(store.status().message(), HasSubstr("'redis://***@host:6379'"));
  EXPECT_THAT(store.status().message(), Not(HasSubstr("hunter2")));
  store = RedisStore::Connect("redis://alice:hunter2@host:99999");
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(store.status().message(), HasSubstr("'redis://alice:***@host"));
  EXPECT_THAT(store.status().message(), Not(HasSubstr("hunter2")));
}

// A Redis started with --requirepass and an ACL user (issue 29): the
// password and the user come from the address; a missing or wrong one is a
// clear error that never shows the password.
TEST(RedisStoreAuthTest, PasswordAndAclUserFromTheAddress) {
  auto server = RedisServer::Start({"--requirepass", "pw-29", "--user", "alice",
                                    "on", ">alice-pw", "~*", "+@all"});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string at = (*server)->address();
  auto store = RedisStore::Connect(absl::StrCat("redis://:pw-29@", at));
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE((*store)->set("k", "v").ok());
  EXPECT_EQ((*store)->get("k").value_or(""), "v");
  auto alice = RedisStore::Connect(absl::StrCat("redis://alice:alice-pw@", at));
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ((*alice)->get("k").value_or(""), "v");

  auto none = RedisStore::Connect(at);
  EXPECT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("redis://USER:PASSWORD@"));
  auto wrong = RedisStore::Connect(absl::StrCat("redis://alice:guess-29@", at));
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kUnauthenticated)
      << wrong.status();
  EXPECT_THAT(wrong.status().message(), HasSubstr("user 'alice'"));
  EXPECT_THAT(wrong.status().message(), Not(HasSubstr("guess-29")));
}

TEST(RedisStoreAddressTest, TimeoutsMustBePositiveAndFinite) {
  RedisStoreOptions options;
  options.connect_timeout = absl::ZeroDuration();
  auto store = RedisStore::Connect("127.0.0.1:6379", options);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(store.status().message(), HasSubstr("connect_timeout is 0"));
  options = {};
  options.op_timeout = absl::InfiniteDuration();
  store = RedisStore::Connect("127.0.0.1:6379", options);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(store.status().message(), HasSubstr("op_timeout is inf"));
}

TEST_F(RedisStoreTest, BothAddressFormsConnect) {
  for (const std::string& address :
       {server_->address(), absl::StrCat("redis://", server_->address())}) {
    auto store = RedisStore::Connect(address);
    ASSERT_TRUE(store.ok()) << address << ": " << store.status();
    EXPECT_EQ((*store)->address(), server_->address());
    EXPECT_TRUE((*store)->set("k", address).ok());
    EXPECT_EQ(*(*store)->get("k"), address);
  }
}

TEST(RedisStoreConnectTest, RefusedIsUnavailableNamingTheAddress) {
  const int port = ClosedPort();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  RedisStoreOptions options;
  options.connect_timeout = absl::Seconds(2);
  const absl::Time start = absl::Now();
  auto store = RedisStore::Connect(address, options);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable)
      << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr(address));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2) + absl::Seconds(5));
}

TEST(RedisStoreConnectTest, SilentServerIsUnavailableWithinTheOpTimeout) {
  // A listener that never accepts: the kernel completes the handshake, and
  // nothing ever answers PING.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 8), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string address = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  RedisStoreOptions options;
  options.op_timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  auto store = RedisStore::Connect(address, options);
  const absl::Duration took = absl::Now() - start;
  ::close(fd);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable)
      << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr(address));
  EXPECT_THAT(store.status().message(), HasSubstr("no answer within 300ms"));
  EXPECT_LT(took, absl::Seconds(10));
}

TEST_F(RedisStoreTest, KilledServerIsUnavailableAndEachCallReconnectsOnce) {
  std::shared_ptr<RedisStore> store =
      Client(Timeouts(absl::Seconds(2), absl::Seconds(2)));
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->set("k", "1").ok());
  server_->Kill();

  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> value = store->get("k");
  EXPECT_EQ(value.status().code(), absl::StatusCode::kUnavailable)
      << value.status();
  EXPECT_THAT(value.status().message(), HasSubstr(server_->address()));
  // The next call tries one fresh connection, which is refused.
  absl::Status status = store->set("k", "2");
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("after a lost connection"));
  EXPECT_THAT(status.message(), HasSubstr(server_->address()));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));

  // Redis is back (empty: nothing was saved): the next call connects.
  ASSERT_TRUE(server_->Restart().ok());
  EXPECT_EQ(store->get("k").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store->set("k", "3").ok());
  EXPECT_EQ(*store->get("k"), "3");
}

TEST_F(RedisStoreTest, LargeSetToAKilledServerIsUnavailableNotSigpipe) {
  std::shared_ptr<RedisStore> store =
      Client(Timeouts(absl::Seconds(2), absl::Seconds(5)));
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->set("k", "1").ok());
  server_->Kill();
  // More than the socket buffers hold: the writes go on after the peer's
  // reset, which is where write() raises SIGPIPE.
  const std::string big(32 << 20, 'v');
  for (int i = 0; i < 3; ++i) {
    absl::Status status = store->set("big", big);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  }
}

TEST_F(RedisStoreTest, StoppedServerIsUnavailableAfterTheOpTimeout) {
  std::shared_ptr<RedisStore> store =
      Client(Timeouts(absl::Seconds(2), absl::Milliseconds(300)));
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->set("k", "1").ok());
  ASSERT_EQ(::kill(server_->pid(), SIGSTOP), 0);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> value = store->get("k");
  const absl::Duration took = absl::Now() - start;
  ::kill(server_->pid(), SIGCONT);
  EXPECT_EQ(value.status().code(), absl::StatusCode::kUnavailable)
      << value.status();
  EXPECT_THAT(value.status().message(), HasSubstr("no answer within 300ms"));
  EXPECT_LT(took, absl::Seconds(10));
  // The connection was dropped; the next call makes a fresh one.
  EXPECT_EQ(*store->get("k"), "1");
}

TEST_F(RedisStoreTest, WaitOnAStoppedServerEndsByItsDeadlineNotTheOpTimeout) {
  std::shared_ptr<RedisStore> store =
      Client(Timeouts(absl::Seconds(2), absl::Seconds(60)));
  ASSERT_NE(store, nullptr);
  ASSERT_EQ(::kill(server_->pid(), SIGSTOP), 0);
  const absl::Time start = absl::Now();
  absl::Status status =
      store->wait({"never"}, absl::Now() + absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  ::kill(server_->pid(), SIGCONT);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(), HasSubstr("never"));
  EXPECT_LT(took, absl::Seconds(30));
}

TEST_F(RedisStoreTest, WaitLeavesTheConnectionToOtherThreadsBetweenPolls) {
  std::shared_ptr<RedisStore> store = Client();
  ASSERT_NE(store, nullptr);
  // One RedisStore for both threads: the setter's call gets through while
  // the waiter waits.
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_TRUE(store->set("ready", "1").ok());
  });
  absl::Status status = store->wait({"ready"}, absl::Now() + absl::Seconds(20));
  setter.join();
  EXPECT_TRUE(status.ok()) << status;
}

TEST_F(RedisStoreTest, LeaseIsRedisExpiryAndSetEndsIt) {
  RedisStoreOptions options;
  options.key_prefix = "job/";
  std::shared_ptr<RedisStore> store = Client(options);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->set_lease("alive/0", "1", absl::Seconds(10)).ok());
  absl::StatusOr<std::string> pttl = server_->RawCommand("PTTL job/alive/0");
  ASSERT_TRUE(pttl.ok()) << pttl.status();
  int64_t ms = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripPrefix(*pttl, ":"), &ms)) << *pttl;
  EXPECT_GT(ms, 0);
  EXPECT_LE(ms, 10000);
  ASSERT_TRUE(store->set("alive/0", "2").ok());
  EXPECT_EQ(server_->RawCommand("PTTL job/alive/0").value_or(""), ":-1");
}

TEST_F(RedisStoreTest, AddTakesWhatIncrbyRefusesLikeMemoryStore) {
  std::shared_ptr<RedisStore> store = Client();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->set("empty", "").ok());
  EXPECT_EQ(*store->add("empty", 2), 2);
  ASSERT_TRUE(store->set("signed", "+5").ok());
  EXPECT_EQ(*store->add("signed", 1), 6);
  EXPECT_EQ(*store->get("signed"), "6");
  // Past int64 it wraps, and a leased counter keeps its lease.
  ASSERT_TRUE(
      store->set_lease("max", absl::StrCat(INT64_MAX), absl::Seconds(30)).ok());
  EXPECT_EQ(*store->add("max", 1), INT64_MIN);
  const std::string pttl = server_->RawCommand("PTTL max").value_or("");
  EXPECT_NE(pttl, ":-1");
  EXPECT_NE(pttl, ":-2");
  absl::StatusOr<int64_t> n = store->add("signed", INT64_MAX);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, static_cast<int64_t>(uint64_t{6} + uint64_t{INT64_MAX}));
}

TEST_F(RedisStoreTest, RedisErrorsAreInternalWithRedisText) {
  std::shared_ptr<RedisStore> store = Client();
  ASSERT_NE(store, nullptr);
  // A key holding a list, which no Store method makes.
  ASSERT_EQ(server_->RawCommand("LPUSH list x").value_or(""), ":1");
  absl::StatusOr<std::string> value = store->get("list");
  EXPECT_EQ(value.status().code(), absl::StatusCode::kInternal)
      << value.status();
  EXPECT_THAT(value.status().message(), HasSubstr("WRONGTYPE"));
  EXPECT_THAT(value.status().message(), HasSubstr("GET 'list'"));
  absl::StatusOr<int64_t> n = store->add("list", 1);
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInternal) << n.status();
  EXPECT_THAT(n.status().message(), HasSubstr("WRONGTYPE"));
  absl::StatusOr<std::string> swapped = store->compare_set("list", "", "x");
  EXPECT_EQ(swapped.status().code(), absl::StatusCode::kInternal)
      << swapped.status();
  EXPECT_THAT(swapped.status().message(), HasSubstr("WRONGTYPE"));
  // The connection is fine after an error reply.
  EXPECT_TRUE(store->set("k", "1").ok());
  EXPECT_EQ(*store->get("k"), "1");
}

TEST_F(RedisStoreTest, KeyPrefixesKeepJobsApart) {
  RedisStoreOptions one_options;
  one_options.key_prefix = "job1/";
  RedisStoreOptions two_options;
  two_options.key_prefix = "job2/";
  std::shared_ptr<RedisStore> one = Client(one_options);
  std::shared_ptr<RedisStore> two = Client(two_options);
  std::shared_ptr<RedisStore> raw = Client();
  ASSERT_NE(one, nullptr);
  ASSERT_NE(two, nullptr);
  ASSERT_NE(raw, nullptr);
  ASSERT_TRUE(one->set("epoch", "1").ok());
  EXPECT_EQ(two->get("epoch").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*raw->get("job1/epoch"), "1");
  // Error texts name the key as the caller gave it.
  EXPECT_THAT(two->get("epoch").status().message(), HasSubstr("'epoch'"));
}

// A counter kept by compare_set loops alone: each write carries its
// writer's name, so a compare_set stored iff it returns exactly what that
// writer asked for.
TEST_F(RedisStoreTest, ConcurrentCompareSetFromEightThreadsIsExact) {
  constexpr int kThreads = 8;
  constexpr int kIncrements = 40;
  // Four threads with connections of their own, four sharing one.
  std::shared_ptr<RedisStore> shared = Client();
  ASSERT_NE(shared, nullptr);
  std::vector<std::shared_ptr<RedisStore>> clients;
  for (int t = 0; t < kThreads; ++t) {
    clients.push_back(t % 2 == 0 ? Client() : shared);
    ASSERT_NE(clients.back(), nullptr);
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  std::atomic<int> lost_rounds{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Store& store = *clients[t];
      std::string current;  // "" is the absent key, the count 0
      for (int i = 0; i < kIncrements && absl::Now() < give_up; ++i) {
        for (;;) {
          int64_t count = 0;
          if (!current.empty()) {
            const std::vector<std::string> parts = absl::StrSplit(current, '/');
            ASSERT_TRUE(absl::SimpleAtoi(parts[0], &count)) << current;
          }
          const std::string desired = absl::StrCat(count + 1, "/", t, "/", i);
          absl::StatusOr<std::string> now =
              store.compare_set("counter", current, desired);
          ASSERT_TRUE(now.ok()) << now.status();
          current = *now;
          if (*now == desired) break;
          ++lost_rounds;
          ASSERT_LT(absl::Now(), give_up) << "no progress";
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  absl::StatusOr<std::string> last = shared->get("counter");
  ASSERT_TRUE(last.ok()) << last.status();
  const std::vector<std::string> parts = absl::StrSplit(*last, '/');
  EXPECT_EQ(parts[0], absl::StrCat(kThreads * kIncrements));
  RecordProperty("compare_set_rounds_lost", lost_rounds.load());
}

TEST_F(RedisStoreTest, BoundsAreCheckedBeforeAnythingIsSent) {
  std::shared_ptr<RedisStore> store = Client();
  ASSERT_NE(store, nullptr);
  // With Redis gone, anything sent would be Unavailable: InvalidArgument
  // means the call stopped before the socket.
  server_->Kill();
  const std::string long_key(kMaxStoreKeyBytes + 1, 'k');
  const std::string huge(kMaxStoreValueBytes + 1, 'v');
  const std::vector<std::string> too_many(kMaxStoreKeysPerCall + 1, "k");
  const absl::Time deadline = absl::Now() + absl::Seconds(1);
  const absl::StatusCode invalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(store->set("", "v").code(), invalid);
  EXPECT_EQ(store->set("k", huge).code(), invalid);
  EXPECT_EQ(store->get(long_key).status().code(), invalid);
  EXPECT_EQ(store->add("", 1).status().code(), invalid);
  EXPECT_EQ(store->remove(long_key).status().code(), invalid);
  EXPECT_EQ(store->compare_set("k", huge, "v").status().code(), invalid);
  EXPECT_EQ(store->compare_set("k", "", huge).status().code(), invalid);
  EXPECT_EQ(store->wait(too_many, deadline).code(), invalid);
  EXPECT_EQ(store->wait_get({"k", ""}, deadline).status().code(), invalid);
  EXPECT_EQ(store->set_lease("k", "v", absl::ZeroDuration()).code(), invalid);
  EXPECT_EQ(store->set_lease("k", huge, absl::Seconds(1)).code(), invalid);
  // And the store is still there to say that Redis is gone.
  EXPECT_EQ(store->get("k").status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace vemesh
