// MeshLayout::find_role (a dimension by role, ignoring case) and
// group_member / group_members (one group by number, without the others).
#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "small_shapes.h"
#include "vemesh/layout/mesh_layout.h"

namespace vemesh {
namespace {

using ::vemesh::testing::SmallShapes;

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(MeshLayoutRoles, ExactNameFirstThenIgnoringCase) {
  const MeshLayout layout =
      MeshLayout::Create({2, 2, 2}, {"pp", "DP", "Tp"}).value();
  EXPECT_EQ(layout.find_role("DP").value(), 1);
  EXPECT_EQ(layout.find_role("dp").value(), 1);
  EXPECT_EQ(layout.find_role("TP").value(), 2);
  EXPECT_EQ(layout.find_role("PP").value(), 0);
  // An exact match wins over one that differs only by case.
  const MeshLayout both = MeshLayout::Create({2, 2}, {"tp", "TP"}).value();
  EXPECT_EQ(both.find_role("TP").value(), 1);
  EXPECT_EQ(both.find_role("tp").value(), 0);
}

TEST(MeshLayoutRoles, MissingRoleIsNotFoundNamingTheDimensions) {
  const MeshLayout layout = MeshLayout::Create({2, 2}, {"DP", "TP"}).value();
  const absl::StatusOr<int64_t> ep = layout.find_role("EP");
  ASSERT_FALSE(ep.ok());
  EXPECT_EQ(ep.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(ep.status().message()),
              AllOf(HasSubstr("'EP'"), HasSubstr("[DP, TP]")));
}

TEST(MeshLayoutRoles, TwoDimensionsDifferingOnlyByCaseAreAmbiguous) {
  const MeshLayout layout = MeshLayout::Create({2, 2}, {"tp", "Tp"}).value();
  const absl::StatusOr<int64_t> tp = layout.find_role("TP");
  ASSERT_FALSE(tp.ok());
  EXPECT_EQ(tp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(tp.status().message()),
              AllOf(HasSubstr("role 'TP' matches both dimension 'tp' and 'Tp'"),
                    HasSubstr("[tp, Tp]")));
}

// (Was tools/plan's GroupMembers test,
// HostLocality.GroupMembersMatchLayoutGroups.)
TEST(MeshLayoutGroupMember, GroupMembersMatchLayoutGroups) {
  for (const auto& shape : SmallShapes()) {
    const MeshLayout layout = MeshLayout::Create(shape).value();
    for (int64_t d = 0; d < layout.ndim(); ++d) {
      const auto groups = layout.groups({layout.dim_name(d)}).value();
      for (size_t g = 0; g < groups.size(); ++g) {
        ASSERT_EQ(layout.group_members(d, static_cast<int64_t>(g)), groups[g]);
      }
    }
  }
}

TEST(MeshLayoutGroupMember, RankTablesSubMeshesAndBadIndices) {
  const MeshLayout table =
      MeshLayout::Create({2, 2}, {"DP", "TP"}, {3, 2, 1, 0}).value();
  EXPECT_EQ(table.group_members(1, 0), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(table.group_members(0, 1), (std::vector<int64_t>{2, 0}));
  const MeshLayout layout =
      MeshLayout::Create({2, 2, 2}, {"PP", "DP", "TP"}).value();
  EXPECT_EQ(layout.group_member(2, 3, 0), 6);
  EXPECT_EQ(layout.group_members(1, 3), (std::vector<int64_t>{5, 7}));
  const MeshLayout dp_tp = layout.submesh({"DP", "TP"}, 5).value();
  EXPECT_EQ(dp_tp.group_members(1, 1), dp_tp.groups({"TP"}).value()[1]);
  EXPECT_EQ(layout.group_member(3, 0, 0), -1);  // no such dimension
  EXPECT_EQ(layout.group_member(2, 4, 0), -1);  // no such group
  EXPECT_EQ(layout.group_member(2, 0, 2), -1);  // no such member
  EXPECT_TRUE(layout.group_members(-1, 0).empty());
}

}  // namespace
}  // namespace vemesh
