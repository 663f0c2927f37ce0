// `vemesh plan --check`: a job's placement JSON (built here from a reference
// placement, the way get_placement() reports it) against plans of every
// policy: agreement exactly when the ranks share hosts as planned, messages
// that name the ranks, the dimensions and the job's real placement, and
// malformed files refused with the field named.

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/plan/placement_check.h"
#include "tools/plan/plan.h"
#include "tools/plan/plan_command.h"
#include "vemesh/layout/mesh_layout.h"

namespace vemesh::plan {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

// Reference placements, rank by rank (see plan_placement_test.cc).
std::vector<int64_t> PlaceBlock(int64_t per_host, int64_t world) {
  std::vector<int64_t> host;
  for (int64_t r = 0; r < world; ++r) host.push_back(r / per_host);
  return host;
}
std::vector<int64_t> PlaceCyclic(int64_t hosts, int64_t world) {
  std::vector<int64_t> host;
  for (int64_t r = 0; r < world; ++r) host.push_back(r % hosts);
  return host;
}

// The JSON get_placement() writes for `layout` with rank r on host
// host_of[r]: hosts in order of their lowest rank, crossing groups counted
// over every group.
Json JobJson(const MeshLayout& layout, const std::vector<int64_t>& host_of,
             const std::string& prefix = "node") {
  Json j;
  j["vemesh_placement"] = 1;
  j["world_size"] = layout.size();
  j["mesh"]["dim_names"] = layout.dim_names();
  j["mesh"]["shape"] = layout.shape();
  std::map<int64_t, int64_t> index;
  std::vector<std::string> names;
  std::vector<int64_t> rank_hosts;
  for (int64_t h : host_of) {
    auto [it, added] = index.emplace(h, static_cast<int64_t>(names.size()));
    if (added) names.push_back(absl::StrCat(prefix, names.size()));
    rank_hosts.push_back(it->second);
  }
  j["hosts"] = names;
  j["rank_hosts"] = rank_hosts;
  Json dims = Json::array();
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    const auto groups = layout.groups({layout.dim_name(d)}).value();
    int64_t crossing = 0;
    for (const auto& g : groups) {
      bool crosses = false;
      for (int64_t r : g) crosses |= host_of[r] != host_of[g[0]];
      crossing += crosses;
    }
    Json dj;
    dj["name"] = layout.dim_name(d);
    dj["group_count"] = groups.size();
    dj["group_size"] = layout.shape()[d];
    dj["crossing_groups"] = crossing;
    dims.push_back(dj);
  }
  j["dims"] = dims;
  return j;
}

