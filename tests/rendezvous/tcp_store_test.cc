// TcpStoreServer and TcpStore beyond the Store semantics (those are in
// store_conformance_test.cc): ports, servers that are late or gone, clients
// that send garbage, many clients at once, and the per-call bounds.
// Everything runs on 127.0.0.1 and every wait has a deadline.

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
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
#include "vemesh/rendezvous/tcp/socket.h"
#include "vemesh/rendezvous/tcp/tcp_store.h"
#include "vemesh/rendezvous/tcp/tcp_store_server.h"
#include "vemesh/rendezvous/tcp/wire.h"

namespace vemesh {
namespace {

using ::testing::HasSubstr;

constexpr char kHost[] = "127.0.0.1";

std::unique_ptr<TcpStoreServer> StartServer(
    TcpStoreServerOptions options = {}) {
  auto server = TcpStoreServer::Start(kHost, 0, options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

std::unique_ptr<TcpStore> Client(int port) {
  auto store = TcpStore::Connect(kHost, port, absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

// A port nobody listens on: one the kernel just handed out and took back.
int ClosedPort() {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  return server == nullptr ? 1 : server->port();
}

// A plain blocking socket, to speak to the server as a misbehaving client.
UniqueFd RawConnect(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(
      ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

void SendRaw(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return;  // the server may already have closed us
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

// What the server sends until it closes the connection or `timeout` passes.
struct Received {
  std::string bytes;
  bool closed = false;
};
Received ReadUntilClosed(int fd, absl::Duration timeout) {
  Received r;
  const absl::Time deadline = absl::Now() + timeout;
  char buf[4096];
  while (absl::Now() < deadline) {
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, PollMillis(deadline)) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      r.closed = true;
      break;
    }
    r.bytes.append(buf, static_cast<size_t>(n));
  }
  return r;
}

// Replies parsed from `bytes` until `count` or the bytes run out.
std::vector<StoreReply> ReadReplies(int fd, size_t count,
                                    absl::Duration timeout) {
  std::vector<StoreReply> replies;
  std::string in;
  const absl::Time deadline = absl::Now() + timeout;
  char buf[4096];
  while (replies.size() < count && absl::Now() < deadline) {
    ParsedReply p = ParseReply(in);
    if (p.outcome == ParsedReply::kComplete) {
      replies.push_back(p.message);
      in.erase(0, p.consumed);
      continue;
    }
    if (p.outcome == ParsedReply::kMalformed) break;
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, PollMillis(deadline)) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    in.append(buf, static_cast<size_t>(n));
  }
  return replies;
}

// Polls `done` until it holds or 10 s pass.
template <typename F>
bool Eventually(F done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return done();
}

TEST(TcpStoreServerTest, EphemeralPortIsReported) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  EXPECT_GT(server->port(), 0);
  EXPECT_EQ(server->host(), kHost);
  std::unique_ptr<TcpStore> store = Client(server->port());
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->ping().ok());
}

TEST(TcpStoreServerTest, TakenPortIsAlreadyExistsNamingHostAndPort) {
  std::unique_ptr<TcpStoreServer> first = StartServer();
  ASSERT_NE(first, nullptr);
  auto second = TcpStoreServer::Start(kHost, first->port());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("127.0.0.1:", first->port())));
}

TEST(TcpStoreServerTest, BadPortsAreInvalidArgument) {
  EXPECT_EQ(TcpStoreServer::Start(kHost, 70000).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TcpStore::Connect(kHost, 0, absl::Now()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TcpStore::Connect(kHost, -1, absl::Now()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TcpStoreTest, ClosedPortIsUnavailableWithinTheDeadline) {
  const int port = ClosedPort();
  const absl::Time start = absl::Now();
  auto store =
      TcpStore::Connect(kHost, port, absl::Now() + absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(store.status().message(),
              HasSubstr(absl::StrCat("127.0.0.1:", port)));
  EXPECT_GE(took, absl::Milliseconds(250));  // it kept trying
  EXPECT_LT(took, absl::Seconds(3));
}

TEST(TcpStoreTest, ConnectWaitsForAServerThatStartsLater) {
  const int port = ClosedPort();
  std::unique_ptr<TcpStoreServer> server;
  std::thread starter([&] {
    absl::SleepFor(absl::Milliseconds(200));
    auto started = TcpStoreServer::Start(kHost, port);
    ASSERT_TRUE(started.ok()) << started.status();
    server = *std::move(started);
  });
  auto store = TcpStore::Connect(kHost, port, absl::Now() + absl::Seconds(20));
  starter.join();
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE((*store)->set("late", "but here").ok());
  EXPECT_EQ(*(*store)->get("late"), "but here");
}

TEST(TcpStoreTest, ServerStoppedWhileClientWaitsIsUnavailable) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<TcpStore> store = Client(server->port());
  ASSERT_NE(store, nullptr);
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(100));
    server->Stop();
  });
  const absl::Time start = absl::Now();
  absl::Status status = store->wait({"never"}, absl::Now() + absl::Seconds(30));
  stopper.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("127.0.0.1:", server->port())));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  // Later calls fail fast too: one reconnection attempt, refused.
  const absl::Time again = absl::Now();
  EXPECT_EQ(store->set("k", "v").code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - again, absl::Seconds(3));
}

