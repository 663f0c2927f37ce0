// The one agreement helper (vemesh/comm/agreement.h) over the MPI world:
// agreeing ranks pass; one rank that differs gets the same status on every
// rank, naming that rank and both values; with several that differ, the
// first is named. AgreementVerdict and DisagreementMessage without MPI.

#include "vemesh/comm/agreement.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/comm/mpi/mpi_communicator.h"

namespace vemesh {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<MpiCommunicator> World() {
  auto world = MpiCommunicator::World();
  EXPECT_TRUE(world.ok()) << world.status();
  return world.ok() ? *world : nullptr;
}

// Every rank's status, gathered to every rank as text, so that a test can
// check that all ranks returned the same.
std::vector<std::string> Everyone(Communicator& comm, const absl::Status& s) {
  std::string mine = s.ToString();
  mine.resize(512, '\0');
  std::vector<char> all(512 * static_cast<size_t>(comm.size()));
  EXPECT_TRUE(
      comm.all_gather(mine.data(), all.data(), 512, DataType::kUInt8).ok());
  std::vector<std::string> out;
  for (int r = 0; r < comm.size(); ++r) {
    out.emplace_back(all.data() + 512 * r);
  }
  return out;
}

TEST(AgreementTest, AgreeingRanksPass) {
  auto world = World();
  ASSERT_NE(world, nullptr);
  EXPECT_TRUE(AgreeAcrossRanks(*world, "the step",
                               AgreementSummary::Of("step 7 into '/ckpt'"))
                  .ok());
  // A long text (cut on the wire) that is the same everywhere agrees too.
  EXPECT_TRUE(AgreeAcrossRanks(*world, "the shapes",
                               AgreementSummary::Of(std::string(500, 'x')))
                  .ok());
}

TEST(AgreementTest, OneRankDifferingIsNamedWithBothValuesOnEveryRank) {
  auto world = World();
  ASSERT_NE(world, nullptr);
  const int n = world->size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const int odd = n - 1;
  const std::string mine = world->rank() == odd ? "step 8" : "step 7";
  absl::Status s =
      AgreeAcrossRanks(*world, "checkpoint step", AgreementSummary::Of(mine));
  ASSERT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(s.message(), absl::StrCat("checkpoint step: rank ", odd,
                                      " has step 8, rank 0 has step 7"));
  for (const std::string& other : Everyone(*world, s)) {
    EXPECT_EQ(other, s.ToString());
  }
}

TEST(AgreementTest, RankZeroDifferingIsNamedByTheFirstOther) {
  auto world = World();
  ASSERT_NE(world, nullptr);
  if (world->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string mine = world->rank() == 0 ? "a" : "b";
  absl::Status s = AgreeAcrossRanks(*world, "x", AgreementSummary::Of(mine),
                                    {.code = absl::StatusCode::kDataLoss});
  ASSERT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_EQ(s.message(), "x: rank 1 has b, rank 0 has a");
}

TEST(AgreementTest, TheFirstOfSeveralDifferingRanksIsNamed) {
  auto world = World();
  ASSERT_NE(world, nullptr);
  const int n = world->size();
  if (n < 3) GTEST_SKIP() << "needs 3 ranks";
  // Ranks 2 and up differ, each in its own way: rank 2 is named.
  const int r = world->rank();
  const std::string mine = r < 2 ? "same" : absl::StrCat("value ", r);
  absl::Status s =
      AgreeAcrossRanks(*world, "the units", AgreementSummary::Of(mine));
  ASSERT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(s.message(), "the units: rank 2 has value 2, rank 0 has same");
  for (const std::string& other : Everyone(*world, s)) {
    EXPECT_EQ(other, s.ToString());
  }
}

TEST(AgreementTest, TheSameTextWithAnotherHashShowsTheHashes) {
  auto world = World();
  ASSERT_NE(world, nullptr);
  if (world->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  AgreementSummary mine{world->rank() == 1 ? 2u : 1u, "3 parameters"};
  absl::Status s = AgreeAcrossRanks(*world, "shapes", mine);
  ASSERT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(s.message(),
            "shapes: rank 1 has 3 parameters (hash 0000000000000002), rank 0 "
            "has 3 parameters (hash 0000000000000001)");
}

TEST(AgreementVerdictTest, LongTextsAreCutAndIdsName) {
  const std::string a(300, 'a');
  std::string b = a;
  b.back() = 'b';  // differs past the cut: the hash tells them apart
  std::vector<AgreementSummary> all = {AgreementSummary::Of(a),
                                       AgreementSummary::Of(a),
                                       AgreementSummary::Of(b)};
  const int ids[] = {4, 7, 9};
  absl::Status s =
      AgreementVerdict("states", all, {.member = "replica", .ids = ids});
  ASSERT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("states: replica 9 has aaaa"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("... (hash "));
  EXPECT_THAT(std::string(s.message()), HasSubstr("), replica 4 has aaa"));
  EXPECT_TRUE(AgreementVerdict("states", {all[0], all[1]}).ok());
  EXPECT_EQ(DisagreementMessage("w", 3, "X", 0, "Y"),
            "w: rank 3 has X, rank 0 has Y");
}

}  // namespace
}  // namespace vemesh
