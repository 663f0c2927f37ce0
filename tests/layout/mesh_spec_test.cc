#include "vemesh/layout/mesh_spec.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vemesh {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(MeshSpecTest, ParsesNamesAndSizesInOrder) {
  auto spec = ParseMeshSpec("PP=2,DP=4,TP=8");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->names, ElementsAre("PP", "DP", "TP"));
  EXPECT_THAT(spec->shape, ElementsAre(2, 4, 8));
  EXPECT_EQ(FormatMeshSpec(*spec), "PP=2,DP=4,TP=8");
}

TEST(MeshSpecTest, AcceptsSpacesAndOneDimension) {
  auto spec = ParseMeshSpec("  EP = 16 ");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->names, ElementsAre("EP"));
  EXPECT_THAT(spec->shape, ElementsAre(16));
}

struct BadSpec {
  const char* text;
  const char* named;  // what the message must name
};

class MeshSpecBadTest : public ::testing::TestWithParam<BadSpec> {};

TEST_P(MeshSpecBadTest, RejectsWithMessageNamingTheBadPart) {
  auto spec = ParseMeshSpec(GetParam().text);
  ASSERT_FALSE(spec.ok()) << GetParam().text;
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr(GetParam().named));
}

INSTANTIATE_TEST_SUITE_P(
    Catalogue, MeshSpecBadTest,
    ::testing::Values(BadSpec{"", "empty"}, BadSpec{"PP2", "'PP2'"},
                      BadSpec{"PP=0", "'0'"}, BadSpec{"PP=-3", "'-3'"},
                      BadSpec{"PP=x", "'x'"}, BadSpec{"PP=2,,TP=2", "''"},
                      BadSpec{"2=2", "'2'"}, BadSpec{"P-P=2", "'P-P'"},
                      BadSpec{"TP=99999999999999999999",
                              "99999999999999999999"},
                      BadSpec{"PP=2,", "without '='"}));

}  // namespace
}  // namespace vemesh
