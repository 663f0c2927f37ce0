// The arithmetic host-locality count against a scan of every group, over
// every shape of up to 3 dimensions and up to 48 ranks, and many host sizes;
// and the suggested order, checked by rebuilding the reordered layout.

#include <algorithm>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tools/plan/dim_order.h"
#include "tools/plan/group_members.h"
#include "tools/plan/group_summary.h"
#include "tools/plan/host_locality.h"
#include "vemesh/layout/mesh_layout.h"

namespace vemesh::plan {
namespace {

std::vector<std::vector<int64_t>> Shapes() {
  std::vector<std::vector<int64_t>> out;
  for (int64_t a = 1; a <= 6; ++a) {
    out.push_back({a});
    for (int64_t b = 1; b <= 6; ++b) {
      out.push_back({a, b});
      for (int64_t c = 1; c <= 4; ++c) {
        if (a * b * c <= 48) out.push_back({a, b, c});
      }
    }
  }
  return out;
}

TEST(HostLocality, ArithmeticMatchesScan) {
  for (const auto& shape : Shapes()) {
    const MeshLayout layout = MeshLayout::Create(shape).value();
    ASSERT_TRUE(IsDefaultLayout(layout));
    for (int64_t h = 1; h <= 13; ++h) {
      const HostMap hosts{h, layout.size()};
      for (int64_t d = 0; d < layout.ndim(); ++d) {
        const DimLocality fast = AnalyzeDimLocality(layout, d, hosts);
        const DimLocality scan = AnalyzeDimLocalityByScan(layout, d, hosts);
        ASSERT_EQ(fast.crossing_groups, scan.crossing_groups)
            << layout.ToString() << " dim " << d << " h " << h;
        ASSERT_EQ(fast.group_count, scan.group_count);
        ASSERT_EQ(fast.locality, scan.locality);
      }
    }
  }
}

TEST(HostLocality, GroupMembersMatchLayoutGroups) {
  for (const auto& shape : Shapes()) {
    const MeshLayout layout = MeshLayout::Create(shape).value();
    for (int64_t d = 0; d < layout.ndim(); ++d) {
      const auto groups = layout.groups({layout.dim_name(d)}).value();
      for (size_t g = 0; g < groups.size(); ++g) {
        ASSERT_EQ(GroupMembers(layout, d, static_cast<int64_t>(g)), groups[g]);
      }
    }
  }
}

// An elided group's host count is arithmetic (first member, stride, size);
// it must equal the count of distinct hosts over every member.
TEST(GroupSummary, ElidedHostCountMatchesEveryMember) {
  for (const auto& shape : Shapes()) {
    const MeshLayout layout = MeshLayout::Create(shape).value();
    for (int64_t h = 1; h <= 13; ++h) {
      const HostMap hosts{h, layout.size()};
      for (int64_t d = 0; d < layout.ndim(); ++d) {
        const auto groups = layout.groups({layout.dim_name(d)}).value();
        for (size_t g = 0; g < groups.size(); ++g) {
          std::vector<int64_t> seen;
          for (int64_t r : groups[g]) seen.push_back(hosts.host_of(r));
          std::sort(seen.begin(), seen.end());
          const int64_t distinct =
              std::unique(seen.begin(), seen.end()) - seen.begin();
          const GroupSummary s = SummarizeGroup(
              layout, d, static_cast<int64_t>(g), hosts, /*max_listed=*/1);
          ASSERT_EQ(s.host_count, distinct)
              << layout.ToString() << " dim " << d << " group " << g
              << " h " << h;
        }
      }
    }
  }
}

// A group of 2^62 members is summarised without visiting them.
TEST(GroupSummary, AHugeGroupIsSummarisedFromItsEnds) {
  const MeshLayout layout =
      MeshLayout::Create({int64_t{1} << 62}, {"TP"}).value();
  const GroupSummary s = SummarizeGroup(
      layout, 0, 0, HostMap{8, layout.size()});
  EXPECT_EQ(s.size, int64_t{1} << 62);
  EXPECT_EQ(s.ranks, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(s.tail.back(), (int64_t{1} << 62) - 1);
  EXPECT_EQ(s.host_count, int64_t{1} << 59);
}

TEST(HostLocality, RankTableIsNotDefault) {
  const MeshLayout table =
      MeshLayout::Create({2, 2}, {"DP", "TP"}, {3, 2, 1, 0}).value();
  EXPECT_FALSE(IsDefaultLayout(table));
  // Scanned: TP groups {3,2} and {1,0} stay on hosts of 2.
  EXPECT_EQ(AnalyzeDimLocality(table, 1, HostMap{2, 4}).crossing_groups, 0);
  EXPECT_EQ(AnalyzeDimLocality(table, 0, HostMap{2, 4}).crossing_groups, 2);
}

TEST(HostLocality, MillionRanksIsFast) {
  const MeshLayout layout = MeshLayout::Create({64, 128, 128}).value();
  const DimLocality tp = AnalyzeDimLocality(layout, 2, HostMap{256, 1 << 20});
  EXPECT_EQ(tp.crossing_groups, 0);
  const DimLocality dp = AnalyzeDimLocality(layout, 1, HostMap{256, 1 << 20});
  EXPECT_EQ(dp.crossing_groups, dp.group_count);
}

TEST(DimOrder, EverySuggestionIsVerified) {
  for (const auto& shape : Shapes()) {
    if (shape.size() != 3) continue;
    const MeshLayout layout =
        MeshLayout::Create(shape, {"PP", "TP", "DP"}).value();
    for (int64_t h = 1; h <= 12; ++h) {
      const HostMap hosts{h, layout.size()};
      const OrderSuggestion s =
          SuggestOrderKeepingInHost(layout, "TP", hosts).value();
      if (!s.found) {
        EXPECT_FALSE(s.reason.empty());
        continue;
      }
      std::vector<int64_t> reordered;
      for (const std::string& n : s.order) {
        reordered.push_back(layout.dim_size(n).value());
      }
      const MeshLayout fixed = MeshLayout::Create(reordered, s.order).value();
      EXPECT_EQ(AnalyzeDimLocality(fixed, fixed.dim_index("TP").value(), hosts)
                    .crossing_groups,
                0)
          << layout.ToString() << " -> " << s.mesh_spec << " h " << h;
    }
  }
}

TEST(DimOrder, MovesTpInnermostAndExplainsTheImpossible) {
  const MeshLayout layout =
      MeshLayout::Create({4, 8, 2}, {"PP", "TP", "DP"}).value();
  const OrderSuggestion s =
      SuggestOrderKeepingInHost(layout, "TP", HostMap{8, 64}).value();
  ASSERT_TRUE(s.found);
  EXPECT_EQ(s.mesh_spec, "PP=4,DP=2,TP=8");
  const OrderSuggestion none =
      SuggestOrderKeepingInHost(layout, "TP", HostMap{4, 64}).value();
  EXPECT_FALSE(none.found);
  EXPECT_NE(none.reason.find("TP=8"), std::string::npos);
  EXPECT_FALSE(SuggestOrderKeepingInHost(layout, "EP", HostMap{4, 64}).ok());
}

}  // namespace
}  // namespace vemesh::plan
