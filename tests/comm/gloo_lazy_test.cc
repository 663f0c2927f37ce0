// Gloo connections made only where they are used (issue 32): a CreateLazy
// world holds no pairs until its first operation, subgroup() connects its
// members only, and a lazy connect whose peer is gone fails Unavailable
// naming that peer within the Gloo timeout, never a hang (a subgroup's
// creation: DeadlineExceeded naming it). One thread per
// rank, one MemoryStore.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "forwarding_store.h"
#include "gloo/transport/tcp/attr.h"
#include "gloo/transport/tcp/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "open_sockets.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/comm/gloo/internal/gloo_pairs.h"
#include "vemesh/rendezvous/memory_store.h"

namespace vemesh {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(30);

std::vector<int> GlobalRanks(int n) {
  std::vector<int> out(n);
  for (int r = 0; r < n; ++r) out[r] = 100 + r;
  return out;
}

int Sockets() { return static_cast<int>(vemesh::OpenSocketInodes().size()); }

// A MemoryStore that counts the reads: get, wait and wait_get.
class ReadCountingStore final : public testing::ForwardingStore {
 public:
  int64_t reads() const { return reads_.load(); }
  absl::StatusOr<std::string> get(absl::string_view key) override {
    ++reads_;
    return ForwardingStore::get(key);
  }
  absl::Status wait(absl::Span<const std::string> keys,
                    absl::Time deadline) override {
    ++reads_;
    return ForwardingStore::wait(keys, deadline);
  }
  absl::StatusOr<std::vector<std::string>> wait_get(
      absl::Span<const std::string> keys, absl::Time deadline) override {
    ++reads_;
    return inner().wait_get(keys, deadline);
  }

 private:
  std::atomic<int64_t> reads_{0};
};

// Gloo's own rendezvous (connectFullMesh) asks for its peers' keys one at a
// time: a wait and a get per peer, for the lower ranks' hostnames and then
// every peer's addresses, 140 reads for 8 ranks. vemesh's (gloo_pairs.h)
// posts each rank's addresses as one value and reads the others' in one
// wait_get. Each read is a round trip to Redis in an elastic job's epoch.
TEST(GlooConnectTest, EachRankReadsTheStoreOnceToConnect) {
  constexpr int n = 8;
  auto store = std::make_shared<ReadCountingStore>();
  std::vector<std::shared_ptr<GlooCommunicator>> comms(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto c =
          GlooCommunicator::Create(store, "g", r, n, GlobalRanks(n), kTimeout);
      ASSERT_TRUE(c.ok()) << c.status();
      comms[r] = *std::move(c);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(store->reads(), n);
  threads.clear();
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_NE(comms[r], nullptr);
      int64_t v = r + 1;
      absl::Status s =
          comms[r]->all_reduce(absl::MakeSpan(&v, 1), ReduceOp::kSum);
      EXPECT_TRUE(s.ok()) << s;
      EXPECT_EQ(v, n * (n + 1) / 2);
    });
  }
  for (auto& t : threads) t.join();
}

// A large group's values are read in runs that keep each reply near the
// budget (the TCP store refuses a reply over 64 MiB, which one read of
// every peer's addresses passes at 684 ranks): with a budget below one
// value, one value per read, and the groups still connect; two groups at
// once, each rank's value carrying both.
TEST(GlooConnectTest, PeersValuesAreReadInRunsWithinTheReplyBudget) {
  constexpr int n = 5;
  for (size_t budget : {size_t{1}, size_t{64} << 10}) {
    SCOPED_TRACE(absl::StrCat("reply budget ", budget));
    auto store = std::make_shared<ReadCountingStore>();
    std::vector<absl::Status> results(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        gloo::transport::tcp::attr attr;
        attr.hostname = "127.0.0.1";
        std::shared_ptr<gloo::transport::Device> device =
            gloo::transport::tcp::CreateDevice(attr);
        std::vector<gloo_internal::PairGroup> groups = {
            {"all", {0, 1, 2, 3, 4}, r}};
        if (r % 2 == 0) groups.push_back({"even", {0, 2, 4}, r / 2});
        auto contexts = gloo_internal::ConnectPairGroups(
            *store, absl::StrCat("b", budget, "/"), r, device, kTimeout, groups,
            "test", budget);
        results[r] = contexts.status();
        if (contexts.ok()) {
          EXPECT_EQ(contexts->size(), groups.size());
          EXPECT_EQ((*contexts)[0]->size, n);
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) EXPECT_TRUE(results[r].ok()) << results[r];
    // One read per peer under the small budget, one per rank under 64 KiB.
    EXPECT_EQ(store->reads(), budget == 1 ? n * (n - 1) : n);
  }
}

TEST(GlooLazyTest, WorldConnectsOnFirstOperation) {
  constexpr int n = 4;
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::shared_ptr<GlooCommunicator>> worlds(n);
  const int before = Sockets();
  for (int r = 0; r < n; ++r) {
    auto w = GlooCommunicator::CreateLazy(store, "w", r, n, GlobalRanks(n),
                                          kTimeout);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_FALSE((*w)->connected());
    worlds[r] = *std::move(w);
  }
  // No pairs (and Gloo's tcp device listens only while pairs connect).
  EXPECT_EQ(Sockets() - before, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      int64_t v = r + 1;
      absl::Status s =
          worlds[r]->all_reduce(absl::MakeSpan(&v, 1), ReduceOp::kSum);
      EXPECT_TRUE(s.ok()) << s;
      EXPECT_EQ(v, n * (n + 1) / 2);
      EXPECT_TRUE(worlds[r]->connected());
    });
  }
  for (auto& t : threads) t.join();
}

