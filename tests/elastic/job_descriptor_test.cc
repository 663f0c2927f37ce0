// The elastic job descriptor's comparison
// (vemesh/elastic/internal/job_descriptor.h): the differences are named, in any
// order of items, and the job's text, which anyone who can write the store
// controls, is bounded.

#include "vemesh/elastic/internal/job_descriptor.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vemesh {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(JobDescriptor, TheSameItemsInAnyOrderAreAdmitted) {
  EXPECT_TRUE(
      CompareJobDescriptors("mesh=1x2;batch=12", "mesh=1x2;batch=12").ok());
  EXPECT_TRUE(
      CompareJobDescriptors("batch=12;mesh=1x2", "mesh=1x2;batch=12").ok());
}

TEST(JobDescriptor, EachDifferenceIsNamedWithBothValues) {
  const absl::Status s = CompareJobDescriptors(
      "mesh=1x2;batch=12;lr=0.1", "mesh=1x4;batch=12;optimizer=adam");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("mesh is 1x2 here but 1x4 in the job"),
                    HasSubstr("lr is 0.1 here but (none) in the job"),
                    HasSubstr("optimizer is (none) here but adam in the job"),
                    Not(HasSubstr("batch"))));
}

TEST(JobDescriptor, AHugeRecordedValueIsQuotedShort) {
  const std::string huge(50000, 'x');
  const absl::Status s =
      CompareJobDescriptors("mesh=1x2", absl::StrCat("mesh=", huge));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("(50000 bytes)"));
  EXPECT_LT(s.message().size(), 300u);
}

TEST(JobDescriptor, ManyDifferencesNameTheFirstFewAndACount) {
  std::string job;
  for (int i = 0; i < 200; ++i) absl::StrAppend(&job, "k", i, "=v;");
  const absl::Status s = CompareJobDescriptors("", job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrCat("and ", 200 - kMaxNamedDifferences,
                                     " more difference(s)")));
  EXPECT_LT(s.message().size(), 1500u);
}

TEST(JobDescriptor, ATextOverTheBoundsIsRefusedNamingWhich) {
  const absl::Status big = CompareJobDescriptors(
      "mesh=1x2", std::string(kMaxJobDescriptorBytes + 1, 'a'));
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.message(), HasSubstr("the job's recorded job descriptor of"));
  std::string many;
  for (size_t i = 0; i <= kMaxJobDescriptorFields; ++i) {
    absl::StrAppend(&many, "k", i, "=1;");
  }
  auto parsed = ParseJobDescriptor(many);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(), HasSubstr("more than 256 items"));
}

}  // namespace
}  // namespace vemesh
