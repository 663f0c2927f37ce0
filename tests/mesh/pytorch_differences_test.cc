// Where vemesh's DeviceMesh answers differently from PyTorch's on purpose
// (issue 30, item 8), each pinned here; the arguments are in
// docs/USER_GUIDE.md ("Differences from PyTorch's DeviceMesh"). On 4 and 8
// ranks; expected groups by hand
// (hand_grid.h). Non-members of a smaller mesh: mesh_algebra_test's
// NonMembersOfASmallerMesh pins that behaviour.
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

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

// PyTorch: a mesh made without mesh_dim_names has no names, and slicing it
// by name is an error. vemesh names the dimensions as veScale does (the
// last n of PP, DP, TP), so every query that takes a name works on it;
// a name it was not given is NotFound, and more than 3 dimensions need
// names.
TEST(PyTorchDifferences, AMeshWithoutNamesGetsVeScalesDefaultNames) {
  const int world = WorldSize();
  const int64_t me = WorldRank();
  const Grid g{{2, world / 2}};
  auto mesh = init_device_mesh("cpu", g.shape);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_THAT(mesh->mesh_dim_names(), ElementsAre("DP", "TP"));
  auto tp = (*mesh)["TP"];
  ASSERT_TRUE(tp.ok()) << tp.status();
  EXPECT_EQ(tp->mesh(), g.group(me, {1}));
  ExpectGroup(*mesh->get_group(1), g.group(me, {1}));  // by index, as PyTorch
  auto unknown = (*mesh)["dp"];
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("DP, TP"));

  // Unnamed and named with the same names: equal layouts, different meshes
  // (two creations, two sets of communicators).
  auto named = init_device_mesh("cpu", g.shape, {"DP", "TP"});
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->layout(), mesh->layout());
  EXPECT_NE(*named, *mesh);
  // A 1-D unnamed mesh is "TP"; its child along TP is the same mesh.
  auto one = init_device_mesh("cpu", {world});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_THAT(one->mesh_dim_names(), ElementsAre("TP"));
  EXPECT_EQ(*(*one)["TP"], *one);

  // Four unnamed dimensions: refused before any communication.
  auto four = init_device_mesh("cpu", {1, 1, 2, world / 2});
  EXPECT_EQ(four.status().code(), absl::StatusCode::kInvalidArgument);
}

// PyTorch refuses a slice whose flattened dimension interleaves with
// another (dp_tp spans dims 0 and 2, cp is dim 1), and any slice out of
// the root's order. vemesh's layouts describe any order of root dimensions
// (a transpose) and find communicators by the root dimensions spanned, so
// the slice is a well-defined mesh: accepted, with the groups it names.
TEST(PyTorchDifferences, InterleavedFlattenedSliceIsAccepted) {
  const int world = WorldSize();
  const int64_t me = WorldRank();
  const Grid g = world == 8 ? Grid{{2, 2, 2}} : Grid{{2, 1, 2}};
  auto mesh = init_device_mesh("cpu", g.shape, {"dp", "cp", "tp"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto dp_tp = mesh->flatten({"dp", "tp"}, "dp_tp");
  ASSERT_TRUE(dp_tp.ok()) << dp_tp.status();
  auto slice = (*mesh)[{"dp_tp", "cp"}];
  ASSERT_TRUE(slice.ok()) << slice.status();
  EXPECT_THAT(slice->mesh_dim_names(), ElementsAre("dp_tp", "cp"));
  EXPECT_THAT(slice->shape(), ElementsAre(4, g.shape[1]));
  EXPECT_EQ(slice->mesh(), g.group(me, {0, 2, 1}));
  EXPECT_EQ(*slice->get_group("dp_tp"), *dp_tp);
  EXPECT_EQ(*slice->get_group("cp"), *mesh->get_group("cp"));
  ExpectGroup(*slice->get_group("dp_tp"), g.group(me, {0, 2}));
  EXPECT_EQ(*slice->get_coordinate(),
            (std::vector<int64_t>{g.index(me, {0, 2}), g.coord(me)[1]}));
}

}  // namespace
}  // namespace vemesh
