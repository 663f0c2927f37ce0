// `vemesh plan --flatten NAME=D1,D2` and `--view D1,D2`: groups over several
// dimensions, adjacent or not, in every format (table, rank view, JSON,
// SVG), checked against MeshLayout::groups; bad specs are errors naming the
// flag.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/plan/plan.h"
#include "tools/plan/plan_options.h"
#include "tools/plan/render_json.h"
#include "tools/plan/render_svg.h"
#include "tools/plan/render_table.h"
#include "vemesh/layout/mesh_layout.h"

namespace vemesh::plan {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;

absl::StatusOr<Plan> PlanOf(std::vector<std::string> args) {
  absl::StatusOr<PlanOptions> options = ParsePlanArgs(args);
  if (!options.ok()) return options.status();
  return BuildPlanFromOptions(*options);
}

std::vector<std::vector<int64_t>> Expected(std::vector<std::string> dims) {
  auto layout = MeshLayout::Create({2, 2, 2}, {"PP", "DP", "TP"});
  return *layout->groups(dims);
}

TEST(PlanGroups, ParseFlattenAndView) {
  auto f = ParseGroupSpec(true, "EP=DP,TP");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->name, "EP");
  EXPECT_EQ(f->dims, (std::vector<std::string>{"DP", "TP"}));
  auto v = ParseGroupSpec(false, "PP,TP");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->name, "PP,TP");
  for (const char* bad : {"EP", "=DP,TP", "EP=DP,,TP", "EP="}) {
    auto s = ParseGroupSpec(true, bad);
    EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << bad;
    EXPECT_THAT(std::string(s.status().message()),
                HasSubstr(absl::StrCat("--flatten expects NAME=DIM,DIM,..., "
                                       "e.g. EP=DP,TP, got '",
                                       bad, "'")));
  }
  EXPECT_TRUE(absl::IsInvalidArgument(ParseGroupSpec(false, "DP,").status()));
}

TEST(PlanGroups, FlattenedAndNonAdjacentGroupsMatchTheLayout) {
  auto plan =
      PlanOf({"--mesh", "PP=2,DP=2,TP=2", "--ranks-per-host", "4", "--flatten",
              "EP=DP,TP", "--flatten", "PT=PP,TP", "--view", "PP,DP"});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->derived.size(), 3u);
  const std::vector<std::vector<std::string>> spans = {
      {"DP", "TP"}, {"PP", "TP"}, {"PP", "DP"}};
  const bool adjacent[] = {true, false, true};
  const char* locality[] = {"intra-host", "cross-host", "cross-host"};
  for (size_t i = 0; i < spans.size(); ++i) {
    const DimPlan& d = plan->derived[i];
    EXPECT_EQ(d.spans, spans[i]);
    EXPECT_EQ(d.adjacent, adjacent[i]) << d.name;
    EXPECT_EQ(d.size, 4);
    EXPECT_EQ(LocalityName(d.locality.locality), locality[i]) << d.name;
    const auto expected = Expected(spans[i]);
    ASSERT_EQ(d.groups.size(), expected.size());
    for (size_t g = 0; g < expected.size(); ++g) {
      EXPECT_EQ(d.groups[g].ranks, expected[g]) << d.name << " #" << g;
    }
  }
  EXPECT_TRUE(plan->derived[0].flattened);
  EXPECT_FALSE(plan->derived[2].flattened);
  EXPECT_EQ(plan->derived[2].name, "PP,DP");

  const std::string table = RenderTable(*plan);
  EXPECT_THAT(table, HasSubstr("EP=DP,TP groups: 2 of 4 ranks, intra-host"));
  EXPECT_THAT(table, HasSubstr("PT=PP,TP groups: 2 of 4 ranks, cross-host"));
  EXPECT_THAT(table, HasSubstr("#0  hosts 0,1  [0, 1, 4, 5]"));
  EXPECT_THAT(table, HasSubstr("dimensions not adjacent in the mesh"));
  EXPECT_THAT(table, HasSubstr("view PP,DP groups: 2 of 4 ranks"));

  const auto json = nlohmann::json::parse(RenderJson(*plan));
  ASSERT_EQ(json["derived"].size(), 3u);
  EXPECT_EQ(json["derived"][1]["name"], "PT");
  EXPECT_EQ(json["derived"][1]["kind"], "flatten");
  EXPECT_EQ(json["derived"][1]["adjacent"], false);
  EXPECT_EQ(json["derived"][1]["spans"],
            (std::vector<std::string>{"PP", "TP"}));
  EXPECT_EQ(json["derived"][1]["groups"]["items"][1]["ranks"],
            (std::vector<int64_t>{2, 3, 6, 7}));
  EXPECT_EQ(json["derived"][2]["kind"], "view");
  EXPECT_EQ(json["dims"].size(), 3u);  // the mesh's own dimensions unchanged

  const std::string svg = RenderSvg(*plan);
  EXPECT_THAT(svg, HasSubstr("PT=PP,TP (4, not adjacent): cross-host"));
  EXPECT_THAT(svg, HasSubstr("view PP,DP (4): cross-host"));
}

