// ReconfigurableCommunicator over Gloo groups, one thread per rank meeting
// through a MemoryStore: errors before the first configure name the group,
// operations follow each configure (a group of another size included),
// unconfigure's status is what later operations answer, and an operation
// keeps its group alive while another thread drops it.

#include "vemesh/comm/reconfigurable_communicator.h"

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/rendezvous/memory_store.h"

namespace vemesh {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(30);

// Global ranks that differ from group ranks, so that a mix-up shows.
int Global(int rank) { return 100 + rank; }

using Body = std::function<void(std::shared_ptr<Communicator> world)>;

// Runs `body` on `n` threads, each with its rank of a fresh Gloo world.
void OnRanks(int n, const Body& body) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<int> globals;
  for (int r = 0; r < n; ++r) globals.push_back(Global(r));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto world =
          GlooCommunicator::Create(store, "world", r, n, globals, kTimeout);
      ASSERT_TRUE(world.ok()) << "rank " << r << ": " << world.status();
      body(*std::move(world));
    });
  }
  for (std::thread& t : threads) t.join();
}

std::vector<int> RanksOf(const Communicator& c) {
  return {c.ranks().begin(), c.ranks().end()};
}

TEST(ReconfigurableCommunicatorTest, BeforeConfigureOperationsNameTheGroup) {
  ReconfigurableCommunicator dp("DP_REPLICATE", "gloo");
  EXPECT_FALSE(dp.configured());
  EXPECT_EQ(dp.generation(), -1);
  EXPECT_EQ(dp.size(), 1);
  EXPECT_EQ(dp.rank(), 0);
  EXPECT_EQ(dp.global_rank(), -1);
  EXPECT_EQ(dp.backend(), "gloo");
  std::vector<double> v = {1, 2};
  absl::Status s = dp.all_reduce(v, ReduceOp::kSum);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("DP_REPLICATE"));
  EXPECT_THAT(s.message(), HasSubstr("configure"));
  // Not "root 3 outside a group of 1": the missing group is the error.
  s = dp.broadcast(v, 3);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_TRUE(absl::IsUnimplemented(dp.split(0, 0).status()));
  EXPECT_EQ(dp.native_handle().handle, nullptr);
}

TEST(ReconfigurableCommunicatorTest, BadConfigurationsChangeNothing) {
  OnRanks(1, [](std::shared_ptr<Communicator> world) {
    ReconfigurableCommunicator dp("DP_REPLICATE", "gloo");
    absl::Status s = dp.configure(nullptr, {}, 1);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("null"));
    s = dp.configure(world, {100, 101}, 1);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("2 global ranks for a group of 1"));
    s = dp.configure(world, {-4}, 1);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("-4"));
    ReconfigurableCommunicator mpi("DP", "mpi");
    s = mpi.configure(world, {100}, 1);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("is on gloo; expected mpi"));
    s = dp.unconfigure(absl::OkStatus());
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_FALSE(dp.configured());
    EXPECT_EQ(dp.generation(), -1);
  });
}

