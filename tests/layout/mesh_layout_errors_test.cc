// Every bad input to MeshLayout: the status code, and a message that names
// the bad value.
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/layout/mesh_layout.h"

namespace vemesh {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

#define EXPECT_ERROR(expr, want, ...)                                         \
  do {                                                                        \
    auto _result = (expr);                                                    \
    ASSERT_FALSE(_result.ok()) << #expr;                                      \
    EXPECT_EQ(_result.status().code(), absl::StatusCode::want)                \
        << #expr << _result.status();                                         \
    EXPECT_THAT(std::string(_result.status().message()), AllOf(__VA_ARGS__)); \
  } while (0)

const std::vector<std::string> kPDT = {"PP", "DP", "TP"};

MeshLayout L222() { return *MeshLayout::Create({2, 2, 2}, kPDT); }

TEST(MeshLayoutErrorsTest, EmptyShape) {
  EXPECT_ERROR(MeshLayout::Create({}), kInvalidArgument, HasSubstr("empty"));
}

TEST(MeshLayoutErrorsTest, SizeBelowOne) {
  EXPECT_ERROR(MeshLayout::Create({2, 0, 2}, kPDT), kInvalidArgument,
               HasSubstr("size 0"), HasSubstr("'DP'"), HasSubstr(">= 1"));
  EXPECT_ERROR(MeshLayout::Create({-4}, {"TP"}), kInvalidArgument,
               HasSubstr("size -4"));
}

TEST(MeshLayoutErrorsTest, ProductOverflowsInt64) {
  EXPECT_ERROR(MeshLayout::Create({1ll << 32, 1ll << 32}, {"DP", "TP"}),
               kInvalidArgument, HasSubstr("4294967296"), HasSubstr("int64"));
}

TEST(MeshLayoutErrorsTest, NameCountDiffersFromShape) {
  EXPECT_ERROR(MeshLayout::Create({2, 2}, kPDT), kInvalidArgument,
               HasSubstr("3 names"), HasSubstr("2 dimensions"));
}

TEST(MeshLayoutErrorsTest, TooManyDimensionsForDefaultNames) {
  EXPECT_ERROR(MeshLayout::Create({2, 2, 2, 2}), kInvalidArgument,
               HasSubstr("4-D"), HasSubstr("explicitly"));
}

TEST(MeshLayoutErrorsTest, DuplicateName) {
  EXPECT_ERROR(MeshLayout::Create({2, 2}, {"TP", "TP"}), kInvalidArgument,
               HasSubstr("'TP'"), HasSubstr("twice"));
}

TEST(MeshLayoutErrorsTest, EmptyName) {
  EXPECT_ERROR(MeshLayout::Create({2, 2}, {"DP", ""}), kInvalidArgument,
               HasSubstr("dimension 1"), HasSubstr("empty name"));
}

TEST(MeshLayoutErrorsTest, UnknownName) {
  EXPECT_ERROR(L222().dim_index("EP"), kNotFound, HasSubstr("'EP'"),
               HasSubstr("[PP, DP, TP]"));
  EXPECT_ERROR(L222().submesh({"XX"}, 0), kNotFound, HasSubstr("'XX'"));
  EXPECT_ERROR(L222().groups({"TP", "YY"}), kNotFound, HasSubstr("'YY'"));
  EXPECT_ERROR(L222().neighbor("ZZ", 0, 1), kNotFound, HasSubstr("'ZZ'"));
  EXPECT_ERROR(L222().flatten({"DP", "QQ"}, "X"), kNotFound, HasSubstr("'QQ'"));
}

TEST(MeshLayoutErrorsTest, RankOutOfRange) {
  EXPECT_ERROR(L222().coordinate_of(8), kOutOfRange, HasSubstr("rank 8"),
               HasSubstr("0 to 7"));
  EXPECT_ERROR(L222().coordinate_of(-1), kOutOfRange, HasSubstr("rank -1"));
  EXPECT_ERROR(L222().submesh({"TP"}, 100), kOutOfRange, HasSubstr("rank 100"));
  EXPECT_ERROR(L222().neighbor("PP", 9, 1), kOutOfRange, HasSubstr("rank 9"));
}

TEST(MeshLayoutErrorsTest, RankNotInSubLayout) {
  MeshLayout tp = *L222().submesh({"TP"}, 5);
  EXPECT_ERROR(tp.coordinate_of(2), kNotFound, HasSubstr("rank 2"),
               HasSubstr("not a member"));
}

TEST(MeshLayoutErrorsTest, CoordinateOfWrongLength) {
  EXPECT_ERROR(L222().rank_at({1, 0}), kInvalidArgument, HasSubstr("[1, 0]"),
               HasSubstr("expected 3"));
}

TEST(MeshLayoutErrorsTest, CoordinateOutOfRange) {
  EXPECT_ERROR(L222().rank_at({1, 2, 0}), kOutOfRange, HasSubstr("[1, 2, 0]"),
               HasSubstr("'DP'"), HasSubstr("0 to 1"));
  EXPECT_ERROR(L222().rank_at({0, 0, -1}), kOutOfRange, HasSubstr("-1"));
}

TEST(MeshLayoutErrorsTest, RankListOfWrongLength) {
  EXPECT_ERROR(MeshLayout::Create({2, 2}, {"DP", "TP"}, {0, 1, 2}),
               kInvalidArgument, HasSubstr("3 entries"), HasSubstr("4 ranks"));
}

TEST(MeshLayoutErrorsTest, RankListWithDuplicate) {
  EXPECT_ERROR(MeshLayout::Create({2, 2}, {"DP", "TP"}, {0, 3, 1, 3}),
               kInvalidArgument, HasSubstr("rank 3 twice"));
}

TEST(MeshLayoutErrorsTest, RankListWithNegative) {
  EXPECT_ERROR(MeshLayout::Create({2}, {"TP"}, {0, -2}), kInvalidArgument,
               HasSubstr("rank -2"));
}

TEST(MeshLayoutErrorsTest, SelectionErrors) {
  EXPECT_ERROR(L222().submesh({}, 0), kInvalidArgument,
               HasSubstr("at least one"));
  EXPECT_ERROR(L222().groups({"TP", "TP"}), kInvalidArgument,
               HasSubstr("'TP' twice"));
  EXPECT_ERROR(L222().flatten({"DP", "TP"}, "PP"), kInvalidArgument,
               HasSubstr("'PP'"));
  EXPECT_ERROR(L222().flatten({"DP", "TP"}, ""), kInvalidArgument,
               HasSubstr("non-empty"));
  EXPECT_ERROR(L222().dim_size(3), kOutOfRange, HasSubstr("index 3"));
}

TEST(MeshLayoutErrorsTest, TooManyDimensions) {
  std::vector<int64_t> shape(40, 1);
  std::vector<std::string> names;
  for (int i = 0; i < 40; ++i) names.push_back(absl::StrCat("d", i));
  EXPECT_ERROR(MeshLayout::Create(shape, names), kInvalidArgument,
               HasSubstr("40 dimensions"));
}

TEST(MeshLayoutErrorsTest, NeighbourShiftOverflow) {
  EXPECT_ERROR(L222().neighbor("PP", 4, INT64_MAX), kOutOfRange,
               HasSubstr("overflows"));
}

}  // namespace
}  // namespace vemesh
