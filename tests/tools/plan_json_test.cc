// The JSON of `vemesh plan`, parsed back and checked against MeshLayout: every
// rank's coordinate and host, every group of every dimension, the host
// crossing flags, and the TP warning with a suggestion that really fixes it.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tools/plan/host_locality.h"
#include "tools/plan/plan.h"
#include "tools/plan/render_json.h"
#include "vemesh/mesh_layout.h"

namespace vemesh::plan {
namespace {

using nlohmann::json;

PlanSettings Settings(int64_t per_host, std::optional<int64_t> rank = {},
                      std::string color_by = "") {
  PlanSettings s;
  s.ranks_per_host = per_host;
  s.rank = rank;
  s.color_by = std::move(color_by);
  return s;
}

json PlanJson(const std::vector<int64_t>& shape,
              const std::vector<std::string>& names, int64_t per_host,
              std::optional<int64_t> rank = std::nullopt) {
  absl::StatusOr<MeshLayout> layout = MeshLayout::Create(shape, names);
  EXPECT_TRUE(layout.ok()) << layout.status();
  absl::StatusOr<Plan> plan =
      BuildPlan(*layout, Settings(per_host, rank));
  EXPECT_TRUE(plan.ok()) << plan.status();
  return json::parse(RenderJson(*plan));
}

// Brute force: does some group along `dim` touch two hosts?
TEST(PlanJson, MatchesLayoutForSmallMeshes) {
  const std::vector<std::vector<int64_t>> shapes = {
      {2, 2, 2}, {4, 2, 8}, {3, 5, 2}, {2, 3, 4}, {1, 6, 1}, {8}};
  for (const auto& shape : shapes) {
    const std::vector<std::string> names =
        shape.size() == 3 ? std::vector<std::string>{"PP", "DP", "TP"}
                          : std::vector<std::string>{"TP"};
    absl::StatusOr<MeshLayout> layout = MeshLayout::Create(shape, names);
    ASSERT_TRUE(layout.ok());
    for (int64_t per_host : {1, 3, 4, 8, 100}) {
      SCOPED_TRACE(layout->ToString() + " per_host=" +
                   std::to_string(per_host));
      const json j = PlanJson(shape, names, per_host);
      EXPECT_EQ(j["schema"], "vemesh.plan/1");
      EXPECT_EQ(j["mesh"]["world_size"], layout->size());
      EXPECT_EQ(j["summarized"], false);
      EXPECT_EQ(j["hosts"]["count"],
                (layout->size() + per_host - 1) / per_host);
      // Every rank, its coordinate and host.
      ASSERT_EQ(j["ranks"]["items"].size(), static_cast<size_t>(layout->size()));
      for (const json& r : j["ranks"]["items"]) {
        const int64_t rank = r["rank"];
        const Coordinate c = layout->coordinate_of(rank).value();
        EXPECT_EQ(r["coordinate"], std::vector<int64_t>(c.begin(), c.end()));
        EXPECT_EQ(r["host"], rank / per_host);
        EXPECT_EQ(r["local_rank"], rank % per_host);
      }
      // Every group of every dimension, and the crossing flags.
      ASSERT_EQ(j["dims"].size(), names.size());
      for (const json& d : j["dims"]) {
        const std::string name = d["name"];
        const auto groups = layout->groups({name}).value();
        ASSERT_EQ(d["group_count"], groups.size());
        ASSERT_EQ(d["groups"]["items"].size(), groups.size());
        int64_t crossing = 0;
        for (size_t g = 0; g < groups.size(); ++g) {
          const json& item = d["groups"]["items"][g];
          EXPECT_EQ(item["index"], g);
          EXPECT_EQ(item["complete"], true);
          EXPECT_EQ(item["ranks"], groups[g]);
          bool crosses = false;
          for (int64_t r : groups[g]) {
            crosses = crosses || r / per_host != groups[g][0] / per_host;
          }
          crossing += crosses;
          EXPECT_EQ(item["crosses_hosts"], crosses);
        }
        EXPECT_EQ(d["crossing_groups"], crossing);
        const std::string expected =
            crossing == 0 ? "intra-host"
            : crossing == static_cast<int64_t>(groups.size()) ? "cross-host"
                                                             : "mixed";
        EXPECT_EQ(d["locality"], expected);
      }
      EXPECT_TRUE(j["rank_view"].is_null());
    }
  }
}

TEST(PlanJson, TpCrossingWarnsWithAVerifiedOrder) {
  const json j = PlanJson({2, 4, 2}, {"PP", "TP", "DP"}, 4);
  ASSERT_EQ(j["warnings"].size(), 1u);
  const json& w = j["warnings"][0];
  EXPECT_EQ(w["code"], "tp-crosses-hosts");
  EXPECT_EQ(w["dim"], "TP");
  ASSERT_TRUE(w["suggested_order"].is_array());
  // Rebuild the mesh in the suggested order: TP must stay inside hosts.
  std::vector<std::string> order = w["suggested_order"];
  std::vector<int64_t> shape;
  const std::vector<std::string> names = {"PP", "TP", "DP"};
  const std::vector<int64_t> sizes = {2, 4, 2};
  for (const std::string& n : order) {
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == n) shape.push_back(sizes[i]);
    }
  }
  const json fixed = PlanJson(shape, order, 4);
  EXPECT_TRUE(fixed["warnings"].empty());
  for (const json& d : fixed["dims"]) {
    if (d["name"] == "TP") {
      EXPECT_EQ(d["crossing_groups"], 0);
    }
  }
  EXPECT_EQ(w["suggested_mesh"], "PP=2,DP=2,TP=4");
}