// Configure over the world of 4, unconfigure, reconfigure over a half (a
// group of 2), then over the world again: size, rank, ranks and the
// operations follow each configuration.
TEST(ReconfigurableCommunicatorTest, FollowsEachConfiguration) {
  static constexpr int n = 4;
  OnRanks(n, [](std::shared_ptr<Communicator> world) {
    const int me = world->rank();
    auto dp =
        std::make_shared<ReconfigurableCommunicator>("DP_REPLICATE", "gloo");
    ASSERT_TRUE(dp->configure(world, RanksOf(*world), 7).ok());
    EXPECT_TRUE(dp->configured());
    EXPECT_EQ(dp->generation(), 7);
    EXPECT_EQ(dp->size(), n);
    EXPECT_EQ(dp->rank(), me);
    EXPECT_EQ(dp->global_rank(), Global(me));
    EXPECT_EQ(*dp->group_rank(Global(3)), 3);
    std::vector<int64_t> v = {me, 1};
    ASSERT_TRUE(dp->all_reduce(v, ReduceOp::kSum).ok());
    EXPECT_THAT(v, ElementsAre(0 + 1 + 2 + 3, n));

    // Between epochs: the caller's status, prefixed by op and group.
    ASSERT_TRUE(
        dp->unconfigure(absl::UnavailableError(
                            "DP_REPLICATE is between membership epochs: "
                            "recover() first"))
            .ok());
    EXPECT_FALSE(dp->configured());
    absl::Status s = dp->all_reduce(v, ReduceOp::kSum);
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("between membership epochs"));
    EXPECT_THAT(s.message(), HasSubstr("all_reduce"));
    EXPECT_TRUE(
        absl::IsUnavailable(dp->iall_reduce(v, ReduceOp::kSum).status()));
    EXPECT_EQ(dp->size(), n);  // the last configuration's
    EXPECT_EQ(dp->generation(), 7);

    // A group of 2: ranks {0, 1} and {2, 3}.
    auto half = world->split(me / 2, me);
    ASSERT_TRUE(half.ok()) << half.status();
    const absl::Span<const int> before = dp->ranks();
    ASSERT_TRUE(dp->configure(*half, RanksOf(**half), 8).ok());
    EXPECT_THAT(before, ElementsAre(100, 101, 102, 103))
        << "a span taken before a configure stays valid";
    EXPECT_EQ(dp->size(), 2);
    EXPECT_EQ(dp->rank(), me % 2);
    const int first = 100 + 2 * (me / 2);
    EXPECT_THAT(dp->ranks(), ElementsAre(first, first + 1));
    EXPECT_EQ(*dp->group_rank(first + 1), 1);
    EXPECT_TRUE(absl::IsNotFound(dp->group_rank(me < 2 ? 103 : 100).status()));
    v = {me, 1};
    ASSERT_TRUE(dp->all_reduce(v, ReduceOp::kSum).ok());
    EXPECT_THAT(v, ElementsAre(me < 2 ? 0 + 1 : 2 + 3, 2));
    // Point to point by global rank follows the new group too.
    std::vector<int64_t> out = {me}, in = {-1};
    const int peer = Global(me ^ 1);
    if (me % 2 == 0) {
      ASSERT_TRUE(dp->send(out, GlobalRank(peer)).ok());
      ASSERT_TRUE(dp->recv(in, GlobalRank(peer)).ok());
    } else {
      ASSERT_TRUE(dp->recv(in, GlobalRank(peer)).ok());
      ASSERT_TRUE(dp->send(out, GlobalRank(peer)).ok());
    }
    EXPECT_THAT(in, ElementsAre(me ^ 1));

    // Grown back to the world.
    ASSERT_TRUE(dp->configure(world, RanksOf(*world), 9).ok());
    EXPECT_EQ(dp->size(), n);
    EXPECT_EQ(*dp->group_rank(Global(3)), 3);
    v = {me, 1};
    ASSERT_TRUE(dp->all_reduce(v, ReduceOp::kSum).ok());
    EXPECT_THAT(v, ElementsAre(6, n));
    EXPECT_THAT(dp->ranks(), ElementsAreArray(RanksOf(*world)));
  });
}

// An abort stops the configuration it hit; the next configure starts afresh.
TEST(ReconfigurableCommunicatorTest, AbortLastsUntilTheNextConfigure) {
  OnRanks(2, [](std::shared_ptr<Communicator> world) {
    const int me = world->rank();
    auto own = world->split(me, 0);  // a group of one, this rank's
    ASSERT_TRUE(own.ok()) << own.status();
    auto dp = std::make_shared<ReconfigurableCommunicator>("DP", "gloo");
    ASSERT_TRUE(dp->configure(*own, RanksOf(**own), 1).ok());
    std::shared_ptr<Communicator> first = *own;
    dp->abort("a peer was lost");
    std::vector<double> v = {1.0};
    absl::Status s = dp->all_reduce(v, ReduceOp::kSum);
    EXPECT_TRUE(absl::IsAborted(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("a peer was lost"));
    EXPECT_TRUE(first->aborted()) << "the inner group is aborted too";
    ASSERT_TRUE(dp->configure(world, RanksOf(*world), 2).ok());
    EXPECT_FALSE(dp->aborted());
    ASSERT_TRUE(dp->all_reduce(v, ReduceOp::kSum).ok());
    EXPECT_EQ(v[0], 2.0);
  });
}

// Rank 0 starts an all_reduce; another thread unconfigures before rank 1
// joins it. The operation still completes on the group it started on, which
// lives until its Work lets go.
TEST(ReconfigurableCommunicatorTest, OperationKeepsItsGroupAlive) {
  OnRanks(2, [](std::shared_ptr<Communicator> world) {
    const int me = world->rank();
    auto pair = world->split(0, me);
    ASSERT_TRUE(pair.ok()) << pair.status();
    std::weak_ptr<Communicator> inner = *pair;
    auto dp = std::make_shared<ReconfigurableCommunicator>("DP", "gloo");
    ASSERT_TRUE(dp->configure(*std::move(pair), {100, 101}, 1).ok());
    std::vector<double> v = {static_cast<double>(me + 1)};
    if (me == 0) {
      auto work = dp->iall_reduce(v, ReduceOp::kSum);
      ASSERT_TRUE(work.ok()) << work.status();
      std::thread other([&] {
        EXPECT_TRUE(dp->unconfigure(absl::UnavailableError("recovering")).ok());
      });
      other.join();
      EXPECT_FALSE(inner.expired()) << "the Work holds the group";
      ASSERT_TRUE(world->barrier().ok());  // now rank 1 joins
      ASSERT_TRUE((*work)->wait().ok());
      EXPECT_EQ(v[0], 3.0);
      work->reset();
      EXPECT_TRUE(inner.expired()) << "freed with the last holder";
    } else {
      ASSERT_TRUE(world->barrier().ok());
      ASSERT_TRUE(dp->all_reduce(v, ReduceOp::kSum).ok());
      EXPECT_EQ(v[0], 3.0);
    }
  });
}

}  // namespace
}  // namespace vemesh
