// The registry on the "meta" device: layout only, no MPI, one process. It
// answers every query for any rank, and refuses clearly when it must.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace vemesh {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<int64_t> V(const Coordinate& c) { return {c.begin(), c.end()}; }

class RegistryTest : public ::testing::Test {
 protected:
  VeDeviceMesh reg_;  // a registry of the test's own, not the global one
};

TEST_F(RegistryTest, EveryQueryBeforeInitSaysToInit) {
  const std::vector<absl::Status> answers = {
      reg_.get().status(),
      reg_["TP"].status(),
      reg_.get_submesh({"DP"}).status(),
      reg_.get_strategy_size("TP").status(),
      reg_.get_strategy_size(0).status(),
      reg_.get_strategy_coordinate().status(),
      reg_.get_strategy_coordinate(3).status(),
      reg_.lookup_rank("TP").status(),
      reg_.get_global_rank({0}).status(),
      reg_.get_local_rank().status(),
      reg_.get_coordinate().status(),
      reg_.size().status(),
      reg_.ndim().status(),
      reg_.shape().status(),
      reg_.get_pipeline_parallel_rank().status(),
      reg_.get_data_parallel_mesh().status(),
      reg_.get_tensor_parallel_dim_groups().status(),
      reg_.get_global_pipeline_parallel_meshes().status(),
      reg_.is_first_stage().status(),
      reg_.get_next_stage().status(),
      reg_.get_prev_stage_peer().status(),
  };
  for (const absl::Status& s : answers) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("init_device_mesh"));
  }
  EXPECT_FALSE(reg_.is_initialized());
}