TEST(PlanJson, NoWarningWhenTpStaysInHost) {
  EXPECT_TRUE(PlanJson({2, 2, 2}, {"PP", "DP", "TP"}, 4)["warnings"].empty());
}

TEST(PlanJson, TpLargerThanHostHasNoSuggestion) {
  const json j = PlanJson({2, 16}, {"DP", "TP"}, 8);
  ASSERT_EQ(j["warnings"].size(), 1u);
  EXPECT_TRUE(j["warnings"][0]["suggested_order"].is_null());
  EXPECT_NE(j["warnings"][0]["message"].get<std::string>().find("TP=16"),
            std::string::npos);
}

TEST(PlanJson, RankView) {
  const json v = PlanJson({2, 2, 2}, {"PP", "DP", "TP"}, 4, 5)["rank_view"];
  EXPECT_EQ(v["rank"], 5);
  EXPECT_EQ(v["coordinate"], (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(v["host"], 1);
  EXPECT_EQ(v["dims"][0]["group"]["ranks"], (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(v["dims"][1]["group"]["ranks"], (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(v["dims"][2]["group"]["ranks"], (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(v["dims"][2]["peers"], (std::vector<int64_t>{4}));
  EXPECT_EQ(v["pipeline"]["prev"], 1);
  EXPECT_TRUE(v["pipeline"]["next"].is_null());
  EXPECT_EQ(v["pipeline"]["last_stage"], true);
  const json first = PlanJson({2, 2, 2}, {"PP", "DP", "TP"}, 4, 2)["rank_view"];
  EXPECT_TRUE(first["pipeline"]["prev"].is_null());
  EXPECT_EQ(first["pipeline"]["next"], 6);
}

TEST(PlanJson, MillionRanksAreSummarised) {
  const json j = PlanJson({64, 128, 128}, {"PP", "DP", "TP"}, 8, 1000000);
  EXPECT_EQ(j["summarized"], true);
  EXPECT_EQ(j["ranks"]["total"], 1 << 20);
  EXPECT_EQ(j["ranks"]["listed"], 2 * kSummaryRanks);
  EXPECT_EQ(j["ranks"]["items"].back()["rank"], (1 << 20) - 1);
  for (const json& d : j["dims"]) {
    EXPECT_EQ(d["groups"]["listed"], 2 * kSummaryGroups);
    EXPECT_EQ(d["locality"], "cross-host");
    EXPECT_EQ(d["groups"]["items"][0]["complete"], false);
  }
  EXPECT_EQ(j["dims"][2]["groups"]["items"].back()["index"], 8191);
  EXPECT_EQ(j["rank_view"]["coordinate"],
            (std::vector<int64_t>{61, 4, 64}));
}

TEST(PlanErrors, NameTheBadValue) {
  const MeshLayout layout = MeshLayout::Create({2, 2, 2}).value();
  absl::StatusOr<Plan> p = BuildPlan(layout, Settings(0));
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("got 0"), absl::string_view::npos);
  p = BuildPlan(layout, Settings(8, 8));
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("--rank 8"), absl::string_view::npos);
  p = BuildPlan(layout, Settings(8, {}, "EP"));
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("'EP'"), absl::string_view::npos);
  PlanOptions bad_mesh;
  bad_mesh.mesh = "PP=2,TP";
  p = BuildPlanFromOptions(bad_mesh);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("'PP=2,TP'"), absl::string_view::npos);
  p = BuildPlan(layout, Settings(kMaxRanksPerHost + 1));
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("from 1 to 4096, got 4097"),
            absl::string_view::npos);
}

// A layout with no arithmetic shortcut (here DP and TP flattened in reverse
// order) is scanned rank by rank; above kMaxScannedRanks it is refused at
// once instead of running for minutes. Below, it is planned by the scan.
TEST(PlanErrors, AHugeLayoutThatIsNotAnArangeIsRefused) {
  const MeshLayout root =
      MeshLayout::Create({2, kMaxScannedRanks}, {"DP", "TP"}).value();
  const MeshLayout reversed = root.flatten({"TP", "DP"}, "F").value();
  ASSERT_FALSE(reversed.is_arange());
  absl::StatusOr<Plan> p = BuildPlan(reversed, Settings(8));
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find(absl::StrCat(
                "has ", 2 * kMaxScannedRanks, " ranks")),
            absl::string_view::npos)
      << p.status();
  EXPECT_NE(p.status().message().find(absl::StrCat("at most ",
                                                   kMaxScannedRanks)),
            absl::string_view::npos);
  const MeshLayout small = MeshLayout::Create({2, 64}, {"DP", "TP"})
                               .value()
                               .flatten({"TP", "DP"}, "F")
                               .value();
  p = BuildPlan(small, Settings(8));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->dims[0].locality.crossing_groups, 1);
}

}  // namespace
}  // namespace vemesh::plan