TEST(PlanGroups, RankViewShowsTheRanksFlattenedGroup) {
  auto plan =
      PlanOf({"--mesh", "PP=2,DP=2,TP=2", "--ranks-per-host", "4", "--flatten",
              "EP=DP,TP", "--view", "PP,TP", "--rank", "5"});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->rank_view->derived.size(), 2u);
  const RankView::DimView& ep = plan->rank_view->derived[0];
  EXPECT_EQ(ep.index_in_group, 1);  // (DP, TP) = (0, 1)
  EXPECT_EQ(ep.group.ranks, (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(plan->rank_view->derived[1].group.ranks,
            (std::vector<int64_t>{0, 1, 4, 5}));
  EXPECT_THAT(
      RenderTable(*plan),
      ContainsRegex("EP=DP,TP +1/4 +#1 +host 1 +4 +6 +\\[4, 5, 6, 7\\]"));
  EXPECT_THAT(RenderTable(*plan), ContainsRegex("view PP,TP +3/4 +#0 "));
  const auto json = nlohmann::json::parse(RenderJson(*plan));
  EXPECT_EQ(json["rank_view"]["derived"][1]["name"], "PP,TP");
  EXPECT_EQ(json["rank_view"]["derived"][0]["group"]["ranks"],
            (std::vector<int64_t>{4, 5, 6, 7}));
}

TEST(PlanGroups, ColorByAFlattenedName) {
  auto plan =
      PlanOf({"--mesh", "PP=2,DP=2,TP=2", "--ranks-per-host", "4", "--flatten",
              "PT=PP,TP", "--color-by", "PT", "--format", "svg"});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->color_name, "PT");
  const std::string svg = RenderSvg(*plan);
  EXPECT_THAT(svg, HasSubstr("colour = PT group"));
  EXPECT_THAT(svg, HasSubstr("PT #0: ranks 0, 1, 4, 5"));
  EXPECT_THAT(svg, HasSubstr("PT #1: ranks 2, 3, 6, 7"));
  EXPECT_EQ(nlohmann::json::parse(RenderJson(*plan))["color_by"], "PT");
}

