#include "vemesh/layout/mesh_layout.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vemesh {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

MeshLayout Make(std::vector<int64_t> shape, std::vector<std::string> names = {},
                std::vector<int64_t> ranks = {}) {
  auto layout = MeshLayout::Create(shape, names, ranks);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *std::move(layout);
}

std::vector<int64_t> Vec(const Coordinate& c) { return {c.begin(), c.end()}; }

// -- Worked examples, derived by hand --------------------------------------

TEST(MeshLayoutTest, RowMajorPPDPTP) {
  // Shape (2,2,2): rank = 4*pp + 2*dp + tp.
  MeshLayout l = Make({2, 2, 2});
  EXPECT_THAT(l.dim_names(), ElementsAre("PP", "DP", "TP"));
  EXPECT_EQ(l.size(), 8);
  EXPECT_EQ(l.ndim(), 3);
  EXPECT_THAT(Vec(*l.coordinate_of(5)), ElementsAre(1, 0, 1));
  EXPECT_EQ(*l.rank_at({1, 0, 1}), 5);
  EXPECT_THAT(l.submesh({"TP"}, 5)->ranks(), ElementsAre(4, 5));
  EXPECT_THAT(l.submesh({"DP"}, 5)->ranks(), ElementsAre(5, 7));
  EXPECT_THAT(l.submesh({"PP"}, 5)->ranks(), ElementsAre(1, 5));
  EXPECT_THAT(l.submesh({"DP", "TP"}, 5)->ranks(), ElementsAre(4, 5, 6, 7));
  // In the order asked: TP outer, DP inner.
  EXPECT_THAT(l.submesh({"TP", "DP"}, 5)->ranks(), ElementsAre(4, 6, 5, 7));
  EXPECT_EQ(**l.neighbor("PP", 5, -1), 1);
  EXPECT_FALSE(l.neighbor("PP", 5, +1)->has_value());
  EXPECT_EQ(**l.neighbor("PP", 5, +1, /*periodic=*/true), 1);
  auto dp_groups = l.groups({"DP"});
  ASSERT_TRUE(dp_groups.ok());
  EXPECT_EQ(*dp_groups, (std::vector<std::vector<int64_t>>{
                            {0, 2}, {1, 3}, {4, 6}, {5, 7}}));
}

TEST(MeshLayoutTest, DefaultNamesAreTheLastOfPPDPTP) {
  EXPECT_THAT(Make({8}).dim_names(), ElementsAre("TP"));
  EXPECT_THAT(Make({2, 4}).dim_names(), ElementsAre("DP", "TP"));
  auto four = MeshLayout::Create({2, 2, 2, 2});
  ASSERT_FALSE(four.ok());
  EXPECT_THAT(four.status().message(), HasSubstr("4-D"));
}