TEST(GlooLazyTest, SubgroupConnectsOnlyItsMembers) {
  constexpr int n = 4;
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::shared_ptr<GlooCommunicator>> worlds(n);
  for (int r = 0; r < n; ++r) {
    worlds[r] = *GlooCommunicator::CreateLazy(store, "w", r, n, GlobalRanks(n),
                                              kTimeout);
  }
  const int before = Sockets();
  std::vector<std::shared_ptr<GlooCommunicator>> pairs(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      // {0, 1} and {2, 3}; in the second, rank 3 comes first.
      std::vector<int> members =
          r < 2 ? std::vector<int>{0, 1} : std::vector<int>{3, 2};
      auto g = worlds[r]->subgroup(absl::StrCat("pair", r / 2), members);
      ASSERT_TRUE(g.ok()) << g.status();
      EXPECT_EQ((*g)->size(), 2);
      EXPECT_EQ((*g)->rank(), r < 2 ? r : 3 - r);
      EXPECT_EQ((*g)->ranks()[0], 100 + members[0]);
      int64_t v = r;
      EXPECT_TRUE((*g)->all_reduce(absl::MakeSpan(&v, 1), ReduceOp::kSum).ok());
      EXPECT_EQ(v, r < 2 ? 1 : 5);
      pairs[r] = *std::move(g);
    });
  }
  for (auto& t : threads) t.join();
  // Two pairs of two ranks, one socket per side; the world has none.
  EXPECT_EQ(Sockets() - before, 4);
  for (auto& w : worlds) EXPECT_FALSE(w->connected());
}

// subgroups(): a 2x2 grid's rows and columns in one store round per rank;
// each group works, holds one socket per peer, and the world none.
TEST(GlooLazyTest, SubgroupsConnectAllGroupsInOneRound) {
  constexpr int n = 4;
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::shared_ptr<GlooCommunicator>> worlds(n);
  for (int r = 0; r < n; ++r) {
    worlds[r] = *GlooCommunicator::CreateLazy(store, "w", r, n, GlobalRanks(n),
                                              kTimeout);
  }
  const int before = Sockets();
  std::vector<std::vector<std::shared_ptr<GlooCommunicator>>> groups(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      const int row = r / 2, col = r % 2;
      std::vector<GlooCommunicator::SubgroupSpec> specs = {
          {absl::StrCat("row", row), {2 * row, 2 * row + 1}},
          {absl::StrCat("col", col), {col, col + 2}}};
      auto g = worlds[r]->subgroups("grid", specs);
      ASSERT_TRUE(g.ok()) << g.status();
      ASSERT_EQ(g->size(), 2u);
      EXPECT_EQ((*g)[0]->rank(), col);
      EXPECT_EQ((*g)[1]->rank(), row);
      EXPECT_EQ((*g)[1]->ranks()[1], 100 + col + 2);
      int64_t across_row = r, across_col = r;
      EXPECT_TRUE(
          (*g)[0]
              ->all_reduce(absl::MakeSpan(&across_row, 1), ReduceOp::kSum)
              .ok());
      EXPECT_TRUE(
          (*g)[1]
              ->all_reduce(absl::MakeSpan(&across_col, 1), ReduceOp::kSum)
              .ok());
      EXPECT_EQ(across_row, 4 * row + 1);
      EXPECT_EQ(across_col, 2 * col + 2);
      groups[r] = *std::move(g);
    });
  }
  for (auto& t : threads) t.join();
  // Four groups of two ranks, one socket per side; the world has none.
  EXPECT_EQ(Sockets() - before, 8);
  for (auto& w : worlds) EXPECT_FALSE(w->connected());
}

