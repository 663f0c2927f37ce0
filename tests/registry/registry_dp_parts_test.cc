// torchtitan's DP_REPLICATE and DP_SHARD on VESCALE_DEVICE_MESH: roles like
// any other, and on a mesh without DP their flattening (replicate-major)
// answers veScale's data-parallel getters. Groups are checked with real
// traffic: an all_gather of the global ranks lists the members in order.
#include <mpi.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job_world.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace vemesh {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

int WorldRank() { return vemesh::testing::JobRank(); }
int WorldSize() { return vemesh::testing::JobSize(); }

// The members of `comm` in its rank order, by real traffic.
std::vector<int64_t> Members(const std::shared_ptr<Communicator>& comm) {
  const int64_t me = WorldRank();
  std::vector<int64_t> all(comm->size());
  absl::Status s =
      comm->all_gather(absl::MakeConstSpan(&me, 1), absl::MakeSpan(all));
  EXPECT_TRUE(s.ok()) << s;
  return all;
}

void Init(std::vector<int64_t> shape, std::vector<std::string> names) {
  absl::StatusOr<DeviceMesh> m =
      VESCALE_DEVICE_MESH.init_device_mesh("cpu", shape, names);
  ASSERT_TRUE(m.ok()) << m.status();
}

// The data-parallel getters against `want_rank` and `want_members` (the DP
// group of this rank, in DP-rank order).
void ExpectDp(int64_t want_rank, const std::vector<int64_t>& want_members) {
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_role_size("DP"),
            static_cast<int64_t>(want_members.size()));
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_role_size("dp"),
            static_cast<int64_t>(want_members.size()));
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_data_parallel_rank(), want_rank);
  absl::StatusOr<DeviceMesh> mesh =
      VESCALE_DEVICE_MESH.get_data_parallel_mesh();
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_THAT(mesh->mesh(), ElementsAreArray(want_members));
  absl::StatusOr<std::shared_ptr<Communicator>> group =
      VESCALE_DEVICE_MESH.get_data_parallel_dim_groups();
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->rank(), want_rank);
  EXPECT_THAT(Members(*group), ElementsAreArray(want_members));
}

TEST(RegistryDpPartsTest, ReplicateTimesShardIsDataParallel) {
  const int n = WorldSize();
  const int r = WorldRank();
  if (n == 8) {
    // (a, b, c) = (replicate, shard, tp): r = 4a + 2b + c.
    Init({2, 2, 2}, {"DP_REPLICATE", "DP_SHARD", "TP"});
    const int a = r / 4, b = (r / 2) % 2, c = r % 2;
    ExpectDp(2 * a + b, {c, 2 + c, 4 + c, 6 + c});
    EXPECT_EQ(*VESCALE_DEVICE_MESH.get_role_size("TP"), 2);
    EXPECT_EQ(*VESCALE_DEVICE_MESH.get_tensor_parallel_rank(), c);
  } else {
    Init({2, n / 2}, {"DP_REPLICATE", "DP_SHARD"});
    std::vector<int64_t> all(n);
    for (int i = 0; i < n; ++i) all[i] = i;
    ExpectDp(r, all);
  }
  // Each is a role of its own, with size, rank, mesh and group.
  const int64_t shard_size = n == 8 ? 2 : n / 2;
  const int64_t shard_rank = n == 8 ? (r / 2) % 2 : r % (n / 2);
  const int64_t replicate_rank = n == 8 ? r / 4 : r / (n / 2);
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_role_size("DP_SHARD"), shard_size);
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_role_rank("DP_SHARD"), shard_rank);
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_role_size("DP_REPLICATE"), 2);
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_role_rank("dp_replicate"), replicate_rank);
  absl::StatusOr<std::shared_ptr<Communicator>> shard =
      VESCALE_DEVICE_MESH.get_role_dim_groups("DP_SHARD");
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ((*shard)->size(), shard_size);
  EXPECT_EQ((*shard)->rank(), shard_rank);
  absl::StatusOr<std::shared_ptr<Communicator>> replicate =
      VESCALE_DEVICE_MESH.get_role_dim_groups("DP_REPLICATE");
  ASSERT_TRUE(replicate.ok()) << replicate.status();
  EXPECT_EQ((*replicate)->rank(), replicate_rank);
  // The list of DP meshes is not built for a flattening: asked, it says so.
  absl::StatusOr<std::vector<DeviceMesh>> global =
      VESCALE_DEVICE_MESH.get_global_role_meshes("DP");
  EXPECT_EQ(global.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(global.status().message(), HasSubstr("DP_REPLICATE x DP_SHARD"));
}

TEST(RegistryDpPartsTest, NonAdjacentPartsFlattenInReplicateShardOrder) {
  if (WorldSize() != 8) GTEST_SKIP() << "needs 8 ranks";
  const int r = WorldRank();
  // DP_SHARD before DP_REPLICATE, TP between: (s, t, p) with r = 4s + 2t + p.
  Init({2, 2, 2}, {"DP_SHARD", "TP", "DP_REPLICATE"});
  const int s = r / 4, t = (r / 2) % 2, p = r % 2;
  // DP rank = replicate * 2 + shard: members ordered replicate-major.
  ExpectDp(2 * p + s, {2 * t, 4 + 2 * t, 2 * t + 1, 4 + 2 * t + 1});
}

TEST(RegistryDpPartsTest, OnePartAloneIsDataParallel) {
  const int n = WorldSize();
  const int r = WorldRank();
  Init({2, n / 2}, {"PP", "DP_SHARD"});
  std::vector<int64_t> members;
  for (int i = 0; i < n / 2; ++i)
    members.push_back((r / (n / 2)) * (n / 2) + i);
  ExpectDp(r % (n / 2), members);
  // A 1-D mesh of DP_SHARD is DP, not TP as well (unlike an unnamed role).
  Init({n}, {"DP_SHARD"});
  std::vector<int64_t> all(n);
  for (int i = 0; i < n; ++i) all[i] = i;
  ExpectDp(r, all);
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_role_size("TP"), 1);
}

TEST(RegistryDpPartsTest, AnExplicitDpWins) {
  const int n = WorldSize();
  const int r = WorldRank();
  Init({2, n / 2}, {"DP", "DP_SHARD"});
  // DP is the first dimension: members r % (n/2) + k * (n/2).
  ExpectDp(r / (n / 2), {r % (n / 2), r % (n / 2) + n / 2});
}

TEST(RegistryDpPartsTest, MetaMeshAnswersSizesButHasNoGroup) {
  VeDeviceMesh registry;
  ASSERT_TRUE(registry
                  .init_device_mesh("meta", {2, 4, 2},
                                    {"DP_REPLICATE", "DP_SHARD", "TP"})
                  .ok());
  EXPECT_EQ(*registry.get_role_size("DP"), 8);
  absl::StatusOr<std::shared_ptr<Communicator>> group =
      registry.get_data_parallel_dim_groups();
  EXPECT_FALSE(group.ok());
  registry.reset();
}

}  // namespace
}  // namespace vemesh