TEST(TcpStoreServerTest, GarbageClientsAreClosedAndOthersKeepBeingServed) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<TcpStore> good = Client(server->port());
  ASSERT_NE(good, nullptr);
  ASSERT_TRUE(good->set("before", "1").ok());

  auto u32 = [](uint32_t v) {
    std::string out;
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
    return out;
  };
  const std::vector<std::pair<std::string, std::string>> garbage = {
      {"unknown op", u32(1) + "\x63"},
      {"huge length", u32(0xffffffffu)},
      {"empty frame", u32(0)},
      {"text", "GET / HTTP/1.1\r\nHost: x\r\n\r\n"},
      {"key count past the frame", u32(5) + "\x02" + u32(0x7fffffff)},
  };
  for (const auto& [name, bytes] : garbage) {
    SCOPED_TRACE(name);
    UniqueFd raw = RawConnect(server->port());
    SendRaw(raw.get(), bytes);
    Received r = ReadUntilClosed(raw.get(), absl::Seconds(10));
    EXPECT_TRUE(r.closed);
    EXPECT_EQ(r.bytes, "");  // no reply to garbage
    EXPECT_EQ(*good->get("before"), "1");
  }
  {
    // Half a frame, then hang up.
    UniqueFd raw = RawConnect(server->port());
    const std::string frame = *EncodeRequest([] {
      StoreRequest r;
      r.op = StoreOp::kSet;
      r.keys = {"half"};
      r.value = std::string(1000, 'v');
      return r;
    }());
    SendRaw(raw.get(), absl::string_view(frame).substr(0, frame.size() / 2));
  }
  EXPECT_TRUE(good->set("after", "2").ok());
  EXPECT_EQ(good->get("half").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Eventually([&] { return server->connections() == 1; }))
      << server->connections() << " connections open";
}

TEST(TcpStoreServerTest, PipelinedAndByteByByteRequestsAreAnsweredInOrder) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  UniqueFd raw = RawConnect(server->port());
  StoreRequest set;
  set.op = StoreOp::kSet;
  set.keys = {"k"};
  set.value = "v";
  StoreRequest get;
  get.op = StoreOp::kGet;
  get.keys = {"k"};
  StoreRequest missing = get;
  missing.keys = {"nope"};
  const std::string frames =
      *EncodeRequest(set) + *EncodeRequest(get) + *EncodeRequest(missing);
  SendRaw(raw.get(), frames);  // all three in one write
  std::vector<StoreReply> replies =
      ReadReplies(raw.get(), 3, absl::Seconds(10));
  ASSERT_EQ(replies.size(), 3u);
  EXPECT_EQ(replies[0].code, absl::StatusCode::kOk);
  EXPECT_THAT(replies[1].values, ::testing::ElementsAre("v"));
  EXPECT_EQ(replies[2].code, absl::StatusCode::kNotFound);

  const std::string one_frame = *EncodeRequest(get);
  for (char c : one_frame) SendRaw(raw.get(), std::string(1, c));
  replies = ReadReplies(raw.get(), 1, absl::Seconds(10));
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_THAT(replies[0].values, ::testing::ElementsAre("v"));
}

