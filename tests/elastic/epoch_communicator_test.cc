// EpochCommunicator (vemesh/elastic/epoch_communicator.h) around real Gloo
// groups made in this process over a MemoryStore, one thread per rank: it
// reports the mesh's global ranks, passes operations through while its
// epoch is current, refuses every one once the epoch moved on or it was
// retired, and retiring it frees the Gloo group so that a peer blocked on
// that group is released with an error, not left hanging.

#include "vemesh/elastic/epoch_communicator.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/rendezvous/memory_store.h"

namespace vemesh {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Bounds the rendezvous and every wait inside a Gloo operation: long enough
// for a loaded 2-core machine, short enough that a lost peer cannot stall
// the test for long.
constexpr absl::Duration kGlooTimeout = absl::Seconds(20);

using Epoch = std::shared_ptr<std::atomic<int64_t>>;

Epoch CurrentEpoch(int64_t value) {
  return std::make_shared<std::atomic<int64_t>>(value);
}

// A one-rank Gloo group on a fresh store.
std::shared_ptr<GlooCommunicator> OneRankGloo() {
  auto store = std::make_shared<MemoryStore>();
  auto comm = GlooCommunicator::Create(store, "one", 0, 1, {0}, kGlooTimeout);
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? *std::move(comm) : nullptr;
}

// Runs `body(rank, group)` on two threads, each with its rank of a fresh
// two-rank Gloo group, and joins both before returning.
void OnTwoRanks(
    const std::function<void(int, std::shared_ptr<GlooCommunicator>)>& body,
    absl::Duration timeout = kGlooTimeout) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto comm =
          GlooCommunicator::Create(store, "two", r, 2, {100, 101}, timeout);
      ASSERT_TRUE(comm.ok()) << "rank " << r << ": " << comm.status();
      body(r, *std::move(comm));
    });
  }
  for (std::thread& t : threads) t.join();
}

// Every operation of the interface, once, on a one-rank group (peer and
// root 0), with buffers of the right length.
struct OpResult {
  std::string op;
  absl::Status status;
};

std::vector<OpResult> EveryOp(Communicator& c) {
  std::vector<OpResult> out;
  std::vector<float> a(4, 1.0f), b(4, 0.0f);
  out.push_back({"barrier", c.barrier()});
  out.push_back(
      {"broadcast", c.broadcast(a.data(), a.size(), DataType::kFloat32, 0)});
  out.push_back(
      {"all_reduce", c.all_reduce(a.data(), b.data(), a.size(),
                                  DataType::kFloat32, ReduceOp::kSum)});
  out.push_back({"all_gather", c.all_gather(a.data(), b.data(), a.size(),
                                            DataType::kFloat32)});
  out.push_back(
      {"reduce_scatter", c.reduce_scatter(a.data(), b.data(), a.size(),
                                          DataType::kFloat32, ReduceOp::kSum)});
  out.push_back({"send", c.send(a.data(), a.size(), DataType::kFloat32, 0)});
  out.push_back({"recv", c.recv(b.data(), b.size(), DataType::kFloat32, 0)});
  out.push_back({"send_recv", c.send_recv(a.data(), a.size(), 0, b.data(),
                                          b.size(), 0, DataType::kFloat32)});
  return out;
}

TEST(EpochCommunicatorTest, ReportsTheMeshGlobalRanks) {
  std::vector<int> rank(2, -1), size(2, -1), global(2, -1);
  std::vector<std::vector<int>> ranks(2);
  std::vector<std::string> backend(2);
  std::vector<int64_t> epoch(2, -1);
  auto current = CurrentEpoch(3);
  OnTwoRanks([&](int r, std::shared_ptr<GlooCommunicator> gloo) {
    EpochCommunicator c(std::move(gloo), {3, 7}, 3, current);
    rank[r] = c.rank();
    size[r] = c.size();
    ranks[r].assign(c.ranks().begin(), c.ranks().end());
    global[r] = c.global_rank();
    backend[r] = std::string(c.backend());
    epoch[r] = c.epoch();
  });
  const std::vector<int> mapped = {3, 7};
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(rank[r], r);
    EXPECT_EQ(size[r], 2);
    EXPECT_EQ(ranks[r], mapped);
    EXPECT_EQ(global[r], mapped[r]);
    EXPECT_EQ(backend[r], "gloo");
    EXPECT_EQ(epoch[r], 3);
  }
}

