// The mesh algebra on 4 and 8 ranks, restating PyTorch's DeviceMesh cases
// (flatten, slicing by a flattened name, nested and non-adjacent flattening,
// get_group()/get_all_groups(), the root of a child, non-member ranks of a
// smaller mesh, equality and hashing). Every expected rank list is computed
// here from row-major arithmetic (Grid below), never from vemesh's layout,
// and every communicator is checked with real traffic.
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
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

// 8 ranks: dp=2, cp=2, tp=2. 4 ranks: dp=2, cp=1, tp=2 (a size-1 dim too).
Grid ThreeD() { return WorldSize() == 8 ? Grid{{2, 2, 2}} : Grid{{2, 1, 2}}; }
const std::vector<std::string> kNames = {"dp", "cp", "tp"};

absl::StatusOr<DeviceMesh> MakeThreeD() {
  return init_device_mesh("cpu", ThreeD().shape, kNames);
}

// PyTorch: test_flatten_mesh_3d — flatten a sub-mesh, then the flattened
// name is a dimension of the root: sliceable, its group, its local rank.
TEST(MeshAlgebra, FlattenYieldsAMeshSliceableByItsName) {
  const Grid g = ThreeD();
  const int64_t me = WorldRank();
  auto mesh = MakeThreeD();
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto flat = mesh->flatten_mesh({"dp", "cp"}, "dp_cp");
  ASSERT_TRUE(flat.ok()) << flat.status();
  const std::vector<int64_t> dp_cp = g.group(me, {0, 1});
  EXPECT_THAT(flat->mesh_dim_names(), ElementsAre("dp_cp"));
  EXPECT_EQ(flat->mesh(), dp_cp);
  EXPECT_EQ(*flat->size(0), g.shape[0] * g.shape[1]);
  ExpectGroup(*flat->get_group(), dp_cp);
  // The communicator flatten returns is the mesh's, and is cached.
  auto comm = mesh->flatten({"dp", "cp"}, "dp_cp");
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ(*comm, *flat->get_group());

  // On the root: a dimension like any other.
  auto by_name = (*mesh)["dp_cp"];
  ASSERT_TRUE(by_name.ok()) << by_name.status();
  EXPECT_EQ(by_name->mesh(), dp_cp);
  EXPECT_EQ(*by_name, *flat);
  EXPECT_EQ(*mesh->get_group("dp_cp"), *comm);
  EXPECT_EQ(*mesh->get_local_rank("dp_cp"), g.index(me, {0, 1}));
  EXPECT_EQ(*mesh->size("dp_cp"), g.shape[0] * g.shape[1]);
  // A slice of {"dp_cp", "tp"}: 2-D, row-major over (dp, cp) then tp.
  auto two = mesh->slice({"dp_cp", "tp"});
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_THAT(two->shape(), ElementsAre(g.shape[0] * g.shape[1], g.shape[2]));
  EXPECT_EQ(two->mesh(), g.group(me, {0, 1, 2}));
  EXPECT_EQ(*two->get_group("dp_cp"), *comm);
  ExpectGroup(*two->get_group("tp"), g.group(me, {2}));
  auto groups = two->get_all_groups();
  ASSERT_TRUE(groups.ok()) << groups.status();
  ASSERT_EQ(groups->size(), 2u);
  EXPECT_EQ((*groups)[0], *comm);
  EXPECT_EQ((*groups)[1], *mesh->get_group("tp"));
  // A brace slice in the other order: (tp, dp_cp).
  auto swapped = (*mesh)[{"tp", "dp_cp"}];
  ASSERT_TRUE(swapped.ok()) << swapped.status();
  EXPECT_EQ(swapped->mesh(), g.group(me, {2, 0, 1}));

  // A child that holds dp and cp knows the name; one that lacks dp does not.
  auto dp_cp_child = mesh->slice({"dp", "cp"});
  ASSERT_TRUE(dp_cp_child.ok());
  EXPECT_EQ(*dp_cp_child->get_group("dp_cp"), *comm);
  EXPECT_EQ((*dp_cp_child)["dp_cp"]->mesh(), dp_cp);
  auto cp_tp = mesh->slice({"cp", "tp"});
  ASSERT_TRUE(cp_tp.ok());
  auto missing = cp_tp->get_group("dp_cp");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("'dp'"));
  EXPECT_EQ((*cp_tp)["dp_cp"].status().code(), absl::StatusCode::kNotFound);
}

