// The JSON of `vemesh plan`, parsed back and checked against MeshLayout: every
// rank's coordinate and host, every group of every dimension, the host
// crossing flags, and the TP warning with a suggestion that really fixes it.

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tools/plan/plan.h"
#include "tools/plan/render_json.h"
#include "tools/plan/render_table.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/placement/host_locality.h"

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
  absl::StatusOr<Plan> plan = BuildPlan(*layout, Settings(per_host, rank));
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
      SCOPED_TRACE(layout->ToString() +
                   " per_host=" + std::to_string(per_host));
      const json j = PlanJson(shape, names, per_host);
      EXPECT_EQ(j["schema"], "vemesh.plan/1");
      EXPECT_EQ(j["mesh"]["world_size"], layout->size());
      EXPECT_EQ(j["summarized"], false);
      EXPECT_EQ(j["hosts"]["count"],
                (layout->size() + per_host - 1) / per_host);
      // Every rank, its coordinate and host.
      ASSERT_EQ(j["ranks"]["items"].size(),
                static_cast<size_t>(layout->size()));
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
            crossing == 0                                     ? "intra-host"
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
  EXPECT_EQ(j["rank_view"]["coordinate"], (std::vector<int64_t>{61, 4, 64}));
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
  EXPECT_NE(p.status().message().find(
                absl::StrCat("has ", 2 * kMaxScannedRanks, " ranks")),
            absl::string_view::npos)
      << p.status();
  EXPECT_NE(
      p.status().message().find(absl::StrCat("at most ", kMaxScannedRanks)),
      absl::string_view::npos);
  const MeshLayout small = MeshLayout::Create({2, 64}, {"DP", "TP"})
                               .value()
                               .flatten({"TP", "DP"}, "F")
                               .value();
  p = BuildPlan(small, Settings(8));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->dims[0].locality.crossing_groups, 1);
}

// Every rank's host and local rank in the JSON follow the placement: rank
// r of a cyclic plan over H hosts is on host r % H, slot r / H; a hostfile's
// ranks fill its hosts in order.
TEST(PlanPlacement, RankHostsFollowThePlacement) {
  const MeshLayout layout =
      MeshLayout::Create({2, 3, 2}, {"PP", "DP", "TP"}).value();
  for (int64_t hosts = 1; hosts <= 12; ++hosts) {
    PlanSettings s;
    s.placement = PlacementPolicy::kCyclic;
    s.hosts = hosts;
    const json j = json::parse(RenderJson(BuildPlan(layout, s).value()));
    EXPECT_EQ(j["hosts"]["count"], hosts);
    EXPECT_EQ(j["placement"]["policy"], "cyclic");
    for (const json& r : j["ranks"]["items"]) {
      EXPECT_EQ(r["host"], r["rank"].get<int64_t>() % hosts);
      EXPECT_EQ(r["local_rank"], r["rank"].get<int64_t>() / hosts);
      EXPECT_TRUE(r["host_name"].is_null());
    }
    // Group host lists: every member's host, rank % H.
    for (const json& d : j["dims"]) {
      int64_t crossing = 0;
      for (const json& g : d["groups"]["items"]) {
        std::vector<int64_t> seen;
        for (int64_t r : g["ranks"]) seen.push_back(r % hosts);
        std::sort(seen.begin(), seen.end());
        seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
        EXPECT_EQ(g["hosts"], seen);
        crossing += seen.size() > 1;
      }
      EXPECT_EQ(d["crossing_groups"], crossing);
    }
  }
  PlanSettings s;
  s.placement = PlacementPolicy::kHostfile;
  s.hostfile =
      ParseHostfile("big slots=7\nsmall slots=3\nspare slots=9\n", "hosts.txt")
          .value();
  const json j = json::parse(RenderJson(BuildPlan(layout, s).value()));
  EXPECT_EQ(j["placement"]["hostfile"], "hosts.txt");
  EXPECT_EQ(j["placement"]["host_names"],
            (std::vector<std::string>{"big", "small", "spare"}));
  EXPECT_EQ(j["placement"]["host_sizes"], (std::vector<int64_t>{7, 3, 2}));
  for (const json& r : j["ranks"]["items"]) {
    const int64_t rank = r["rank"];
    EXPECT_EQ(r["host"], rank < 7 ? 0 : rank < 10 ? 1 : 2);
    EXPECT_EQ(r["local_rank"], rank < 7    ? rank
                               : rank < 10 ? rank - 7
                                           : rank - 10);
    EXPECT_EQ(r["host_name"], rank < 7 ? "big" : rank < 10 ? "small" : "spare");
  }
}