TEST(EpochCommunicatorTest, AllReduceWorksWhileTheEpochIsCurrent) {
  auto current = CurrentEpoch(5);
  std::vector<absl::Status> status(2);
  std::vector<std::vector<int64_t>> result(2);
  OnTwoRanks([&](int r, std::shared_ptr<GlooCommunicator> gloo) {
    std::shared_ptr<Communicator> c = std::make_shared<EpochCommunicator>(
        std::move(gloo), std::vector<int>{3, 7}, 5, current);
    // Rank r contributes (r + 1) * (i + 1) at position i.
    std::vector<int64_t> data = {r + 1, 2 * (r + 1), 3 * (r + 1)};
    status[r] = c->all_reduce(absl::MakeSpan(data), ReduceOp::kSum);
    result[r] = data;
  });
  std::vector<int64_t> expected(3, 0);
  for (int r = 0; r < 2; ++r) {
    for (size_t i = 0; i < expected.size(); ++i) {
      expected[i] += static_cast<int64_t>((r + 1) * (i + 1));
    }
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    EXPECT_EQ(result[r], expected) << "rank " << r;
  }
}

TEST(EpochCommunicatorTest, EveryOperationPassesThroughWhileCurrent) {
  auto gloo = OneRankGloo();
  ASSERT_NE(gloo, nullptr);
  EpochCommunicator c(std::move(gloo), {42}, 1, CurrentEpoch(1));
  EXPECT_EQ(c.global_rank(), 42);
  for (const OpResult& r : EveryOp(c)) {
    EXPECT_TRUE(r.status.ok()) << r.op << ": " << r.status;
  }
  // The inner group did the work: an all_gather of one rank is a copy.
  std::vector<int32_t> in = {4, 5}, out(2, 0);
  ASSERT_TRUE(c.all_gather(in.data(), out.data(), 2, DataType::kInt32).ok());
  EXPECT_THAT(out, ElementsAre(4, 5));
  NativeHandle h = c.native_handle();
  EXPECT_EQ(h.backend, "gloo");
  EXPECT_NE(h.handle, nullptr);
}

TEST(EpochCommunicatorTest, EveryOperationOfAStaleEpochIsFailedPrecondition) {
  auto gloo = OneRankGloo();
  ASSERT_NE(gloo, nullptr);
  const int64_t mine = 3;
  auto current = CurrentEpoch(mine);
  EpochCommunicator c(std::move(gloo), {0}, mine, current);
  ASSERT_TRUE(c.barrier().ok());

  const int64_t next = mine + 2;
  current->store(next);
  const std::string stale =
      absl::StrCat("stale mesh epoch ", mine, ", current ", next);
  const std::vector<OpResult> results = EveryOp(c);
  ASSERT_EQ(results.size(), 8u);
  for (const OpResult& r : results) {
    EXPECT_EQ(r.status.code(), absl::StatusCode::kFailedPrecondition)
        << r.op << ": " << r.status;
    EXPECT_THAT(r.status.message(), HasSubstr(stale)) << r.op;
    EXPECT_THAT(r.status.message(), HasSubstr(r.op)) << "names the operation";
  }
  // Stale is not retired: the group is still held, just refused.
  EXPECT_FALSE(c.retired());
  EXPECT_EQ(c.epoch(), mine);
}

TEST(EpochCommunicatorTest, RetireRefusesEveryOperationAndFreesTheGroup) {
  auto gloo = OneRankGloo();
  ASSERT_NE(gloo, nullptr);
  const int64_t mine = 8;
  auto current = CurrentEpoch(mine);
  auto c = std::make_shared<EpochCommunicator>(
      std::move(gloo), std::vector<int>{9}, mine, current);
  ASSERT_TRUE(c->barrier().ok());
  EXPECT_FALSE(c->retired());

  // The wrapper holds the only reference to the Gloo group.
  const int64_t before = LiveCommunicatorCount();
  c->retire();
  EXPECT_TRUE(c->retired());
  EXPECT_EQ(LiveCommunicatorCount(), before - 1);
  // Retiring twice frees nothing more.
  c->retire();
  EXPECT_TRUE(c->retired());
  EXPECT_EQ(LiveCommunicatorCount(), before - 1);

  for (const OpResult& r : EveryOp(*c)) {
    EXPECT_EQ(r.status.code(), absl::StatusCode::kFailedPrecondition)
        << r.op << ": " << r.status;
    EXPECT_THAT(r.status.message(), HasSubstr(absl::StrCat("epoch ", mine)))
        << r.op;
  }
  // Still describes itself, with no library object behind it.
  EXPECT_EQ(c->global_rank(), 9);
  EXPECT_EQ(c->backend(), "gloo");
  NativeHandle h = c->native_handle();
  EXPECT_EQ(h.backend, "gloo");
  EXPECT_EQ(h.handle, nullptr);

  c.reset();
  EXPECT_EQ(LiveCommunicatorCount(), before - 2);
}