TEST(PlanGroups, BadGroupsNameTheFlag) {
  auto unknown = PlanOf({"--mesh", "PP=2,DP=2,TP=2", "--flatten", "EP=DP,XX"});
  EXPECT_TRUE(absl::IsInvalidArgument(unknown.status()));
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("--flatten EP=DP,XX does not fit PP=2,DP=2,TP=2: "
                        "mesh dimension 'XX' does not exist"));
  auto clash = PlanOf({"--mesh", "PP=2,DP=2,TP=2", "--flatten", "TP=PP,DP"});
  EXPECT_THAT(std::string(clash.status().message()),
              HasSubstr("already has: expected a new name"));
  auto twice = PlanOf({"--mesh", "PP=2,DP=2,TP=2", "--view", "DP,DP"});
  EXPECT_TRUE(absl::IsInvalidArgument(twice.status())) << twice.status();
  EXPECT_THAT(std::string(twice.status().message()), HasSubstr("--view DP,DP"));
  auto color = PlanOf(
      {"--mesh", "PP=2,DP=2,TP=2", "--view", "DP,TP", "--color-by", "EP"});
  EXPECT_THAT(std::string(color.status().message()),
              HasSubstr("nor a --flatten or --view name; expected one of PP, "
                        "DP, TP, DP,TP"));
}

TEST(PlanGroups, BigWorldsStaySummarised) {
  auto plan = PlanOf({"--mesh", "PP=64,DP=128,TP=128", "--flatten", "EP=DP,TP",
                      "--view", "PP,TP"});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->derived[0].locality.group_count, 64);
  EXPECT_LE(plan->derived[0].groups.size(), 6u);
  EXPECT_EQ(plan->derived[1].size, 64 * 128);
}

// Issue 45: --also-mesh lists every mesh of the job and which groups they
// share (the same rank sets: one communicator in the registry's cache).
TEST(PlanMeshes, EveryMeshAndTheGroupsTheyShare) {
  auto plan =
      PlanOf({"--mesh", "PP=2,DP=2,CP=1,TP=2", "--flatten", "DP_CP_TP=DP,CP,TP",
              "--also-mesh", "experts:PP=2,EDP=1,EP=4,ETP=1"});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->sharing.has_value());
  const MeshSharing& s = *plan->sharing;
  ASSERT_EQ(s.meshes.size(), 2u);
  EXPECT_EQ(s.meshes[1].name, "experts");
  EXPECT_EQ(s.meshes[1].spec, "PP=2,EDP=1,EP=4,ETP=1");
  std::vector<std::string> shared;
  for (const SharedDim& d : s.meshes[1].dims) shared.push_back(d.shared_with);
  EXPECT_EQ(shared,
            (std::vector<std::string>{"default.PP", "default.CP",
                                      "default.DP_CP_TP", "default.CP"}));
  EXPECT_EQ(s.total_dims, 9);
  EXPECT_EQ(s.distinct_groups, 5);
  EXPECT_THAT(RenderTable(*plan),
              HasSubstr("EP  size 4  shares default.DP_CP_TP"));
  const auto json = nlohmann::json::parse(RenderJson(*plan));
  EXPECT_EQ(json["meshes"][1]["dims"][2]["shared_with"], "default.DP_CP_TP");
  EXPECT_EQ(json["distinct_groups"], 5);
  // Without --also-mesh: no section, "meshes" is null.
  auto alone = PlanOf({"--mesh", "PP=2,DP=2,TP=2"});
  ASSERT_TRUE(alone.ok());
  EXPECT_FALSE(alone->sharing.has_value());
  EXPECT_TRUE(nlohmann::json::parse(RenderJson(*alone))["meshes"].is_null());
}

TEST(PlanMeshes, BadAlsoMeshIsAnErrorNamingIt) {
  EXPECT_THAT(PlanOf({"--mesh", "PP=2,DP=2,TP=2", "--also-mesh", "experts"})
                  .status()
                  .message(),
              HasSubstr("--also-mesh expects NAME:SPEC"));
  EXPECT_THAT(
      PlanOf({"--mesh", "PP=2,DP=2,TP=2", "--also-mesh", "experts:PP=2,EP=2"})
          .status()
          .message(),
      HasSubstr("has 4 ranks: expected 8"));
  EXPECT_THAT(
      PlanOf({"--mesh", "PP=2,DP=2,TP=2", "--also-mesh", "experts:PP=x"})
          .status()
          .message(),
      HasSubstr("--also-mesh 'experts:PP=x' is malformed"));
}

}  // namespace
}  // namespace vemesh::plan