TEST(PlanPlacement, RankViewFollowsThePlacement) {
  const MeshLayout layout =
      MeshLayout::Create({2, 2, 2}, {"PP", "DP", "TP"}).value();
  PlanSettings s;
  s.placement = PlacementPolicy::kCyclic;
  s.hosts = 2;
  s.rank = 5;
  const Plan plan = BuildPlan(layout, s).value();
  EXPECT_EQ(plan.rank_view->host, 1);
  EXPECT_EQ(plan.rank_view->local, 2);
  // TP group of rank 5 is {4, 5}: hosts 0 and 1.
  EXPECT_EQ(plan.rank_view->dims[2].group.hosts, (std::vector<int64_t>{0, 1}));
}

TEST(PlanPlacement, LaunchFlagsStateThePlacement) {
  const MeshLayout layout =
      MeshLayout::Create({2, 2, 2}, {"PP", "DP", "TP"}).value();
  const json block = PlanJson({2, 2, 2}, {"PP", "DP", "TP"}, 4);
  EXPECT_EQ(block["placement"]["policy"], "block");
  const json& launch = block["placement"]["launch"];
  ASSERT_EQ(launch.size(), 3u);
  EXPECT_EQ(launch[0]["command"], "mpirun -n 8 --map-by slot --hostfile HOSTS");
  EXPECT_EQ(launch[1]["command"],
            "srun -N 2 -n 8 --ntasks-per-node=4 --distribution=block");
  EXPECT_EQ(launch[2]["command"], "torchrun --nnodes=2 --nproc_per_node=4");

  PlanSettings c;
  c.placement = PlacementPolicy::kCyclic;
  c.hosts = 2;
  const Plan cyclic = BuildPlan(layout, c).value();
  EXPECT_EQ(cyclic.launch[0].command,
            "mpirun -n 8 --map-by node --hostfile HOSTS");
  EXPECT_EQ(cyclic.launch[1].command, "srun -N 2 -n 8 --distribution=cyclic");
  EXPECT_TRUE(cyclic.launch[2].command.empty());
  EXPECT_NE(cyclic.launch[2].note.find("no cyclic"), std::string::npos);
  const std::string table = RenderTable(cyclic);
  EXPECT_NE(table.find("placement: cyclic over 2 hosts (host = rank % 2"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("  srun -N 2 -n 8 --distribution=cyclic\n"),
            std::string::npos);

  PlanSettings h;
  h.placement = PlacementPolicy::kHostfile;
  h.hostfile = ParseHostfile("a slots=6\nb slots=2\n", "my hosts").value();
  const Plan slots = BuildPlan(layout, h).value();
  // The path is quoted for the shell.
  EXPECT_EQ(slots.launch[0].command,
            "mpirun -n 8 --hostfile 'my hosts' --map-by slot");
  EXPECT_NE(RenderTable(slots).find("mpirun -n 8 --hostfile 'my hosts' "
                                    "--map-by slot"),
            std::string::npos);
  EXPECT_TRUE(slots.launch[2].command.empty());  // uneven: no torchrun
  h.hostfile =
      ParseHostfile("a slots=4\nb slots=4\nc slots=4\n", "/etc/hosts.d/gpu")
          .value();
  const Plan even = BuildPlan(layout, h).value();
  EXPECT_EQ(even.launch[0].command,
            "mpirun -n 8 --hostfile /etc/hosts.d/gpu --map-by slot");
  EXPECT_EQ(even.launch[2].command, "torchrun --nnodes=2 --nproc_per_node=4");
  h.hostfile = ParseHostfile("a slots=8\n", "it's").value();
  EXPECT_EQ(BuildPlan(layout, h).value().launch[0].command,
            "mpirun -n 8 --hostfile 'it'\\''s' --map-by slot");
  // A world that does not fill hosts evenly has no torchrun line.
  const json uneven = PlanJson({10}, {"DP"}, 4);
  EXPECT_TRUE(uneven["placement"]["launch"][2]["command"].is_null());
  EXPECT_EQ(uneven["placement"]["launch"][1]["command"],
            "srun -N 3 -n 10 --ntasks-per-node=4 --distribution=block");
}

// Warnings by role: every listed dimension that crosses hosts, with an order
// or placement that keeps it inside, each proven by rebuilding the plan.
TEST(PlanPlacement, LatencySensitiveDimensionsWarnWithAProvenFix) {
  const MeshLayout layout =
      MeshLayout::Create({2, 4, 2, 2}, {"PP", "EP", "TP", "CP"}).value();
  int orders = 0, placements = 0;
  for (int64_t per_host : {2, 4, 8}) {
    for (PlacementPolicy policy :
         {PlacementPolicy::kBlock, PlacementPolicy::kCyclic}) {
      PlanSettings s;
      s.placement = policy;
      if (policy == PlacementPolicy::kBlock) {
        s.ranks_per_host = per_host;
      } else {
        s.hosts = 32 / per_host;
      }
      s.latency_sensitive = std::vector<std::string>{"CP", "EP", "TP"};
      const Plan plan = BuildPlan(layout, s).value();
      SCOPED_TRACE(plan.hosts.Describe());
      std::vector<std::string> warned;
      for (const PlanWarning& w : plan.warnings) {
        warned.push_back(w.dim);
        const int64_t d = layout.dim_index(w.dim).value();
        EXPECT_GT(plan.dims[d].locality.crossing_groups, 0);
        EXPECT_EQ(w.code, absl::AsciiStrToLower(w.dim) + "-crosses-hosts");
        if (w.suggestion.found) {
          ++orders;
          std::vector<int64_t> shape;
          for (const std::string& n : w.suggestion.order) {
            shape.push_back(layout.dim_size(n).value());
          }
          const MeshLayout fixed =
              MeshLayout::Create(shape, w.suggestion.order).value();
          const Plan again = BuildPlan(fixed, s).value();
          EXPECT_EQ(again.dims[fixed.dim_index(w.dim).value()]
                        .locality.crossing_groups,
                    0)
              << w.message;
        }
        if (w.placement_fix.has_value()) {
          ++placements;
          PlanSettings other;
          other.placement = *w.placement_fix;
          other.hosts = plan.hosts.host_count();
          const Plan again = BuildPlan(layout, other).value();
          EXPECT_EQ(again.dims[d].locality.crossing_groups, 0) << w.message;
          EXPECT_NE(w.message.find(*w.placement_fix == PlacementPolicy::kBlock
                                       ? "--distribution=block"
                                       : "--distribution=cyclic"),
                    std::string::npos);
        }
      }
      // Exactly the listed dimensions that cross, in mesh order.
      std::vector<std::string> crossing;
      for (const DimPlan& d : plan.dims) {
        if (d.name != "PP" && d.locality.crossing_groups > 0) {
          crossing.push_back(d.name);
        }
      }
      EXPECT_EQ(warned, crossing);
    }
  }
  // The cases above exercise both kinds of fix.
  EXPECT_GT(orders, 0);
  EXPECT_GT(placements, 0);
}

TEST(PlanPlacement, RoleListDefaultsAndTurnsOff) {
  // EP crosses on hosts of 2, but only TP is latency-sensitive by default.
  const MeshLayout layout = MeshLayout::Create({4, 2}, {"EP", "TP"}).value();
  PlanSettings s;
  s.ranks_per_host = 2;
  EXPECT_TRUE(BuildPlan(layout, s).value().warnings.empty());
  s.latency_sensitive = std::vector<std::string>{"EP"};
  const Plan ep = BuildPlan(layout, s).value();
  ASSERT_EQ(ep.warnings.size(), 1u);
  EXPECT_EQ(ep.warnings[0].code, "ep-crosses-hosts");
  EXPECT_NE(ep.warnings[0].message.find("EP is latency-sensitive"),
            std::string::npos);
  s.latency_sensitive = std::vector<std::string>{};
  s.ranks_per_host = 1;
  EXPECT_TRUE(BuildPlan(layout, s).value().warnings.empty());
  // Roles match dimension names ignoring case, as the runtime's do.
  s.ranks_per_host = 2;
  s.latency_sensitive = std::vector<std::string>{"ep"};
  ASSERT_EQ(BuildPlan(layout, s).value().warnings.size(), 1u);
  const MeshLayout lower = MeshLayout::Create({2, 4}, {"dp", "tp"}).value();
  PlanSettings t;
  t.ranks_per_host = 2;  // tp=4 crosses hosts of 2: the default role warns
  const Plan tp = BuildPlan(lower, t).value();
  ASSERT_EQ(tp.warnings.size(), 1u);
  EXPECT_EQ(tp.warnings[0].code, "tp-crosses-hosts");
  // The default on a mesh without TP warns about nothing and is no error.
  const MeshLayout no_tp = MeshLayout::Create({4, 2}, {"DP", "PP"}).value();
  PlanSettings d;
  d.ranks_per_host = 1;
  EXPECT_TRUE(BuildPlan(no_tp, d).value().warnings.empty());
}

TEST(PlanPlacement, CyclicTpWarningNamesBlockPlacement) {
  const MeshLayout layout =
      MeshLayout::Create({2, 2, 2}, {"PP", "DP", "TP"}).value();
  PlanSettings s;
  s.placement = PlacementPolicy::kCyclic;
  s.hosts = 2;
  const json j = json::parse(RenderJson(BuildPlan(layout, s).value()));
  ASSERT_EQ(j["warnings"].size(), 1u);
  EXPECT_EQ(j["warnings"][0]["code"], "tp-crosses-hosts");
  EXPECT_EQ(j["warnings"][0]["suggested_placement"], "block");
  EXPECT_NE(j["warnings"][0]["message"].get<std::string>().find(
                "Or launch with block placement (`srun --distribution=block`"),
            std::string::npos);
}

}  // namespace
}  // namespace vemesh::plan