TEST(EpochCommunicatorTest, RetireKeepsAGroupOthersStillHold) {
  auto gloo = OneRankGloo();
  ASSERT_NE(gloo, nullptr);
  std::shared_ptr<GlooCommunicator> kept = gloo;
  EpochCommunicator c(std::move(gloo), {0}, 1, CurrentEpoch(1));
  const int64_t before = LiveCommunicatorCount();
  c.retire();
  EXPECT_TRUE(c.retired());
  EXPECT_EQ(LiveCommunicatorCount(), before);  // `kept` holds it
  EXPECT_TRUE(kept->barrier().ok());
}

TEST(EpochCommunicatorTest, SplitIsUnimplemented) {
  auto gloo = OneRankGloo();
  ASSERT_NE(gloo, nullptr);
  EpochCommunicator c(std::move(gloo), {0}, 2, CurrentEpoch(2));
  const int64_t before = LiveCommunicatorCount();
  auto s = c.split(0, 0);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnimplemented) << s.status();
  EXPECT_THAT(s.status().message(), HasSubstr("epoch 2"));
  EXPECT_EQ(LiveCommunicatorCount(), before);
  // Nothing broke: the group still works.
  EXPECT_TRUE(c.barrier().ok());
}

TEST(EpochCommunicatorTest, RetiringReleasesAPeerBlockedInAllReduce) {
  // Rank 1 enters an all_reduce; rank 0 retires its wrapper instead of
  // joining. Its Gloo group is destroyed, its connections close, and rank 1
  // gets an error as soon as its socket says so: well before the Gloo
  // timeout, which would be the bound if nothing released it.
  auto current = CurrentEpoch(4);
  std::atomic<bool> entering{false};
  absl::Status blocked_status;
  absl::Duration blocked_took = absl::InfiniteDuration();
  bool retired = false;
  int64_t count_drop = 0;
  OnTwoRanks([&](int r, std::shared_ptr<GlooCommunicator> gloo) {
    auto c = std::make_shared<EpochCommunicator>(
        std::move(gloo), std::vector<int>{3, 7}, 4, current);
    if (r == 0) {
      const absl::Time limit = absl::Now() + absl::Seconds(10);
      while (!entering.load() && absl::Now() < limit) {
        absl::SleepFor(absl::Milliseconds(5));
      }
      absl::SleepFor(absl::Milliseconds(300));  // rank 1 is inside by now
      const int64_t before = LiveCommunicatorCount();
      c->retire();
      count_drop = before - LiveCommunicatorCount();
      retired = c->retired();
      return;
    }
    std::vector<float> data(1000, 1.0f);
    entering = true;
    const absl::Time start = absl::Now();
    blocked_status = c->all_reduce(data.data(), data.data(), data.size(),
                                   DataType::kFloat32, ReduceOp::kSum);
    blocked_took = absl::Now() - start;
  });
  EXPECT_TRUE(retired);
  // Rank 0's Gloo group went inside retire(). (Rank 1, released, may free
  // its own wrapper and group before the second count is read.)
  EXPECT_GE(count_drop, 1);
  EXPECT_FALSE(blocked_status.ok());
  EXPECT_TRUE(absl::IsUnavailable(blocked_status) ||
              absl::IsDeadlineExceeded(blocked_status))
      << blocked_status;
  EXPECT_LT(blocked_took, kGlooTimeout / 2) << blocked_status;
}

}  // namespace
}  // namespace vemesh
