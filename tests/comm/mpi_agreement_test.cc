// CheckAgreement: agreeing ranks pass; a disagreement names the rank and the
// values on every rank; a missing rank gives DeadlineExceeded in time.

#include "vemesh/comm/mpi/mpi_agreement.h"

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

// A private communicator per test, so a left-over request cannot match
// another test's.
class Agreement : public ::testing::Test {
 protected:
  void SetUp() override {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  void TearDown() override { MPI_Comm_free(&comm_); }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
};

TEST_F(Agreement, SameArgumentsPass) {
  std::vector<AgreementField> fields = {{"shape", "(2, 2)"},
                                        {"names", "[DP, TP]"}};
  absl::Status s =
      CheckAgreement(comm_, "test", fields, absl::Now() + absl::Seconds(20));
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(Agreement, TheFirstDifferingRankIsNamedEverywhere) {
  if (size_ < 2) GTEST_SKIP() << "needs 2 ranks";
  // Ranks from 1 on differ in "names"; the last rank also differs in shape.
  std::vector<AgreementField> fields = {
      {"shape", rank_ == size_ - 1 ? "(4)" : "(2, 2)"},
      {"names", rank_ == 0 ? "[DP, TP]" : "[TP, DP]"}};
  absl::Status s =
      CheckAgreement(comm_, "test", fields, absl::Now() + absl::Seconds(20));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("rank 1 passed names [TP, DP] but rank 0 passed "
                        "[DP, TP]"));
  if (size_ == 2) {
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 passed shape (4)"));
  } else {
    EXPECT_THAT(std::string(s.message()), ::testing::Not(HasSubstr("shape")));
  }
}

TEST_F(Agreement, LongValuesAreShortened) {
  if (size_ < 2) GTEST_SKIP() << "needs 2 ranks";
  std::string long_value(1000, rank_ == 0 ? 'a' : 'b');
  std::vector<AgreementField> fields = {{"ranks", long_value}};
  absl::Status s =
      CheckAgreement(comm_, "test", fields, absl::Now() + absl::Seconds(20));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("(1000 characters)"));
  EXPECT_LT(s.message().size(), 600u);
}

TEST_F(Agreement, AMissingRankIsDeadlineExceeded) {
  if (size_ < 2) GTEST_SKIP() << "needs 2 ranks";
  std::vector<AgreementField> fields = {{"shape", "(2)"}};
  if (rank_ != 0) {
    const absl::Time start = absl::Now();
    absl::Status s = CheckAgreement(comm_, "DeviceMesh::Create", fields,
                                    start + absl::Milliseconds(300));
    EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("unusable"));
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  }
  // Rank 0 arrives late, which completes the others' abandoned request so
  // that this test leaves MPI clean (a real job would end instead).
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank_ == 0) {
    EXPECT_TRUE(CheckAgreement(comm_, "late", fields,
                               absl::Now() + absl::Seconds(20))
                    .ok());
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace vemesh