// A member of one of the groups never comes: DeadlineExceeded naming it (in
// its group's rank and global rank), within the Gloo timeout.
TEST(GlooLazyTest, SubgroupsWithGoneMemberIsDeadlineExceededNamingIt) {
  const absl::Duration timeout = absl::Seconds(2);
  auto store = std::make_shared<MemoryStore>();
  auto w =
      *GlooCommunicator::CreateLazy(store, "w", 0, 4, GlobalRanks(4), timeout);
  const absl::Time start = absl::Now();
  auto g = w->subgroups("dims", {{"a", {0, 3}}, {"b", {2, 0}}});
  EXPECT_EQ(g.status().code(), absl::StatusCode::kDeadlineExceeded)
      << g.status();
  EXPECT_THAT(g.status().message(), HasSubstr("1 (global rank 103)"));
  EXPECT_THAT(g.status().message(), HasSubstr("0 (global rank 102)"));
  EXPECT_LT(absl::Now() - start, timeout + absl::Seconds(3));
  auto bad = w->subgroups("bad", {{"c", {0, 7}}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("member 7"));
}

TEST(GlooLazyTest, SubgroupRejectsBadMembers) {
  auto store = std::make_shared<MemoryStore>();
  auto w =
      *GlooCommunicator::CreateLazy(store, "w", 0, 2, GlobalRanks(2), kTimeout);
  auto outside = w->subgroup("a", {0, 5});
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(outside.status().message(), HasSubstr("member 5"));
  auto without_me = w->subgroup("b", {1});
  EXPECT_EQ(without_me.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(without_me.status().message(), HasSubstr("not among"));
}

// Rank 2 is gone (it never uses the world): the others' first operation
// connects lazily and fails Unavailable naming it, within the Gloo timeout.
TEST(GlooLazyTest, LazyConnectToGonePeerIsUnavailableNamingIt) {
  constexpr int n = 3;
  const absl::Duration timeout = absl::Seconds(2);
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::shared_ptr<GlooCommunicator>> worlds(n);
  for (int r = 0; r < n; ++r) {
    worlds[r] = *GlooCommunicator::CreateLazy(store, "w", r, n, GlobalRanks(n),
                                              timeout);
  }
  worlds[2].reset();  // gone
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      const absl::Time start = absl::Now();
      int64_t v = 1;
      absl::Status s =
          worlds[r]->all_reduce(absl::MakeSpan(&v, 1), ReduceOp::kSum);
      const absl::Duration took = absl::Now() - start;
      EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
      EXPECT_THAT(s.message(), HasSubstr("2 (global rank 102)"));
      EXPECT_LT(took, timeout + absl::Seconds(3));
      // The failure is kept: the next operation says the same at once.
      absl::Status again =
          worlds[r]->all_reduce(absl::MakeSpan(&v, 1), ReduceOp::kSum);
      EXPECT_EQ(again, s);
    });
  }
  for (auto& t : threads) t.join();
}

// A subgroup is made at once (like Create): a member that never comes is
// DeadlineExceeded, naming it.
TEST(GlooLazyTest, SubgroupWithGoneMemberIsUnavailableNamingIt) {
  const absl::Duration timeout = absl::Seconds(2);
  auto store = std::make_shared<MemoryStore>();
  auto w =
      *GlooCommunicator::CreateLazy(store, "w", 0, 4, GlobalRanks(4), timeout);
  const absl::Time start = absl::Now();
  auto g = w->subgroup("pp", {0, 3});
  EXPECT_EQ(g.status().code(), absl::StatusCode::kDeadlineExceeded)
      << g.status();
  EXPECT_THAT(g.status().message(), HasSubstr("1 (global rank 103)"));
  EXPECT_LT(absl::Now() - start, timeout + absl::Seconds(3));
}

}  // namespace
}  // namespace vemesh