TEST(MeshLayoutTest, ExplicitRankList) {
  MeshLayout l = Make({2, 2}, {"DP", "TP"}, {7, 3, 5, 1});
  EXPECT_THAT(Vec(*l.coordinate_of(5)), ElementsAre(1, 0));
  EXPECT_EQ(*l.rank_at({0, 1}), 3);
  EXPECT_THAT(l.submesh({"DP"}, 3)->ranks(), ElementsAre(3, 1));
  EXPECT_EQ(l.coordinate_of(0).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(MeshLayoutTest, SubmeshOfNonMemberIsNotFound) {
  MeshLayout tp = *Make({2, 2, 2}).submesh({"TP"}, 5);
  EXPECT_FALSE(tp.contains(0));
  EXPECT_EQ(tp.coordinate_of(0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Vec(*tp.coordinate_of(4)), ElementsAre(0));
}

TEST(MeshLayoutTest, FlattenMergesInTheOrderGiven) {
  MeshLayout l = Make({2, 2, 2});
  MeshLayout f = *l.flatten({"DP", "TP"}, "DPTP");
  EXPECT_THAT(f.dim_names(), ElementsAre("PP", "DPTP"));
  EXPECT_THAT(f.shape(), ElementsAre(2, 4));
  EXPECT_THAT(f.submesh({"DPTP"}, 5)->ranks(), ElementsAre(4, 5, 6, 7));
  MeshLayout g = *l.flatten({"TP", "PP"}, "TPPP");
  EXPECT_THAT(g.dim_names(), ElementsAre("TPPP", "DP"));
  EXPECT_THAT(g.submesh({"TPPP"}, 0)->ranks(), ElementsAre(0, 4, 1, 5));
}

TEST(MeshLayoutTest, MillionRankWorldBothWays) {
  MeshLayout l = Make({64, 128, 128});
  EXPECT_EQ(l.size(), 1048576);
  EXPECT_LT(l.memory_bytes(), 1024u);
  for (int64_t r = 0; r < l.size(); r += 9973) {
    auto c = l.coordinate_of(r);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ((*c)[0], r / (128 * 128));
    EXPECT_EQ((*c)[1], (r / 128) % 128);
    EXPECT_EQ((*c)[2], r % 128);
    EXPECT_EQ(*l.rank_at(*c), r);
  }
  EXPECT_EQ(*l.rank_at({63, 127, 127}), 1048575);
  auto tp = l.submesh({"TP"}, 1048575);
  ASSERT_TRUE(tp.ok());
  EXPECT_EQ(tp->ranks().front(), 1048575 - 127);
}

}  // namespace
}  // namespace vemesh

namespace vemesh {
namespace {

TEST(MeshLayoutEqualityTest, SameMeshHoweverDerived) {
  MeshLayout l = Make({2, 2, 2});
  EXPECT_EQ(*l.submesh({"TP"}, 5), *l.submesh({"TP"}, 4));
  EXPECT_FALSE(*l.submesh({"TP"}, 5) == *l.submesh({"TP"}, 3));
  // A flattened 1-D view equals a fresh layout with the same ranks.
  MeshLayout flat = *l.flatten({"PP", "DP", "TP"}, "TP");
  EXPECT_EQ(flat, Make({8}));
  EXPECT_FALSE(Make({8}) == Make({8}, {"DP"}));
  EXPECT_FALSE(Make({2}, {"TP"}, {1, 0}) == Make({2}, {"TP"}));
  // Huge default layouts compare without listing their ranks.
  EXPECT_EQ(Make({1024, 1024, 1024}), Make({1024, 1024, 1024}));
}

// is_arange() (O(ndim)) against its definition: the ranks, listed, are
// 0, 1, ..., size - 1. Over every sub-mesh and flattening of small meshes.
TEST(MeshLayoutArangeTest, AgreesWithTheListedRanks) {
  auto listed_arange = [](const MeshLayout& l) {
    std::vector<int64_t> expected(l.size());
    std::iota(expected.begin(), expected.end(), 0);
    return l.ranks() == expected;
  };
  const std::vector<std::string> names = {"PP", "DP", "TP"};
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
           {2, 3, 4}, {1, 3, 2}, {3, 1, 1}, {2, 2, 2}, {1, 1, 5}}) {
    const MeshLayout root = Make(shape, names);
    EXPECT_TRUE(root.is_arange());
    std::vector<std::vector<std::string>> subsets;
    for (int mask = 1; mask < 8; ++mask) {
      std::vector<std::string> dims;
      for (int d = 0; d < 3; ++d) {
        if (mask & (1 << d)) dims.push_back(names[d]);
      }
      do {
        subsets.push_back(dims);
      } while (std::next_permutation(dims.begin(), dims.end()));
    }
    for (const auto& dims : subsets) {
      for (int64_t r = 0; r < root.size(); ++r) {
        const MeshLayout sub = *root.submesh(dims, r);
        EXPECT_EQ(sub.is_arange(), listed_arange(sub))
            << sub.ToString() << " of rank " << r;
      }
      const MeshLayout flat = *root.flatten(dims, "F");
      EXPECT_EQ(flat.is_arange(), listed_arange(flat)) << flat.ToString();
      const MeshLayout flat_sub = *flat.submesh({"F"}, 0);
      EXPECT_EQ(flat_sub.is_arange(), listed_arange(flat_sub));
    }
  }
  EXPECT_FALSE(Make({2}, {"TP"}, {0, 1}).is_arange());  // a rank table
  EXPECT_TRUE(Make({int64_t{1} << 62}).is_arange());
}

}  // namespace
}  // namespace vemesh