// Nested: flatten a flattened name with another dimension. The result spans
// the same root dimensions as flattening all three at once, so it is the
// same communicator (one split, not two).
TEST(MeshAlgebra, NestedFlattenIsTheFlatteningOfAllItsRoots) {
  const Grid g = ThreeD();
  const int64_t me = WorldRank();
  auto mesh = MakeThreeD();
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  ASSERT_TRUE(mesh->flatten({"dp", "cp"}, "dp_cp").ok());
  auto all = mesh->flatten_mesh({"dp_cp", "tp"}, "world");
  ASSERT_TRUE(all.ok()) << all.status();
  const std::vector<int64_t> everyone = g.group(me, {0, 1, 2});
  EXPECT_EQ(all->mesh(), everyone);
  ExpectGroup(*all->get_group(), everyone);
  auto direct = mesh->flatten({"dp", "cp", "tp"}, "world");
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(*direct, *all->get_group());
  EXPECT_EQ(*mesh->get_local_rank("world"), me);
  // The name cannot be rebound to other dimensions.
  auto rebound = mesh->flatten({"cp", "tp"}, "world");
  EXPECT_EQ(rebound.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(rebound.status().message()), HasSubstr("'world'"));
  // Nor can a flatten take a dimension's name.
  auto clash = mesh->flatten({"dp", "cp"}, "tp");
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(clash.status().message()), HasSubstr("'tp'"));
}

// Non-adjacent dimensions (DP x TP across CP, as for experts): the group
// and its order are row-major over (dp, tp).
TEST(MeshAlgebra, NonAdjacentDimensionsFlatten) {
  const Grid g = ThreeD();
  const int64_t me = WorldRank();
  auto mesh = MakeThreeD();
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto dp_tp = mesh->flatten_mesh({"dp", "tp"}, "dp_tp");
  ASSERT_TRUE(dp_tp.ok()) << dp_tp.status();
  const std::vector<int64_t> expected = g.group(me, {0, 2});
  EXPECT_EQ(dp_tp->mesh(), expected);
  ExpectGroup(*dp_tp->get_group(), expected);
  EXPECT_EQ(*mesh->get_local_rank("dp_tp"), g.index(me, {0, 2}));
  // Sliced with the dimension it skipped.
  auto cp_dp_tp = mesh->slice({"cp", "dp_tp"});
  ASSERT_TRUE(cp_dp_tp.ok()) << cp_dp_tp.status();
  EXPECT_EQ(cp_dp_tp->mesh(), g.group(me, {1, 0, 2}));
  ExpectGroup(*cp_dp_tp->get_group("cp"), g.group(me, {1}));
}

// The order of names is the order given, on every path: a slice, a flatten,
// the flattened name's mesh and group, the layout's groups. (tp, dp) is the
// transpose of (dp, tp): another rank order, another communicator.
TEST(MeshAlgebra, NamesInAnotherOrderAreTheTransposeOnEveryPath) {
  const Grid g = ThreeD();
  const int64_t me = WorldRank();
  auto mesh = MakeThreeD();
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  const std::vector<int64_t> tp_dp = g.group(me, {2, 0});
  const std::vector<int64_t> dp_tp = g.group(me, {0, 2});
  ASSERT_NE(tp_dp, dp_tp);
  EXPECT_EQ(mesh->slice({"tp", "dp"})->mesh(), tp_dp);
  EXPECT_EQ(mesh->submesh_at({"tp", "dp"}, me)->mesh(), tp_dp);
  auto groups = mesh->layout().groups({"tp", "dp"});
  ASSERT_TRUE(groups.ok());
  EXPECT_EQ((*groups)[g.coord(me)[1]], tp_dp);
  auto t = mesh->flatten_mesh({"tp", "dp"}, "tp_dp");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->mesh(), tp_dp);
  ExpectGroup(*t->get_group(), tp_dp);
  EXPECT_EQ((*mesh)["tp_dp"]->mesh(), tp_dp);
  EXPECT_EQ(*mesh->get_local_rank("tp_dp"), g.index(me, {2, 0}));
  auto d = mesh->flatten({"dp", "tp"}, "dp_tp");
  ASSERT_TRUE(d.ok()) << d.status();
  ExpectGroup(*d, dp_tp);
  EXPECT_NE(*d, *t->get_group());
}