TEST(TcpStoreTest, SixtyFourClientThreadsAddConcurrently) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  constexpr int kClients = 64;
  constexpr int kAdds = 20;
  std::vector<std::vector<int64_t>> seen(kClients);
  std::vector<std::thread> threads;
  for (int t = 0; t < kClients; ++t) {
    threads.emplace_back([&, t] {
      std::unique_ptr<TcpStore> store = Client(server->port());
      if (store == nullptr) return;
      for (int i = 0; i < kAdds; ++i) {
        absl::StatusOr<int64_t> n = store->add("arrived", 1);
        EXPECT_TRUE(n.ok()) << n.status();
        if (n.ok()) seen[t].push_back(*n);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  absl::flat_hash_set<int64_t> distinct;
  for (const auto& values : seen) distinct.insert(values.begin(), values.end());
  EXPECT_EQ(distinct.size(), size_t{kClients * kAdds});
  std::unique_ptr<TcpStore> check = Client(server->port());
  ASSERT_NE(check, nullptr);
  EXPECT_EQ(*check->get("arrived"), absl::StrCat(kClients * kAdds));
}

TEST(TcpStoreTest, OneSetReleasesEveryWaiterAndTimeoutsAreIndependent) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  constexpr int kWaiters = 16;
  std::atomic<int> released{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&] {
      std::unique_ptr<TcpStore> store = Client(server->port());
      if (store == nullptr) return;
      absl::Status s = store->wait({"go"}, absl::Now() + absl::Seconds(20));
      EXPECT_TRUE(s.ok()) << s;
      if (s.ok()) released.fetch_add(1);
    });
  }
  // A short wait on another key times out while the others are parked.
  std::unique_ptr<TcpStore> impatient = Client(server->port());
  ASSERT_NE(impatient, nullptr);
  EXPECT_EQ(
      impatient->wait({"other"}, absl::Now() + absl::Milliseconds(50)).code(),
      absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(released.load(), 0);
  EXPECT_TRUE(impatient->set("go", "now").ok());
  for (std::thread& t : waiters) t.join();
  EXPECT_EQ(released.load(), kWaiters);
}

TEST(TcpStoreTest, AKeyRemovedAfterBeingSeenIsWaitedForAgain) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<TcpStore> waiter = Client(server->port());
  std::unique_ptr<TcpStore> writer = Client(server->port());
  ASSERT_NE(waiter, nullptr);
  ASSERT_NE(writer, nullptr);
  std::atomic<bool> done{false};
  absl::Status status;
  std::thread t([&] {
    status = waiter->wait({"a", "b"}, absl::Now() + absl::Seconds(20));
    done.store(true);
  });
  absl::SleepFor(absl::Milliseconds(100));  // let the WAIT park
  ASSERT_TRUE(writer->set("a", "1").ok());
  ASSERT_TRUE(*writer->remove("a"));
  ASSERT_TRUE(writer->set("b", "1").ok());
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(done.load());  // "a" is gone again
  ASSERT_TRUE(writer->set("a", "2").ok());
  t.join();
  EXPECT_TRUE(status.ok()) << status;
}

TEST(TcpStoreTest, LargeValuesCrossInPieces) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<TcpStore> store = Client(server->port());
  ASSERT_NE(store, nullptr);
  std::string value(8 << 20, '\0');
  for (size_t i = 0; i < value.size(); ++i)
    value[i] = static_cast<char>(i * 131);
  ASSERT_TRUE(store->set("blob", value).ok());
  EXPECT_EQ(*store->get("blob"), value);
}

TEST(TcpStoreTest, CallsOverTheFrameBoundAreRefused) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<TcpStore> store = Client(server->port());
  ASSERT_NE(store, nullptr);
  // A request: refused before anything is sent.
  const std::string half(kMaxStoreFrameBytes / 2 + 1, 'h');
  absl::StatusOr<std::string> cas = store->compare_set("k", half, half);
  EXPECT_EQ(cas.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cas.status().message(), HasSubstr("per call"));
  // A reply: the server says so, and the connection stays usable.
  ASSERT_TRUE(store->set("h1", half).ok());
  ASSERT_TRUE(store->set("h2", half).ok());
  absl::StatusOr<std::vector<std::string>> both =
      store->wait_get({"h1", "h2"}, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(both.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(store->ping().ok());
}

TEST(TcpStoreServerTest, ConnectionsBeyondTheBoundAreClosed) {
  TcpStoreServerOptions options;
  options.max_connections = 2;
  std::unique_ptr<TcpStoreServer> server = StartServer(options);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<TcpStore> a = Client(server->port());
  std::unique_ptr<TcpStore> b = Client(server->port());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(a->ping().ok());
  ASSERT_TRUE(b->ping().ok());
  std::unique_ptr<TcpStore> c = Client(server->port());  // TCP connects...
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->ping().code(),
            absl::StatusCode::kUnavailable);  // ...then closed
  b.reset();
  // Once the server has seen b go, c's reconnection is taken.
  EXPECT_TRUE(Eventually([&] { return server->connections() == 1; }));
  EXPECT_TRUE(c->ping().ok());
}

}  // namespace
}  // namespace vemesh
