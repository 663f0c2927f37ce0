// CheckAgreement over the MPI bootstrap: agreeing ranks pass; a
// disagreement names the rank and the values on every rank; a missing rank
// gives DeadlineExceeded in time, and the bootstrap refuses later calls.

#include "vemesh/bootstrap/agreement.h"
#include "vemesh/bootstrap/mpi/mpi_bootstrap.h"

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

// A private bootstrap per test (its own MPI duplicate), so a left-over
// request cannot match another test's.
class Agreement : public ::testing::Test {
 protected:
  void SetUp() override {
    auto boot = MpiBootstrap::Create(MPI_COMM_WORLD, "test",
                                     absl::Now() + absl::Seconds(20));
    ASSERT_TRUE(boot.ok()) << boot.status();
    boot_ = *std::move(boot);
    rank_ = boot_->rank();
    size_ = boot_->size();
  }

  std::shared_ptr<MpiBootstrap> boot_;
  int rank_ = 0;
  int size_ = 0;
};

TEST_F(Agreement, AllGatherCarriesEveryRanksBytesInRankOrder) {
  auto all = boot_->all_gather(std::string(static_cast<size_t>(rank_), 'x'),
                               absl::Now() + absl::Seconds(20));
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    EXPECT_EQ((*all)[r], std::string(static_cast<size_t>(r), 'x'));
  }
}

TEST_F(Agreement, SameArgumentsPass) {
  std::vector<AgreementField> fields = {{"shape", "(2, 2)"},
                                        {"names", "[DP, TP]"}};
  absl::Status s =
      CheckAgreement(*boot_, "test", fields, absl::Now() + absl::Seconds(20));
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(Agreement, TheFirstDifferingRankIsNamedEverywhere) {
  if (size_ < 2) GTEST_SKIP() << "needs 2 ranks";
  // Ranks from 1 on differ in "names"; the last rank also differs in shape.
  std::vector<AgreementField> fields = {
      {"shape", rank_ == size_ - 1 ? "(4)" : "(2, 2)"},
      {"names", rank_ == 0 ? "[DP, TP]" : "[TP, DP]"}};
  absl::Status s =
      CheckAgreement(*boot_, "test", fields, absl::Now() + absl::Seconds(20));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("test names: rank 1 has [TP, DP], rank 0 has "
                        "[DP, TP]"));
  if (size_ == 2) {
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("test shape: rank 1 has (4), rank 0 has (2, 2)"));
  } else {
    EXPECT_THAT(std::string(s.message()), ::testing::Not(HasSubstr("shape")));
  }
}

TEST_F(Agreement, LongValuesAreShortened) {
  if (size_ < 2) GTEST_SKIP() << "needs 2 ranks";
  std::string long_value(1000, rank_ == 0 ? 'a' : 'b');
  std::vector<AgreementField> fields = {{"ranks", long_value}};
  absl::Status s =
      CheckAgreement(*boot_, "test", fields, absl::Now() + absl::Seconds(20));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("(1000 characters)"));
  EXPECT_LT(s.message().size(), 600u);
}

// A missing rank, and a late one, are no_hang scenarios (tests/reliability):
// a DeadlineExceeded abandons MPI for the whole process, so it cannot share
// a binary with other tests.

}  // namespace
}  // namespace vemesh
