// Placement (vemesh/placement/placement.h) against counts done by hand here,
// its JSON text, the placement warnings, and the log sink they go through.
#include "vemesh/placement/placement.h"

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/base/log.h"

namespace vemesh {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

MeshLayout Layout(std::vector<int64_t> shape, std::vector<std::string> names,
                  std::vector<int64_t> ranks = {}) {
  auto layout = MeshLayout::Create(shape, names, ranks);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *std::move(layout);
}

// World ranks placed host by host: ranks_per_host consecutive ranks each.
std::vector<std::string> Block(int world, int per_host) {
  std::vector<std::string> hosts;
  for (int r = 0; r < world; ++r)
    hosts.push_back("node" + std::to_string(r / per_host));
  return hosts;
}

// Round robin over `host_count` hosts (srun --distribution=cyclic).
std::vector<std::string> Cyclic(int world, int host_count) {
  std::vector<std::string> hosts;
  for (int r = 0; r < world; ++r)
    hosts.push_back("node" + std::to_string(r % host_count));
  return hosts;
}

// The reference: every group along `dim`, by brute force over the groups
// MeshLayout itself lists, counting those that touch more than one host.
int64_t CrossingByHand(const MeshLayout& layout, const std::string& dim,
                       const std::vector<std::string>& hosts) {
  auto groups = layout.groups({dim});
  EXPECT_TRUE(groups.ok());
  int64_t crossing = 0;
  for (const auto& group : *groups) {
    for (int64_t r : group) {
      if (hosts[r] != hosts[group.front()]) {
        ++crossing;
        break;
      }
    }
  }
  return crossing;
}

TEST(PlacementTest, BlockTwoHostsKeepsTensorParallelInside) {
  const MeshLayout layout = Layout({2, 2, 2}, {"PP", "DP", "TP"});
  auto p = ComputePlacement(layout, Block(8, 4));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->hosts, ElementsAre("node0", "node1"));
  EXPECT_THAT(p->rank_hosts, ElementsAre(0, 0, 0, 0, 1, 1, 1, 1));
  ASSERT_THAT(p->dims, SizeIs(3));
  EXPECT_EQ(p->dim("PP")->crossing_groups, 4);
  EXPECT_EQ(p->dim("DP")->crossing_groups, 0);
  EXPECT_EQ(p->dim("TP")->crossing_groups, 0);
  EXPECT_EQ(p->dim("TP")->group_count, 4);
  EXPECT_EQ(p->dim("TP")->group_size, 2);
  EXPECT_EQ(p->dim("EP"), nullptr);
}

TEST(PlacementTest, EveryDimensionMatchesTheGroupsCountedByHand) {
  struct Case {
    std::vector<int64_t> shape;
    std::vector<std::string> names;
    std::vector<int64_t> ranks;
    std::vector<std::string> hosts;
  };
  std::vector<Case> cases = {
      {{2, 2, 2}, {"PP", "DP", "TP"}, {}, Cyclic(8, 2)},
      {{2, 2, 2}, {"PP", "DP", "TP"}, {}, Cyclic(8, 4)},
      {{4, 2}, {"DP", "TP"}, {}, Block(8, 2)},
      {{2, 3, 2}, {"PP", "DP", "TP"}, {}, Block(12, 3)},
      // Uneven hosts (a hostfile with slots 4, 2, 2) and a world larger
      // than the mesh.
      {{2, 3}, {"DP", "TP"}, {}, {"a", "a", "a", "a", "b", "b", "c", "c"}},
      // A rank table (PyTorch's mesh tensor).
      {{2, 2}, {"DP", "TP"}, {3, 0, 2, 1}, Block(4, 2)},
  };
  for (const Case& c : cases) {
    const MeshLayout layout = Layout(c.shape, c.names, c.ranks);
    auto p = ComputePlacement(layout, c.hosts);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->world_size, static_cast<int64_t>(c.hosts.size()));
    for (size_t r = 0; r < c.hosts.size(); ++r) {
      EXPECT_EQ(p->hosts[p->host_of(static_cast<int64_t>(r))], c.hosts[r]);
    }
    for (const std::string& name : c.names) {
      EXPECT_EQ(p->dim(name)->crossing_groups,
                CrossingByHand(layout, name, c.hosts))
          << layout.ToString() << " along " << name;
    }
  }
}

TEST(PlacementTest, RankOutsideTheWorldIsInvalidArgument) {
  const MeshLayout layout = Layout({2, 2}, {"DP", "TP"});
  auto p = ComputePlacement(layout, Block(3, 3));
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(),
              HasSubstr("rank 3 is outside the world of 3"));
}

TEST(PlacementTest, JsonIsTheDocumentedSchema) {
  const MeshLayout layout = Layout({2, 2}, {"DP", "TP"});
  auto p = ComputePlacement(layout, Cyclic(4, 2));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->ToJson(),
            "{\"vemesh_placement\": 1, \"world_size\": 4, \"mesh\": "
            "{\"dim_names\": [\"DP\", \"TP\"], \"shape\": [2, 2]}, \"hosts\": "
            "[\"node0\", \"node1\"], \"rank_hosts\": [0, 1, 0, 1], \"dims\": "
            "[{\"name\": \"DP\", \"group_count\": 2, \"group_size\": 2, "
            "\"crossing_groups\": 0}, {\"name\": \"TP\", \"group_count\": 2, "
            "\"group_size\": 2, \"crossing_groups\": 2}]}");
}

