// DeviceMesh::concatenate on 8 ranks, restating PyTorch's DeviceMesh
// _concatenate tests (test/distributed/test_device_mesh.py) on a
// (dp, cp, tp) = (2, 2, 2) mesh: concatenating dp and cp is the 2-D slice
// {dp, cp}; tp then cp is a transposed slice; a flattened dimension
// concatenates with another (FSDP over dp x cp with tp apart);
// overlapping meshes and meshes of different roots are refused; no
// communicator is made. Expected ranks are row-major arithmetic done here.
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hand_grid.h"
#include "vemesh/mesh/device_mesh.h"

namespace vemesh {
namespace {

using ::testing::HasSubstr;
using testing_grid::Grid;
using testing_grid::WorldRank;
using testing_grid::WorldSize;

class Concatenate : public ::testing::Test {
 protected:
  void SetUp() override {
    if (WorldSize() != 8) GTEST_SKIP() << "runs on 8 ranks";
    auto mesh = init_device_mesh("cpu", {2, 2, 2}, {"dp", "cp", "tp"});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    mesh_ = *mesh;
  }
  DeviceMesh Dim(const std::string& name) { return *mesh_[name]; }
  const Grid grid_{{2, 2, 2}};
  DeviceMesh mesh_ = DeviceMesh::Meta(*MeshLayout::Create({1}, {"x"}), 0);
};

TEST_F(Concatenate, TwoDimensionsAreTheirSlice) {
  const int64_t live = LiveCommunicatorCount();
  auto dp_cp = DeviceMesh::concatenate({Dim("dp"), Dim("cp")});
  ASSERT_TRUE(dp_cp.ok()) << dp_cp.status();
  // PyTorch: the same layout, mesh tensor and group names as mesh["dp", "cp"].
  EXPECT_EQ(*dp_cp, *mesh_.slice({"dp", "cp"}));
  EXPECT_EQ(dp_cp->mesh_dim_names(), (std::vector<std::string>{"dp", "cp"}));
  EXPECT_EQ(dp_cp->shape(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(dp_cp->mesh(), grid_.group(WorldRank(), {0, 1}));
  EXPECT_EQ(*dp_cp->get_group("dp"), *mesh_.get_group("dp"));
  EXPECT_EQ(*dp_cp->get_group("cp"), *mesh_.get_group("cp"));
  EXPECT_EQ(LiveCommunicatorCount(), live);  // nothing made
}

TEST_F(Concatenate, OrderFollowsTheList) {
  // tp then cp: the transposed block, dimensions in the order given.
  auto tp_cp = DeviceMesh::concatenate({Dim("tp"), Dim("cp")});
  ASSERT_TRUE(tp_cp.ok()) << tp_cp.status();
  EXPECT_EQ(tp_cp->mesh_dim_names(), (std::vector<std::string>{"tp", "cp"}));
  EXPECT_EQ(tp_cp->mesh(), grid_.group(WorldRank(), {2, 1}));
  // Three 1-D meshes: the whole mesh again.
  auto all = DeviceMesh::concatenate({Dim("dp"), Dim("cp"), Dim("tp")});
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->mesh(), mesh_.mesh());
}

TEST_F(Concatenate, AFlattenedDimensionJoinsTheOthers) {
  // FSDP over dp x cp (flattened), TP apart: concatenate to place both.
  auto dp_cp = mesh_.flatten_mesh({"dp", "cp"}, "dp_cp");
  ASSERT_TRUE(dp_cp.ok()) << dp_cp.status();
  auto joined = DeviceMesh::concatenate({*dp_cp, Dim("tp")});
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->shape(), (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(joined->mesh_dim_names(),
            (std::vector<std::string>{"dp_cp", "tp"}));
  EXPECT_EQ(joined->mesh(), grid_.group(WorldRank(), {0, 1, 2}));
  EXPECT_EQ(*joined->get_group("dp_cp"), *dp_cp->get_group());
  EXPECT_EQ(*joined->get_group("tp"), *mesh_.get_group("tp"));
}

TEST_F(Concatenate, OverlapDifferentRootsAndNothingAreRefused) {
  auto dp_cp = mesh_.flatten_mesh({"dp", "cp"}, "dp_cp");
  ASSERT_TRUE(dp_cp.ok());
  // PyTorch: "Cannot concatenate overlapping meshes".
  for (const auto& list : {std::vector<DeviceMesh>{Dim("dp"), Dim("dp")},
                           std::vector<DeviceMesh>{*dp_cp, Dim("cp")}}) {
    auto r = DeviceMesh::concatenate(list);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr("overlapping"));
  }
  // PyTorch: "derived from different device meshes".
  auto other = init_device_mesh("cpu", {2, 2, 2}, {"dp", "cp", "tp"});
  ASSERT_TRUE(other.ok());
  auto r = DeviceMesh::concatenate({Dim("dp"), *(*other)["tp"]});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("different device meshes"));
  EXPECT_EQ(DeviceMesh::concatenate({}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A sub-mesh of another block than the first's.
  const int64_t me = WorldRank();
  const int64_t far = grid_.rank({1 - grid_.coord(me)[0], 0, 0});
  auto away = mesh_.submesh_at({"tp"}, far);
  ASSERT_TRUE(away.ok());
  r = DeviceMesh::concatenate({Dim("cp"), *away});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("outside"));
}

}  // namespace
}  // namespace vemesh
