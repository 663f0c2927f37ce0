// StoreBootstrap: every rank gets the same outcome of an all_gather, a late
// rank included; a missing rank is named; agreement works over it.

#include "vemesh/bootstrap/store_bootstrap.h"

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/bootstrap/agreement.h"
#include "vemesh/rendezvous/memory_store.h"

namespace vemesh {
namespace {

using ::testing::HasSubstr;

// Runs `body(rank)` on `size` threads, each a rank.
void RunRanks(int size, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back(body, r);
  for (std::thread& t : threads) t.join();
}

TEST(StoreBootstrap, AllGatherGivesEveryRankTheSameList) {
  for (int size : {1, 2, 5, 8}) {
    auto store = std::make_shared<MemoryStore>();
    std::vector<std::vector<std::string>> got(size);
    RunRanks(size, [&](int rank) {
      StoreBootstrap boot(store, rank, size, "t");
      for (int round = 0; round < 3; ++round) {
        auto all = boot.all_gather(absl::StrCat("r", rank, "x", round),
                                   absl::Now() + absl::Seconds(20));
        ASSERT_TRUE(all.ok()) << all.status();
        if (round == 2) got[rank] = *all;
      }
    });
    for (int rank = 0; rank < size; ++rank) {
      ASSERT_EQ(got[rank].size(), static_cast<size_t>(size));
      for (int r = 0; r < size; ++r) {
        EXPECT_EQ(got[rank][r], absl::StrCat("r", r, "x2"));
      }
    }
  }
}

TEST(StoreBootstrap, AMissingRankIsNamedOnEveryRankAndTheLateRankLearnsIt) {
  constexpr int kSize = 4;
  constexpr int kLate = 2;
  auto store = std::make_shared<MemoryStore>();
  std::vector<absl::Status> outcome(kSize);
  const absl::Time start = absl::Now();
  RunRanks(kSize, [&](int rank) {
    StoreBootstrap boot(store, rank, kSize, "t");
    boot.set_grace(absl::Milliseconds(200));
    if (rank == kLate) {
      // Arrives well after everyone else gave up (deadline 300 ms + grace).
      absl::SleepFor(absl::Milliseconds(1500));
    }
    outcome[rank] =
        boot.all_gather("x", absl::Now() + absl::Milliseconds(300)).status();
    // A failed round leaves the bootstrap refusing further rounds.
    absl::Status again =
        boot.all_gather("y", absl::Now() + absl::Seconds(1)).status();
    EXPECT_TRUE(absl::IsFailedPrecondition(again)) << again;
  });
  for (int rank = 0; rank < kSize; ++rank) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(outcome[rank]))
        << "rank " << rank << ": " << outcome[rank];
    EXPECT_THAT(std::string(outcome[rank].message()),
                HasSubstr("rank(s) 2 of 4 never arrived"))
        << "rank " << rank;
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

// Issue 29: a 65,536-rank timeout listed every missing rank: one 447 KB
// line. Now the first few and a count.
TEST(StoreBootstrap, AHugeListOfMissingRanksIsCapped) {
  constexpr int kSize = 65536;
  auto store = std::make_shared<MemoryStore>();
  StoreBootstrap boot(store, 0, kSize, "t");
  boot.set_grace(absl::Milliseconds(50));
  absl::Status status =
      boot.all_gather("x", absl::Now() + absl::Milliseconds(200)).status();
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  const std::string message(status.message());
  EXPECT_THAT(message, HasSubstr("rank(s) 1, 2, 3, 4, 5, 6, 7, 8, ... (65535 "
                                 "in all) of 65536 never arrived"));
  EXPECT_LT(message.size(), 1024u) << message.substr(0, 2048);
}

TEST(StoreBootstrap, ALateRankZeroFailsEveryRankAlike) {
  constexpr int kSize = 3;
  auto store = std::make_shared<MemoryStore>();
  std::vector<absl::Status> outcome(kSize);
  const absl::Time start = absl::Now();
  RunRanks(kSize, [&](int rank) {
    StoreBootstrap boot(store, rank, kSize, "t");
    boot.set_grace(absl::Milliseconds(100));
    if (rank == 0) absl::SleepFor(absl::Milliseconds(1200));
    outcome[rank] =
        boot.all_gather("x", absl::Now() + absl::Milliseconds(300)).status();
  });
  // Rank 0 finds every key present when it arrives, but the verdict was
  // already written by a rank that gave up: it fails like the others.
  for (int rank = 0; rank < kSize; ++rank) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(outcome[rank]))
        << "rank " << rank << ": " << outcome[rank];
    EXPECT_THAT(std::string(outcome[rank].message()),
                HasSubstr("rank 0 (which collects the ranks) gave no verdict"));
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(StoreBootstrap, AgreementOverTheStoreNamesTheDifferingRank) {
  constexpr int kSize = 3;
  auto store = std::make_shared<MemoryStore>();
  std::vector<absl::Status> outcome(kSize);
  RunRanks(kSize, [&](int rank) {
    StoreBootstrap boot(store, rank, kSize, "t");
    std::vector<AgreementField> fields = {
        {"shape", rank == 2 ? "(3)" : "(1, 3)"}};
    outcome[rank] =
        CheckAgreement(boot, "init", fields, absl::Now() + absl::Seconds(20));
  });
  for (int rank = 0; rank < kSize; ++rank) {
    EXPECT_TRUE(absl::IsInvalidArgument(outcome[rank])) << outcome[rank];
    EXPECT_THAT(std::string(outcome[rank].message()),
                HasSubstr("init shape: rank 2 has (3), rank 0 has (1, 3)"));
  }
}

TEST(StoreBootstrap, PayloadsComeBackWhenTheRanksAgree) {
  constexpr int kSize = 4;
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::vector<std::string>> got(kSize);
  RunRanks(kSize, [&](int rank) {
    StoreBootstrap boot(store, rank, kSize, "t");
    auto hosts = AgreeAndGather(boot, "init", {{"shape", "(4)"}},
                                rank < 2 ? "hostA" : "hostB",
                                absl::Now() + absl::Seconds(20));
    ASSERT_TRUE(hosts.ok()) << hosts.status();
    got[rank] = *hosts;
  });
  for (int rank = 0; rank < kSize; ++rank) {
    EXPECT_THAT(got[rank],
                ::testing::ElementsAre("hostA", "hostA", "hostB", "hostB"));
  }
}

}  // namespace
}  // namespace vemesh