TEST(PlacementTest, JsonEscapesHostNames) {
  const MeshLayout layout = Layout({1}, {"TP"});
  auto p = ComputePlacement(layout, {std::string("a\"b\\c\n")});
  ASSERT_TRUE(p.ok());
  EXPECT_THAT(p->ToJson(), HasSubstr("\"hosts\": [\"a\\\"b\\\\c\\u000a\"]"));
}

TEST(PlacementWarningsTest, CyclicTensorParallelWarnsWithTheFix) {
  const MeshLayout layout = Layout({2, 2, 2}, {"PP", "DP", "TP"});
  auto p = ComputePlacement(layout, Cyclic(8, 2));
  ASSERT_TRUE(p.ok());
  const std::vector<std::string> roles = {"TP"};
  auto warnings = PlacementWarnings(*p, layout, roles);
  ASSERT_THAT(warnings, SizeIs(1));
  EXPECT_THAT(
      warnings[0],
      HasSubstr("TP is latency-sensitive but 4 of its 4 groups cross hosts"));
  EXPECT_THAT(warnings[0], HasSubstr("srun --distribution=block"));
  // TP is already innermost: only the placement is to change.
  EXPECT_THAT(warnings[0], ::testing::Not(HasSubstr("innermost")));
}

TEST(PlacementWarningsTest, BlockPlacementIsSilent) {
  const MeshLayout layout = Layout({2, 2, 2}, {"PP", "DP", "TP"});
  auto p = ComputePlacement(layout, Block(8, 4));
  ASSERT_TRUE(p.ok());
  const std::vector<std::string> roles = {"TP", "DP"};
  EXPECT_THAT(PlacementWarnings(*p, layout, roles), IsEmpty());
}

TEST(PlacementWarningsTest, AnOuterDimensionIsToldToMoveInward) {
  // TP outermost under block placement of 4 per host: every TP group
  // crosses, and TP innermost would not.
  const MeshLayout layout = Layout({2, 4}, {"TP", "DP"});
  auto p = ComputePlacement(layout, Block(8, 4));
  ASSERT_TRUE(p.ok());
  const std::vector<std::string> roles = {"TP"};
  auto warnings = PlacementWarnings(*p, layout, roles);
  ASSERT_THAT(warnings, SizeIs(1));
  EXPECT_THAT(warnings[0], HasSubstr("make TP the innermost (last) dimension"));
}

TEST(PlacementWarningsTest, RolesMatchIgnoringCaseAndAnyRoleCanBeListed) {
  const MeshLayout layout = Layout({2, 2, 2}, {"pp", "ep", "tp"});
  auto p = ComputePlacement(layout, Cyclic(8, 2));
  ASSERT_TRUE(p.ok());
  const std::vector<std::string> ep_only = {"EP"};
  // EP (stride 2) stays inside a host under cyclic over 2 hosts: nothing.
  EXPECT_THAT(PlacementWarnings(*p, layout, ep_only), IsEmpty());
  const std::vector<std::string> both = {"EP", "TP", "CP", "tp"};
  auto warnings = PlacementWarnings(*p, layout, both);
  ASSERT_THAT(warnings,
              SizeIs(1));  // CP is absent; tp named twice, warned once
  EXPECT_THAT(warnings[0], HasSubstr("tp is latency-sensitive"));
}

TEST(PlacementWarningsTest, SilentWhenNoPlacementCouldKeepTheGroupsInside) {
  // Hosts of 3 ranks cannot hold whole TP groups of 2 in every case.
  const MeshLayout layout = Layout({3, 2}, {"DP", "TP"});
  auto p = ComputePlacement(layout, Block(6, 3));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->dim("TP")->crossing_groups, 1);
  const std::vector<std::string> roles = {"TP"};
  EXPECT_THAT(PlacementWarnings(*p, layout, roles), IsEmpty());
}

TEST(LogSinkTest, WarningsReachTheSinkAndNullRestoresStderr) {
  std::vector<std::pair<LogLevel, std::string>> seen;
  set_log_sink([&seen](LogLevel level, absl::string_view text) {
    seen.emplace_back(level, std::string(text));
  });
  LogWarning("first");
  LogNote("second");
  set_log_sink(nullptr);
  ::testing::internal::CaptureStderr();
  LogWarning("third");
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_THAT(seen, SizeIs(2));
  EXPECT_EQ(seen[0].first, LogLevel::kWarning);
  EXPECT_EQ(seen[0].second, "first");
  EXPECT_EQ(seen[1].first, LogLevel::kNote);
  EXPECT_EQ(err, "vemesh: warning: third\n");
}

}  // namespace
}  // namespace vemesh