// PyTorch: test_get_group / get_all_groups, the root of a child, size(int).
TEST(MeshAlgebra, GroupsRootAndSizes) {
  const Grid g = ThreeD();
  const int64_t me = WorldRank();
  auto mesh = MakeThreeD();
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto all = mesh->get_all_groups();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 3u);
  for (int d = 0; d < 3; ++d) {
    SCOPED_TRACE(kNames[d]);
    ExpectGroup((*all)[d], g.group(me, {d}));
    EXPECT_EQ(*mesh->size(d), g.shape[d]);
  }
  auto none = mesh->get_group();
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("dp, cp, tp"));
  auto tp = (*mesh)["tp"];
  ASSERT_TRUE(tp.ok());
  EXPECT_EQ(*tp->get_group(), (*all)[2]);
  EXPECT_EQ(tp->root_mesh(), *mesh);
  EXPECT_EQ(mesh->root_mesh(), *mesh);
  EXPECT_EQ(tp->root_mesh().mesh(), g.group(me, {0, 1, 2}));
}

// PyTorch: test_device_mesh_hash / __eq__ — equal meshes hash equally and
// key a map; different dims, anchors or creations are different meshes.
TEST(MeshAlgebra, EqualityAndHashing) {
  const Grid g = ThreeD();
  const int64_t me = WorldRank();
  auto mesh = MakeThreeD();
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto tp1 = (*mesh)["tp"];
  auto tp2 = mesh->slice({"tp"});
  auto dp = (*mesh)["dp"];
  ASSERT_TRUE(tp1.ok() && tp2.ok() && dp.ok());
  EXPECT_EQ(*tp1, *tp2);
  EXPECT_EQ(absl::Hash<DeviceMesh>{}(*tp1), absl::Hash<DeviceMesh>{}(*tp2));
  EXPECT_NE(*tp1, *dp);
  EXPECT_NE(*tp1, *mesh);
  // The TP row of another rank (another anchor) is another mesh.
  const int64_t other = g.group(me, {0})[g.coord(me)[0] == 0 ? 1 : 0];
  auto tp_other = mesh->submesh_at({"tp"}, other);
  ASSERT_TRUE(tp_other.ok());
  EXPECT_NE(*tp1, *tp_other);
  EXPECT_EQ(*tp_other, *mesh->submesh_at({"tp"}, other));

  absl::flat_hash_map<DeviceMesh, int> cache;
  cache[*tp1] = 1;
  cache[*dp] = 2;
  cache[*mesh] = 3;
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.at(*tp2), 1);
  EXPECT_EQ(cache.at((*mesh)["dp"].value()), 2);
  EXPECT_EQ(cache.at(tp1->root_mesh()), 3);

  // A second creation with the same arguments has other communicators.
  auto again = MakeThreeD();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(*again, *mesh);
  EXPECT_EQ(cache.count(*again), 0u);
  EXPECT_EQ(again->mesh(), mesh->mesh());
}

// PyTorch: a mesh smaller than the world — the ranks outside it take part
// in creation and in flatten, then have no coordinate and no groups.
TEST(MeshAlgebra, NonMembersOfASmallerMesh) {
  const int world = WorldSize();
  const int64_t me = WorldRank();
  const Grid g{{2, world / 4}};  // half the world: ranks 0 .. world/2 - 1
  const int64_t members = world / 2;
  auto mesh = init_device_mesh("cpu", g.shape, {"dp", "tp"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto flat = mesh->flatten_mesh({"dp", "tp"}, "dp_tp");
  if (me < members) {
    ASSERT_TRUE(flat.ok()) << flat.status();
    ExpectGroup(*flat->get_group(), g.group(me, {0, 1}));
    ExpectGroup(*mesh->get_group("dp"), g.group(me, {0}));
    EXPECT_EQ(*mesh->get_local_rank("dp_tp"), me);
    EXPECT_EQ(*mesh->get_local_rank(0), g.coord(me)[0]);
    return;
  }
  EXPECT_FALSE(mesh->has_self());
  EXPECT_EQ(flat.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(mesh->get_coordinate().status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(mesh->get_group("dp").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(mesh->get_group("dp_tp").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(mesh->get_all_groups().status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(mesh->get_local_rank("dp_tp").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ((*mesh)["dp_tp"].status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Layout questions still answer: the size along the flattened name.
  EXPECT_EQ(*mesh->size("dp_tp"), members);
  EXPECT_EQ(*mesh->size(1), world / 4);
}

}  // namespace
}  // namespace vemesh