Placement Parse(const Json& j) {
  absl::StatusOr<Placement> p = Placement::FromJson(j.dump(), "job.json");
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

Plan MakePlan(const MeshLayout& layout, PlanSettings s) {
  absl::StatusOr<Plan> p = BuildPlan(layout, s);
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

PlanSettings Block(int64_t per_host) {
  PlanSettings s;
  s.ranks_per_host = per_host;
  return s;
}
PlanSettings Cyclic(int64_t hosts) {
  PlanSettings s;
  s.placement = PlacementPolicy::kCyclic;
  s.hosts = hosts;
  return s;
}

// Whether two placements put the same ranks together (names aside).
bool SamePartition(const std::vector<int64_t>& a,
                   const std::vector<int64_t>& b) {
  std::map<int64_t, int64_t> ab, ba;
  for (size_t r = 0; r < a.size(); ++r) {
    if (ab.emplace(a[r], b[r]).first->second != b[r]) return false;
    if (ba.emplace(b[r], a[r]).first->second != a[r]) return false;
  }
  return true;
}

TEST(PlacementCheck, AJobPlacedAsPlannedMatchesUnderEveryPolicy) {
  const std::vector<std::vector<int64_t>> shapes = {
      {2, 2, 2}, {4, 2, 8}, {3, 5, 2}, {2, 3, 4}, {1, 6, 1}, {8}, {2, 12}};
  for (const auto& shape : shapes) {
    const MeshLayout layout = MeshLayout::Create(shape).value();
    const int64_t world = layout.size();
    for (int64_t h = 1; h <= std::min<int64_t>(world, 9); ++h) {
      SCOPED_TRACE(absl::StrCat(layout.ToString(), " h ", h));
      const Plan block = MakePlan(layout, Block(h));
      const PlacementCheck b =
          CheckPlacement(block, Parse(JobJson(layout, PlaceBlock(h, world))))
              .value();
      EXPECT_TRUE(b.matches) << ::testing::PrintToString(b.differences);
      const Plan cyclic = MakePlan(layout, Cyclic(h));
      const PlacementCheck c =
          CheckPlacement(cyclic,
                         Parse(JobJson(layout, PlaceCyclic(h, world), "gpu-")))
              .value();
      EXPECT_TRUE(c.matches) << ::testing::PrintToString(c.differences);
    }
  }
}

// A block plan against a cyclic job (and the reverse) agrees exactly when
// the two put the same ranks together.
TEST(PlacementCheck, BlockPlanAgainstCyclicJobDiffersExactlyWhenHostsDiffer) {
  const std::vector<std::vector<int64_t>> shapes = {
      {2, 2, 2}, {4, 2, 2}, {3, 4}, {6}, {2, 3, 2}};
  for (const auto& shape : shapes) {
    const MeshLayout layout = MeshLayout::Create(shape).value();
    const int64_t world = layout.size();
    for (int64_t hosts = 1; hosts <= world; ++hosts) {
      if ((world + hosts - 1) / hosts * (hosts - 1) >= world) continue;
      const int64_t per_host = (world + hosts - 1) / hosts;
      SCOPED_TRACE(absl::StrCat(layout.ToString(), " hosts ", hosts));
      const std::vector<int64_t> cyclic = PlaceCyclic(hosts, world);
      const std::vector<int64_t> block = PlaceBlock(per_host, world);
      const bool same = SamePartition(block, cyclic);
      const PlacementCheck c = CheckPlacement(MakePlan(layout, Block(per_host)),
                                              Parse(JobJson(layout, cyclic)))
                                   .value();
      EXPECT_EQ(c.matches, same);
      if (!same) {
        EXPECT_THAT(c.hint, HasSubstr("the job's placement is cyclic"));
      }
      const PlacementCheck r = CheckPlacement(MakePlan(layout, Cyclic(hosts)),
                                              Parse(JobJson(layout, block)))
                                   .value();
      EXPECT_EQ(r.matches, same);
      if (!same) {
        EXPECT_THAT(r.hint, HasSubstr("the job's placement is block"));
      }
    }
  }
}

TEST(PlacementCheck, CyclicJobAgainstBlockPlanSaysWhatAndHow) {
  const MeshLayout layout =
      MeshLayout::Create({2, 2, 2}, {"PP", "DP", "TP"}).value();
  const Plan plan = MakePlan(layout, Block(4));
  const PlacementCheck c =
      CheckPlacement(plan, Parse(JobJson(layout, PlaceCyclic(2, 8)))).value();
  EXPECT_FALSE(c.matches);
  EXPECT_THAT(c.differences, Contains("TP: plan 0 crossing groups, job 4"));
  EXPECT_THAT(c.differences, Contains("PP: plan 4 crossing groups, job 0"));
  EXPECT_THAT(
      c.differences,
      Contains("rank 1: the plan puts it on host 0 with ranks "
               "0,1,2,3; the job ran it on 'node1' with ranks 1,3,5,7"));
  EXPECT_THAT(c.differences,
              Contains(HasSubstr("... and 5 more ranks whose host holds other "
                                 "ranks than planned (8 of 8 in all)")));
  EXPECT_THAT(
      c.hint,
      AllOf(HasSubstr("the job's placement is cyclic over 2 hosts"),
            HasSubstr("--distribution=block"), HasSubstr("--map-by slot"),
            HasSubstr("--placement cyclic --hosts 2")));
  const std::string text =
      RenderCheck(plan, Parse(JobJson(layout, PlaceCyclic(2, 8))), c);
  EXPECT_THAT(text, HasSubstr("plan and job placement differ"));
  const nlohmann::json j = nlohmann::json::parse(RenderCheckJson(c));
  EXPECT_EQ(j["matches"], false);
  EXPECT_EQ(j["hint"], c.hint);
}

TEST(PlacementCheck, MatchingTextAndHostNamesThatDiffer) {
  const MeshLayout layout =
      MeshLayout::Create({2, 2, 2}, {"PP", "DP", "TP"}).value();
  const Plan plan = MakePlan(layout, Block(4));
  Json job = JobJson(layout, PlaceBlock(4, 8), "a100-");
  // Hosts listed in another order than their lowest rank: same partition.
  job["hosts"] = {"second", "first"};
  job["rank_hosts"] = {1, 1, 1, 1, 0, 0, 0, 0};
  const Placement p = Parse(job);
  const PlacementCheck c = CheckPlacement(plan, p).value();
  EXPECT_TRUE(c.matches);
  EXPECT_EQ(RenderCheck(plan, p, c),
            "plan matches the job's placement: 8 ranks on 2 hosts, mesh "
            "PP=2,DP=2,TP=2, crossing groups PP 4, DP 0, TP 0\n");
}

TEST(PlacementCheck, UnevenJobAgainstHostfilePlan) {
  const MeshLayout layout = MeshLayout::Create({3, 2}, {"DP", "TP"}).value();
  PlanSettings s;
  s.placement = PlacementPolicy::kHostfile;
  s.hostfile = ParseHostfile("n0 slots=2\nn1 slots=4\n", "hf").value();
  const Plan plan = MakePlan(layout, s);
  const std::vector<int64_t> uneven = {0, 0, 1, 1, 1, 1};
  EXPECT_TRUE(
      CheckPlacement(plan, Parse(JobJson(layout, uneven))).value().matches);
  // The same job against a block plan of 3 per host: names the uneven sizes.
  const PlacementCheck c =
      CheckPlacement(MakePlan(layout, Block(3)), Parse(JobJson(layout, uneven)))
          .value();
  EXPECT_FALSE(c.matches);
  EXPECT_THAT(c.hint, HasSubstr("block over hosts of uneven sizes (2,4)"));
  EXPECT_THAT(c.differences,
              Contains("rank 0: the plan puts it on host 0 with ranks 0,1,2; "
                       "the job ran it on 'node0' with ranks 0,1"));
  // And a block job against the hostfile plan names the plan's host.
  const PlacementCheck d =
      CheckPlacement(plan, Parse(JobJson(layout, PlaceBlock(3, 6)))).value();
  EXPECT_THAT(d.differences,
              Contains(HasSubstr("the plan puts it on 'n0' (host 0)")));
}

TEST(PlacementCheck, MeshAndWorldDifferences) {
  const MeshLayout plan_layout =
      MeshLayout::Create({2, 2, 2}, {"PP", "DP", "TP"}).value();
  const Plan plan = MakePlan(plan_layout, Block(4));
  const MeshLayout reordered =
      MeshLayout::Create({2, 2, 2}, {"PP", "TP", "DP"}).value();
  const PlacementCheck m =
      CheckPlacement(plan, Parse(JobJson(reordered, PlaceBlock(4, 8)))).value();
  EXPECT_FALSE(m.matches);
  EXPECT_THAT(m.differences,
              Contains("mesh: plan PP=2,DP=2,TP=2, job PP=2,TP=2,DP=2"));
  const MeshLayout bigger = MeshLayout::Create({4, 4}, {"DP", "TP"}).value();
  const PlacementCheck w =
      CheckPlacement(plan, Parse(JobJson(bigger, PlaceBlock(4, 16)))).value();
  EXPECT_FALSE(w.matches);
  EXPECT_THAT(w.differences, Contains("world size: plan 8 ranks, job 16"));
  // A job whose mesh covers part of its world: parsed, and told apart.
  Json part = JobJson(plan_layout, PlaceBlock(4, 8));
  part["world_size"] = 12;
  part["rank_hosts"] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2};
  part["hosts"] = {"a", "b", "c"};
  const PlacementCheck p = CheckPlacement(plan, Parse(part)).value();
  EXPECT_FALSE(p.matches);
  EXPECT_THAT(p.differences,
              Contains("world size: plan 8 ranks, job 12 (its mesh covers 8 "
                       "of them)"));
  const PlacementCheck h =
      CheckPlacement(plan, Parse(JobJson(plan_layout, PlaceBlock(2, 8))))
          .value();
  EXPECT_THAT(h.differences, Contains("hosts: plan 2, job 4"));
}

TEST(PlacementCheck, APlanTooBigToCompareIsRefused) {
  const MeshLayout layout =
      MeshLayout::Create({int64_t{1} << 23}, {"DP"}).value();
  const MeshLayout small = MeshLayout::Create({2}, {"DP"}).value();
  absl::StatusOr<PlacementCheck> c = CheckPlacement(
      MakePlan(layout, Block(8)), Parse(JobJson(small, PlaceBlock(1, 2))));
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("at most 4194304 ranks"));
}

