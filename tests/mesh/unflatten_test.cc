// DeviceMesh::unflatten on 4 and 8 ranks, restating PyTorch's _unflatten
// cases: a dimension split into several named ones, with one split per new
// dimension (counted), the other dimensions' communicators reused, the old
// name kept as the flattening of its parts, flattenings carried over, from
// the root and from a child. Expected groups are row-major arithmetic done
// here (Grid), checked against ranks() and real traffic.
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hand_grid.h"
#include "vemesh/mesh/device_mesh.h"

namespace vemesh {
namespace {

using testing_grid::ExpectGroup;
using testing_grid::Grid;
using testing_grid::WorldRank;
using testing_grid::WorldSize;

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// PyTorch: test_unflatten_mesh_2d — a 1-D world split into (dp, tp).
TEST(Unflatten, OneDimensionIntoTwo) {
  const int world = WorldSize();
  const int64_t me = WorldRank();
  auto mesh = init_device_mesh("cpu", {world}, {"w"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  const int64_t live = LiveCommunicatorCount();
  auto two = mesh->unflatten("w", {2, world / 2}, {"dp", "tp"});
  ASSERT_TRUE(two.ok()) << two.status();
  // One split per new dimension: two communicators, no more.
  EXPECT_EQ(LiveCommunicatorCount(), live + 2);
  const Grid g{{2, world / 2}};
  EXPECT_THAT(two->mesh_dim_names(), ElementsAre("dp", "tp"));
  EXPECT_THAT(two->shape(), ElementsAre(2, world / 2));
  EXPECT_EQ(two->mesh(), mesh->mesh());
  ExpectGroup(*two->get_group("dp"), g.group(me, {0}));
  ExpectGroup(*two->get_group("tp"), g.group(me, {1}));
  EXPECT_EQ(*two->get_local_rank("dp"), g.coord(me)[0]);
  // The old name is the flattening of its parts, with its communicator.
  EXPECT_EQ(*two->get_group("w"), *mesh->get_group("w"));
  EXPECT_EQ((*two)["w"]->mesh(), mesh->mesh());
  // A new root: not the mesh it came from.
  EXPECT_NE(two->root_mesh(), *mesh);
  EXPECT_EQ(two->root_mesh(), *two);
  // Flattening the parts again finds the cached communicator.
  EXPECT_EQ(*two->flatten({"dp", "tp"}, "w"), *mesh->get_group("w"));
  EXPECT_EQ(LiveCommunicatorCount(), live + 2);
}

// PyTorch: test_unflatten_mesh_3d — (pp, dp_shard) -> (pp, dp, cp): pp is
// reused, dp and cp are new, earlier flattenings carry over.
TEST(Unflatten, MiddleDimensionKeepsTheOthers) {
  const int world = WorldSize();
  const int64_t me = WorldRank();
  const int64_t shard = world / 2;  // 2 on 4 ranks, 4 on 8
  auto mesh = init_device_mesh("cpu", {2, shard}, {"pp", "dp_shard"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto all = mesh->flatten({"pp", "dp_shard"}, "all");
  ASSERT_TRUE(all.ok()) << all.status();
  const int64_t live = LiveCommunicatorCount();
  auto three = mesh->unflatten("dp_shard", {2, shard / 2}, {"dp", "cp"});
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(LiveCommunicatorCount(), live + 2);
  const Grid g{{2, 2, shard / 2}};
  EXPECT_THAT(three->mesh_dim_names(), ElementsAre("pp", "dp", "cp"));
  EXPECT_EQ(*three->get_group("pp"), *mesh->get_group("pp"));
  ExpectGroup(*three->get_group("dp"), g.group(me, {1}));
  ExpectGroup(*three->get_group("cp"), g.group(me, {2}));
  EXPECT_EQ(*three->get_group("all"), *all);
  EXPECT_EQ(*three->get_group("dp_shard"), *mesh->get_group("dp_shard"));
  auto pp_shard = three->slice({"pp", "dp_shard"});
  ASSERT_TRUE(pp_shard.ok()) << pp_shard.status();
  EXPECT_EQ(pp_shard->mesh(), g.group(me, {0, 1, 2}));
  // Flattening new dims with old ones: (pp, cp), non-adjacent.
  auto pp_cp = three->flatten_mesh({"pp", "cp"}, "pp_cp");
  ASSERT_TRUE(pp_cp.ok()) << pp_cp.status();
  ExpectGroup(*pp_cp->get_group(), g.group(me, {0, 2}));
  // The index overload: dimension 1 is dp_shard.
  auto by_index = mesh->unflatten(1, {shard / 2, 2}, {"a", "b"});
  ASSERT_TRUE(by_index.ok()) << by_index.status();
  EXPECT_THAT(by_index->shape(), ElementsAre(2, shard / 2, 2));
}

// From a child: the same view of the new root, this rank's pp row.
TEST(Unflatten, FromAChild) {
  const int world = WorldSize();
  const int64_t me = WorldRank();
  const int64_t shard = world / 2;
  auto mesh = init_device_mesh("cpu", {2, shard}, {"pp", "dp_shard"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto row = (*mesh)["dp_shard"];
  ASSERT_TRUE(row.ok()) << row.status();
  auto split = row->unflatten("dp_shard", {2, shard / 2}, {"dp", "cp"});
  ASSERT_TRUE(split.ok()) << split.status();
  const Grid g{{2, 2, shard / 2}};
  EXPECT_THAT(split->mesh_dim_names(), ElementsAre("dp", "cp"));
  EXPECT_EQ(split->mesh(), g.group(me, {1, 2}));
  ExpectGroup(*split->get_group("cp"), g.group(me, {2}));
  EXPECT_THAT(split->root_mesh().mesh_dim_names(),
              ElementsAre("pp", "dp", "cp"));
}

// Bad arguments fail on every rank alike, before any communication, naming
// the bad value and what was expected.
TEST(Unflatten, BadArgumentsNameTheValue) {
  const int world = WorldSize();
  auto mesh = init_device_mesh("cpu", {2, world / 2}, {"pp", "dp"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto product = mesh->unflatten("dp", {3, 5}, {"a", "b"});
  EXPECT_EQ(product.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(product.status().message()), HasSubstr("[3, 5]"));
  EXPECT_THAT(std::string(product.status().message()),
              HasSubstr(absl::StrCat("expected ", world / 2)));
  auto count = mesh->unflatten("dp", {world / 2}, {"a", "b"});
  EXPECT_EQ(count.status().code(), absl::StatusCode::kInvalidArgument);
  auto clash = mesh->unflatten("dp", {1, world / 2}, {"pp", "x"});
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(clash.status().message()), HasSubstr("'pp'"));
  auto twice = mesh->unflatten("dp", {1, world / 2}, {"x", "x"});
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  auto zero = mesh->unflatten("dp", {0, world / 2}, {"x", "y"});
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  auto unknown = mesh->unflatten("zz", {1}, {"x"});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(mesh->flatten({"pp", "dp"}, "flat").ok());
  auto flat = mesh->unflatten("flat", {world}, {"x"});
  EXPECT_EQ(flat.status().code(), absl::StatusCode::kNotFound);  // not a dim
  auto flat_dim =
      (*mesh)["flat"]->unflatten("flat", {2, world / 2}, {"x", "y"});
  EXPECT_EQ(flat_dim.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(flat_dim.status().message()),
              HasSubstr("flattening"));
  // The mesh still works after the refusals (no rank was left in a split).
  auto ok = mesh->unflatten("dp", {1, world / 2}, {"x", "y"});
  ASSERT_TRUE(ok.ok()) << ok.status();
}

// A meta mesh unflattens its layout without communicating.
TEST(Unflatten, MetaLayoutOnly) {
  auto layout = MeshLayout::Create({2, 6}, {"pp", "dp"});
  const DeviceMesh meta = DeviceMesh::Meta(*layout, 7);
  auto split = meta.unflatten("dp", {3, 2}, {"dp", "cp"});
  EXPECT_EQ(split.status().code(),
            absl::StatusCode::kInvalidArgument);  // dp taken
  auto ok = meta.unflatten("dp", {3, 2}, {"d", "c"});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_THAT(ok->shape(), ElementsAre(2, 3, 2));
  EXPECT_THAT(*ok->get_coordinate(), ElementsAre(1, 0, 1));
}

}  // namespace
}  // namespace vemesh
