// Placement::FromJson (vemesh/placement/placement_json.cc): it reads back
// what ToJson writes, and refuses a malformed file naming the field. (These
// were `vemesh plan --check`'s tests, tests/tools/plan_check_test.cc, when
// the reader lived in tools/plan.)
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/placement/placement.h"

namespace vemesh {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

TEST(PlacementJson, ReadsBackWhatToJsonWrites) {
  const MeshLayout layout = MeshLayout::Create({2, 2, 2}, {"PP", "DP", "TP"},
                                               {7, 6, 5, 4, 3, 2, 1, 0})
                                .value();
  // A world larger than the mesh, hosts dealt cyclically, a name to escape.
  const std::vector<std::string> hosts = {"a\"b", "c", "a\"b", "c", "a\"b", "c",
                                          "a\"b", "c", "a\"b", "c"};
  const Placement p = ComputePlacement(layout, hosts).value();
  const Placement back = Placement::FromJson(p.ToJson(), "p.json").value();
  EXPECT_EQ(back.world_size, 10);
  EXPECT_EQ(back.dim_names, p.dim_names);
  EXPECT_EQ(back.shape, p.shape);
  EXPECT_EQ(back.hosts, p.hosts);
  EXPECT_EQ(back.rank_hosts, p.rank_hosts);
  ASSERT_EQ(back.dims.size(), p.dims.size());
  for (size_t d = 0; d < p.dims.size(); ++d) {
    EXPECT_EQ(back.dims[d].name, p.dims[d].name);
    EXPECT_EQ(back.dims[d].group_count, p.dims[d].group_count);
    EXPECT_EQ(back.dims[d].group_size, p.dims[d].group_size);
    EXPECT_EQ(back.dims[d].crossing_groups, p.dims[d].crossing_groups);
  }
  EXPECT_EQ(back.ToJson(), p.ToJson());
}

// Each malformed file: the field its message must name.
TEST(PlacementJson, MalformedFilesNameTheField) {
  const MeshLayout layout = MeshLayout::Create({2, 2}, {"DP", "TP"}).value();
  // Ranks 0, 1 on node0, ranks 2, 3 on node1.
  const Json good =
      Json::parse(ComputePlacement(layout, {"node0", "node0", "node1", "node1"})
                      .value()
                      .ToJson());
  struct Bad {
    std::string what;
    Json j;
    std::string field;
  };
  std::vector<Bad> bad;
  auto with = [&](std::string what, auto mutate, std::string field) {
    Json j = good;
    mutate(j);
    bad.push_back({std::move(what), std::move(j), std::move(field)});
  };
  with(
      "version", [](Json& j) { j["vemesh_placement"] = 2; },
      "'vemesh_placement'");
  with(
      "no version", [](Json& j) { j.erase("vemesh_placement"); },
      "'vemesh_placement' is missing");
  with(
      "world string", [](Json& j) { j["world_size"] = "4"; }, "'world_size'");
  with(
      "world 0", [](Json& j) { j["world_size"] = 0; }, "'world_size'");
  with(
      "world huge", [](Json& j) { j["world_size"] = int64_t{1} << 40; },
      "'world_size': expected an integer from 1 to 4194304");
  with(
      "world float", [](Json& j) { j["world_size"] = 4.0; }, "'world_size'");
  with(
      "mesh", [](Json& j) { j["mesh"] = 3; }, "'mesh'");
  with(
      "names",
      [](Json& j) {
        j["mesh"]["dim_names"] = {"DP", 7};
      },
      "'mesh.dim_names[1]'");
  with(
      "shape 0",
      [](Json& j) {
        j["mesh"]["shape"] = {0, 4};
      },
      "'mesh.shape[0]'");
  with(
      "shape product",
      [](Json& j) {
        j["mesh"]["shape"] = {2, 3};
      },
      "'mesh.shape': expected sizes whose product is at most world_size 4, "
      "got [2,3]");
  with(
      "shape size",
      [](Json& j) {
        j["mesh"]["shape"] = {2, 5};
      },
      "'mesh.shape[1]': expected an integer from 1 to 4");
  with(
      "shape count", [](Json& j) { j["mesh"]["shape"] = {4}; },
      "'mesh.shape': expected one size per name");
  with(
      "hosts empty", [](Json& j) { j["hosts"] = Json::array(); }, "'hosts'");
  with(
      "host name", [](Json& j) { j["hosts"][0] = ""; }, "'hosts[0]'");
  with(
      "rank_hosts short",
      [](Json& j) {
        j["rank_hosts"] = {0, 0, 1};
      },
      "'rank_hosts': expected an array of world_size (4)");
  with(
      "rank_hosts index", [](Json& j) { j["rank_hosts"][3] = 2; },
      "'rank_hosts[3] (an index into hosts)': expected an integer from 0 to 1, "
      "got 2");
  with(
      "rank_hosts negative", [](Json& j) { j["rank_hosts"][0] = -1; },
      "'rank_hosts[0]");
  with(
      "dims count", [](Json& j) { j["dims"].erase(1); }, "'dims'");
  with(
      "dim name", [](Json& j) { j["dims"][1]["name"] = "EP"; },
      "'dims[1].name': expected 'TP'");
  with(
      "crossing missing",
      [](Json& j) { j["dims"][0].erase("crossing_groups"); },
      "'dims[0].crossing_groups' is missing");
  with(
      "crossing > groups", [](Json& j) { j["dims"][0]["crossing_groups"] = 3; },
      "'dims[0].crossing_groups': expected at most group_count (2)");
  with(
      "group count", [](Json& j) { j["dims"][1]["group_count"] = "2"; },
      "'dims[1].group_count'");
  with(
      "top array", [](Json& j) { j = Json::array(); }, "'(top level)'");
  for (const Bad& b : bad) {
    absl::StatusOr<Placement> p = Placement::FromJson(b.j.dump(), "job.json");
    ASSERT_FALSE(p.ok()) << b.what;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(
        std::string(p.status().message()),
        AllOf(HasSubstr("placement file 'job.json'"), HasSubstr(b.field)))
        << b.what;
  }
}

TEST(PlacementJson, NotJsonTooDeepOrTooBigIsRefused) {
  for (const std::string& text :
       {std::string(""), std::string("{\"vemesh_"), std::string("[1, 2")}) {
    absl::StatusOr<Placement> p = Placement::FromJson(text, "x.json");
    ASSERT_FALSE(p.ok());
    EXPECT_THAT(std::string(p.status().message()),
                HasSubstr("placement file 'x.json' is not JSON"));
  }
  const std::string deep(100000, '[');
  absl::StatusOr<Placement> d = Placement::FromJson(deep, "deep.json");
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()),
              HasSubstr("nests 100000 levels"));
  const std::string big(static_cast<size_t>(kMaxPlacementJsonBytes + 1), ' ');
  absl::StatusOr<Placement> b = Placement::FromJson(big, "big.json");
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("expected at most"));
}

}  // namespace
}  // namespace vemesh
