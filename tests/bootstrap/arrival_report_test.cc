// Who never arrived (vemesh/bootstrap/mpi/internal/arrival_report.h): the
// verdict's text, and the report exchange itself on four MPI ranks with one
// rank staying away (rank 3, then rank 0, which one collector stands in for).
// The exchange runs on a private duplicate per test that is never freed:
// a missing rank leaves messages on it, as at a real deadline.

#include "vemesh/bootstrap/mpi/internal/arrival_report.h"

#include <mpi.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vemesh {
namespace {

using ::testing::HasSubstr;

TEST(RankRanges, RunsOfRanksAreRanges) {
  EXPECT_EQ(RankRanges({}), "");
  EXPECT_EQ(RankRanges({3}), "3");
  EXPECT_EQ(RankRanges({3, 4, 5}), "3-5");
  EXPECT_EQ(RankRanges({0, 2, 3, 7}), "0, 2-3, 7");
}

TEST(ArrivalVerdict, NamesTheMissingRanksAndWhereTheOthersAre) {
  EXPECT_EQ(ArrivalVerdict(
                {"node0", "node0", "node0", "", "node1", "node1", "node1", ""}),
            "ranks 3, 7 never arrived (the ranks that did: node0: 0-2; "
            "node1: 4-6)");
  EXPECT_EQ(ArrivalVerdict({"", "a", "a", "b"}),
            "rank 0 never arrived (the ranks that did: a: 1-2; b: 3)");
  // Everyone reported: they came, but some after the others gave up.
  EXPECT_THAT(ArrivalVerdict({"a", "a"}),
              HasSubstr("every rank arrived, but not in time for the others"));
}

TEST(ArrivalVerdict, LongListsAreCut) {
  std::vector<std::string> hosts(1000);
  for (int r = 0; r < 1000; r += 2) hosts[r] = absl::StrCat("h", r / 10);
  const std::string v = ArrivalVerdict(hosts);
  EXPECT_THAT(v, HasSubstr("ranks 1, 3, 5,"));
  EXPECT_THAT(v, HasSubstr(", ..."));
  EXPECT_THAT(v, HasSubstr("and 92 more hosts"));
  EXPECT_LT(v.size(), 1000u);
}

TEST(ArrivalGrace, ATenthOfTheTimeoutWithinOneToFiveSeconds) {
  EXPECT_EQ(ArrivalGrace(absl::Seconds(3)), absl::Seconds(1));
  EXPECT_EQ(ArrivalGrace(absl::Seconds(20)), absl::Seconds(2));
  EXPECT_EQ(ArrivalGrace(absl::Seconds(600)), absl::Seconds(5));
}

// Four ranks on two pretend hosts ("h0": ranks 0-1, "h1": ranks 2-3); the
// `missing` rank does not report. Returns this rank's verdict ("" for the
// missing rank) and the time it took.
std::string RunWithout(int missing, absl::Duration* took) {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);  // left behind: see the file comment
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::string verdict;
  const absl::Time start = absl::Now();
  if (rank != missing) {
    verdict = ReportArrival(comm, rank, 4, absl::StrCat("h", rank / 2),
                            absl::Seconds(1));
  }
  *took = absl::Now() - start;
  MPI_Barrier(MPI_COMM_WORLD);
  return verdict;
}

int WorldSize() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

TEST(ReportArrival, EveryRankThatCameNamesTheMissingOne) {
  if (WorldSize() != 4) GTEST_SKIP() << "needs exactly 4 ranks";
  absl::Duration took;
  const std::string verdict = RunWithout(3, &took);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 3) return;
  EXPECT_EQ(verdict,
            "rank 3 never arrived (the ranks that did: h0: 0-1; h1: 2)");
  // Bounded: a collector's grace plus its answers' half grace; a reporter's
  // answer comes then.
  EXPECT_LE(took,
            absl::Seconds(1) + absl::Milliseconds(500) + absl::Seconds(2));
}

TEST(ReportArrival, AMissingRankZeroIsNamedByRankOne) {
  if (WorldSize() != 4) GTEST_SKIP() << "needs exactly 4 ranks";
  absl::Duration took;
  const std::string verdict = RunWithout(0, &took);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) return;
  EXPECT_EQ(verdict,
            "rank 0 never arrived (the ranks that did: h0: 1; h1: 2-3)");
  EXPECT_LE(took,
            absl::Seconds(1) + absl::Milliseconds(500) + absl::Seconds(2));
}

TEST(ReportArrival, ARankAloneSaysTheOthersGaveUpOrNeverCame) {
  if (WorldSize() != 4) GTEST_SKIP() << "needs exactly 4 ranks";
  // Only rank 2 (a reporter) comes: no collector answers it. Then only
  // rank 0 (a collector) comes: it hears nobody.
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (rank == 2) {
    const std::string v = ReportArrival(comm, 2, 4, "h1", absl::Seconds(1));
    EXPECT_THAT(v, HasSubstr("ranks 0 and 1, which collect the reports"));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Comm alone = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &alone);
  if (rank == 0) {
    const std::string v = ReportArrival(alone, 0, 4, "h0", absl::Seconds(1));
    EXPECT_THAT(v, HasSubstr("no other rank reported within 1s"));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace vemesh