TEST_F(RegistryTest, MetaMeshAnswersForAnyRankWithoutCommunicators) {
  auto mesh = reg_.init_device_mesh("meta", {4, 2, 8}, {"PP", "DP", "TP"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(*reg_.device_type(), DeviceType::kMeta);
  EXPECT_EQ(*reg_.size(), 64);
  // Rank 45 = 16*2 + 8*1 + 5.
  EXPECT_THAT(V(*reg_.get_strategy_coordinate(45)), ElementsAre(2, 1, 5));
  EXPECT_EQ(*reg_.get_global_rank({2, 1, 5}), 45);
  EXPECT_EQ(*reg_.get_strategy_size("DP"), 2);
  // This process is rank 0 (no MPI): TP mesh [0..7], DP [0, 8], PP
  // [0,16,32,48].
  EXPECT_THAT(reg_.get_tensor_parallel_mesh()->mesh(),
              ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_THAT(reg_.get_data_parallel_mesh()->mesh(), ElementsAre(0, 8));
  EXPECT_THAT(reg_.get_pipeline_parallel_mesh()->mesh(),
              ElementsAre(0, 16, 32, 48));
  EXPECT_EQ(**reg_.get_next_stage_peer(), 16);
  EXPECT_FALSE(reg_.get_prev_stage_peer()->has_value());
  EXPECT_EQ(**reg_.get_prev_stage_peer(/*wrap=*/true), 48);
  // No communicators on meta: asking for one is refused, not a crash.
  EXPECT_EQ(reg_.get_tensor_parallel_dim_groups().status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(RegistryTest, BadArgumentsNameTheValueAndLeaveTheRegistryAlone) {
  ASSERT_TRUE(reg_.init_device_mesh("meta", {2, 4}).ok());
  EXPECT_EQ(reg_.init_device_mesh("tpu", {8}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(reg_.init_device_mesh("tpu", {8}).status().message()),
              HasSubstr("'tpu'"));
  EXPECT_THAT(
      std::string(reg_.init_device_mesh("meta", {2, 0}).status().message()),
      HasSubstr("size 0"));
  EXPECT_THAT(
      std::string(
          reg_.init_device_mesh("meta", {2, 2}, {"DP"}).status().message()),
      HasSubstr("1 names"));
  // Still the (2, 4) mesh.
  EXPECT_THAT(*reg_.shape(), ElementsAre(2, 4));
  EXPECT_EQ(reg_.get_strategy_size("EP").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(reg_.get_strategy_size("EP").status().message()),
              HasSubstr("'EP'"));
  EXPECT_EQ(reg_.get_strategy_size(2).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(reg_.lookup_rank(-1).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(reg_.get_strategy_coordinate(8).status().message()),
              HasSubstr("rank 8"));
  EXPECT_THAT(std::string(reg_.get_global_rank({1, 4}).status().message()),
              HasSubstr("[1, 4]"));
  EXPECT_THAT(std::string(reg_.get_role_mesh("PP").status().message()),
              HasSubstr("'PP'"));
}

TEST_F(RegistryTest, CudaWithIndexIsCudaOnThatDevice) {
  auto parsed = ParseDeviceType("cuda:3");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->type, DeviceType::kCuda);
  EXPECT_EQ(parsed->index, 3);  // honoured: no warning that it is ignored
  EXPECT_EQ(parsed->warning, "");
  EXPECT_EQ(ParseDeviceType("cuda")->index, -1);
  EXPECT_FALSE(ParseDeviceType("cuda:-1").ok());
}

TEST_F(RegistryTest, OneDimensionalMeshOfAnotherNameIsBothDPAndTP) {
  ASSERT_TRUE(reg_.init_device_mesh("meta", {8}, {"X"}).ok());
  EXPECT_EQ(*reg_.get_role_size("DP"), 8);
  EXPECT_EQ(*reg_.get_role_size("TP"), 8);
  EXPECT_EQ(*reg_.get_role_size("PP"), 1);
  EXPECT_TRUE(*reg_.is_first_stage());
  EXPECT_TRUE(*reg_.is_last_stage());
  // Named DP, it is DP only: TP has size 1.
  ASSERT_TRUE(reg_.init_device_mesh("meta", {8}, {"DP"}).ok());
  EXPECT_EQ(*reg_.get_role_size("DP"), 8);
  EXPECT_EQ(*reg_.get_role_size("TP"), 1);
}

TEST_F(RegistryTest, RolesAreFoundByNameNotPosition) {
  // veScale would call the last dimension TP whatever its name.
  ASSERT_TRUE(reg_.init_device_mesh("meta", {2, 4}, {"TP", "DP"}).ok());
  EXPECT_EQ(*reg_.get_role_size("TP"), 2);
  EXPECT_EQ(*reg_.get_role_size("DP"), 4);
  EXPECT_THAT(reg_.get_tensor_parallel_mesh()->mesh(), ElementsAre(0, 4));
}

// A mesh named in lower case: the role getters match the dimension whatever
// its case (before, they answered size 1 and rank 0 silently).
TEST_F(RegistryTest, RolesMatchDimensionNamesIgnoringCase) {
  ASSERT_TRUE(
      reg_.init_device_mesh("meta", {2, 3, 4}, {"pp", "dp", "tp"}).ok());
  for (absl::string_view tp : {"TP", "tp", "Tp"}) {
    EXPECT_EQ(*reg_.get_role_size(tp), 4) << tp;
  }
  EXPECT_EQ(*reg_.get_role_size("DP"), 3);
  EXPECT_EQ(*reg_.get_role_size("dp"), 3);
  EXPECT_EQ(*reg_.get_role_size("PP"), 2);
  EXPECT_THAT(reg_.get_tensor_parallel_mesh()->mesh(), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(reg_.get_data_parallel_mesh()->mesh(), ElementsAre(0, 4, 8));
  EXPECT_THAT(reg_.get_pipeline_parallel_mesh()->mesh(), ElementsAre(0, 12));
  EXPECT_EQ(reg_.get_global_tensor_parallel_meshes()->size(), 6u);
  auto stages = reg_.get_global_pipeline_parallel_meshes();
  ASSERT_TRUE(stages.ok()) << stages.status();
  EXPECT_EQ(stages->size(), 2u);  // "pp" is the pipeline dimension
  EXPECT_FALSE(*reg_.is_last_stage());
  // Dimension queries stay exact: "TP" is not a dimension's name.
  EXPECT_EQ(reg_.get_strategy_size("TP").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(reg_.get_strategy_size("TP").status().message()),
              HasSubstr("[pp, dp, tp]"));
  // A 1-D mesh named "tp" is TP only, as one named "TP" is.
  ASSERT_TRUE(reg_.init_device_mesh("meta", {8}, {"tp"}).ok());
  EXPECT_EQ(*reg_.get_role_size("TP"), 8);
  EXPECT_EQ(*reg_.get_role_size("DP"), 1);
}

TEST_F(RegistryTest, RoleMatchingTwoDimensionsByCaseIsAnError) {
  ASSERT_TRUE(reg_.init_device_mesh("meta", {2, 4}, {"tp", "Tp"}).ok());
  // Exact names are unambiguous.
  EXPECT_EQ(*reg_.get_role_size("tp"), 2);
  EXPECT_EQ(*reg_.get_role_size("Tp"), 4);
  // "TP" matches both only ignoring case: an error naming both.
  for (const absl::Status& s :
       {reg_.get_role_size("TP").status(), reg_.get_role_rank("TP").status(),
        reg_.get_tensor_parallel_rank().status(),
        reg_.get_tensor_parallel_mesh().status(),
        reg_.get_tensor_parallel_dim_groups().status(),
        reg_.get_global_tensor_parallel_meshes().status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("'tp'"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("'Tp'"));
  }
  // Two pipeline dimensions by case: init refuses, naming them, and the
  // registry keeps the mesh it had.
  auto bad = reg_.init_device_mesh("meta", {2, 2}, {"pp", "Pp"});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("'Pp'"));
  EXPECT_THAT(*reg_.mesh_dim_names(), ElementsAre("tp", "Tp"));
}

TEST_F(RegistryTest, ResetForgetsTheMesh) {
  ASSERT_TRUE(reg_.init_device_mesh("meta", {2, 2}).ok());
  auto mesh = reg_.get();
  ASSERT_TRUE(mesh.ok());
  EXPECT_TRUE(reg_.is_current(*mesh));
  reg_.reset();
  EXPECT_FALSE(reg_.is_initialized());
  EXPECT_FALSE(reg_.is_current(*mesh));
  EXPECT_EQ(reg_.check_current(*mesh).code(),
            absl::StatusCode::kFailedPrecondition);
  // The handed-out mesh still answers its own queries.
  EXPECT_EQ(mesh->size(), 4);
}

TEST_F(RegistryTest, MillionRankMetaMesh) {
  ASSERT_TRUE(
      reg_.init_device_mesh("meta", {64, 128, 128}, {"PP", "DP", "TP"}).ok());
  EXPECT_THAT(V(*reg_.get_strategy_coordinate(1048575)),
              ElementsAre(63, 127, 127));
  EXPECT_EQ(**reg_.get_next_stage_peer(), 16384);
}

}  // namespace
}  // namespace vemesh