// The whole command: exit 0 on agreement, 3 on differences, 2 on a bad file.
TEST(PlacementCheck, CommandExitCodes) {
  const MeshLayout layout =
      MeshLayout::Create({2, 2, 2}, {"PP", "DP", "TP"}).value();
  const std::string dir = ::testing::TempDir();
  const std::string cyclic = dir + "/vemesh_check_cyclic.json";
  const std::string bad = dir + "/vemesh_check_bad.json";
  std::ofstream(cyclic) << JobJson(layout, PlaceCyclic(2, 8)).dump();
  std::ofstream(bad) << "{\"vemesh_placement\": 1}";
  auto run = [](std::vector<std::string> args, std::string* out_text) {
    std::ostringstream out, err;
    const int code = RunPlanCommand(args, out, err);
    *out_text = out.str() + err.str();
    return code;
  };
  std::string text;
  EXPECT_EQ(run({"--mesh", "PP=2,DP=2,TP=2", "--ranks-per-host", "4", "--check",
                 cyclic},
                &text),
            kExitMismatch);
  EXPECT_THAT(text, AllOf(HasSubstr("TP: plan 0 crossing groups, job 4"),
                          HasSubstr("srun -N 2 -n 8 --ntasks-per-node=4 "
                                    "--distribution=block")));
  EXPECT_EQ(run({"--mesh", "PP=2,DP=2,TP=2", "--placement", "cyclic", "--hosts",
                 "2", "--check", cyclic},
                &text),
            kExitOk);
  EXPECT_THAT(text, HasSubstr("plan matches the job's placement"));
  EXPECT_EQ(run({"--mesh", "PP=2,DP=2,TP=2", "--placement=cyclic", "--check",
                 cyclic, "--format", "json"},
                &text),
            kExitMismatch);  // 8 per host by default: one host, not two
  EXPECT_EQ(nlohmann::json::parse(text)["matches"], false);
  EXPECT_EQ(run({"--mesh", "PP=2,DP=2,TP=2", "--check", bad}, &text),
            kExitUsage);
  EXPECT_THAT(text, HasSubstr("field 'world_size' is missing"));
  EXPECT_EQ(
      run({"--mesh", "PP=2,DP=2,TP=2", "--check", dir + "/nope.json"}, &text),
      kExitUsage);
  EXPECT_THAT(text, HasSubstr("cannot open placement file"));
  EXPECT_EQ(
      run({"--mesh", "PP=2,DP=2,TP=2", "--check", cyclic, "--format", "svg"},
          &text),
      kExitUsage);
  std::remove(cyclic.c_str());
  std::remove(bad.c_str());
}

}  // namespace
}  // namespace vemesh::plan
