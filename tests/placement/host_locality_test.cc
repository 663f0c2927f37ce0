// The arithmetic host-locality count (vemesh/placement/host_locality.h)
// against a scan of every group, over every shape of up to 3 dimensions and
// up to 48 ranks, and many host sizes. (The planner's group summaries and
// suggested orders: tests/tools/plan_placement_test.cc.)

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "small_shapes.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/placement/host_locality.h"
#include "vemesh/placement/host_map.h"

namespace vemesh {
namespace {

using ::vemesh::testing::SmallShapes;

TEST(HostLocality, ArithmeticMatchesScan) {
  for (const auto& shape : SmallShapes()) {
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

}  // namespace
}  // namespace vemesh
