// DeviceMesh::view on 4 and 8 ranks, restating Megatron's HyperCommGrid
// views: a dense factorisation (pp, dp, cp, tp) and an expert one (pp, edp,
// ep, etp) of the same ranks. A dimension two views share is one
// communicator; a view whose shared dimension enumerates other groups is
// refused. Expected groups are row-major arithmetic done here.
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

using testing_grid::ExpectGroup;
using testing_grid::Grid;
using testing_grid::WorldRank;
using testing_grid::WorldSize;

using ::testing::HasSubstr;

// Ranks of the group of `of` along dimension `d` of a row-major `shape`.
std::vector<int64_t> Group(const std::vector<int64_t>& shape, int64_t of,
                           size_t d) {
  return testing_grid::Grid{shape}.group(of, {static_cast<int>(d)});
}

TEST(Views, DenseAndExpertShareTheirCommonDimensions) {
  const int world = WorldSize();
  const int64_t me = WorldRank();
  const std::vector<int64_t> dense_shape = {2, world / 4, 1, 2};
  auto dense = init_device_mesh("cpu", dense_shape, {"pp", "dp", "cp", "tp"});
  ASSERT_TRUE(dense.ok()) << dense.status();
  const int64_t live = LiveCommunicatorCount();
  // Experts: pp and tp shared by name (same groups); edp and ep by rank
  // set (issue 45's group cache): edp's groups of one are those of the
  // first dense dimension of size 1 (dp on 4 ranks, cp on 8), ep's are
  // dp's. No split at all.
  const std::vector<int64_t> expert_shape = {2, 1, world / 4, 2};
  auto expert = dense->view(expert_shape, {"pp", "edp", "ep", "tp"});
  ASSERT_TRUE(expert.ok()) << expert.status();
  EXPECT_EQ(LiveCommunicatorCount(), live);
  EXPECT_EQ(*expert->get_group("edp"),
            *dense->get_group(world == 4 ? "dp" : "cp"));
  EXPECT_EQ(*expert->get_group("ep"), *dense->get_group("dp"));
  EXPECT_EQ(*expert->get_group("pp"), *dense->get_group("pp"));
  EXPECT_EQ(*expert->get_group("tp"), *dense->get_group("tp"));
  for (size_t d = 0; d < expert_shape.size(); ++d) {
    SCOPED_TRACE(expert->mesh_dim_names()[d]);
    ExpectGroup(*expert->get_group(static_cast<int64_t>(d)),
                Group(expert_shape, me, d));
  }
  EXPECT_EQ(expert->mesh(), dense->mesh());
  // A third view shares ep (from the expert view) and pp (from the root).
  auto again = dense->view({2, world / 4, 2}, {"pp", "ep", "etp"});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again->get_group("ep"), *expert->get_group("ep"));
  EXPECT_EQ(*again->get_group("pp"), *dense->get_group("pp"));
  ExpectGroup(*again->get_group("etp"), Group({2, world / 4, 2}, me, 2));
  // etp spans tp's rank sets: shared too.
  EXPECT_EQ(*again->get_group("etp"), *dense->get_group("tp"));
  EXPECT_EQ(LiveCommunicatorCount(), live);
  // A view whose dimension spans rank sets no mesh has splits once for it.
  auto fresh = dense->view({world}, {"all"});
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(LiveCommunicatorCount(), live + 1);
  // A new dimension is made on the mesh's default backend, a shared one
  // keeps its own.
  EXPECT_EQ(*expert->backend("ep"), *dense->backend("tp"));
  EXPECT_EQ(*expert->backend("pp"), *dense->backend("pp"));
  // Views slice and flatten like any mesh.
  auto ep_tp = expert->flatten_mesh({"ep", "tp"}, "ep_tp");
  ASSERT_TRUE(ep_tp.ok()) << ep_tp.status();
  EXPECT_EQ(ep_tp->size(), world / 2);
}

TEST(Views, ASharedNameWithOtherGroupsIsRefused) {
  const int world = WorldSize();
  auto dense = init_device_mesh("cpu", {2, world / 2}, {"pp", "dp"});
  ASSERT_TRUE(dense.ok()) << dense.status();
  // "dp" of size world/2 in the root; here it would be {r, r+2, ...}.
  auto bad = dense->view({world / 2, 2}, {"dp", "x"});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("'dp'"));
  // The wrong number of ranks.
  auto size = dense->view({2, world}, {"a", "b"});
  EXPECT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(size.status().message()), HasSubstr("expected"));
  // Names are required.
  auto unnamed = dense->view({world}, {});
  EXPECT_EQ(unnamed.status().code(), absl::StatusCode::kInvalidArgument);
  // A name an earlier view brought in is checked too.
  ASSERT_TRUE(dense->view({2, world / 2}, {"pp", "ep"}).ok());
  auto bad_ep = dense->view({2, world / 2}, {"ep", "y"});
  EXPECT_EQ(bad_ep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_ep.status().message()), HasSubstr("'ep'"));
  // After the refusals every rank can still make a view.
  auto ok = dense->view({world}, {"all"});
  ASSERT_TRUE(ok.ok()) << ok.status();
  ExpectGroup(*ok->get_group(), dense->mesh());
}

}  // namespace
}  // namespace vemesh
