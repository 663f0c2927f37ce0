// Backend is not device type: the backend of each dimension, chosen by the
// launcher or by MeshOptions, named in ToString(), and refused with a clear
// error where this job cannot use it. Runs under mpiexec (1, 2, 4 ranks).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job_world.h"
#include "vemesh/mesh/device_mesh.h"

namespace vemesh {
namespace {

using ::testing::HasSubstr;
using vemesh::testing::JobRank;
using vemesh::testing::JobSize;

// The sum of (global rank + 1) over `group`, checked against its members.
void ExpectSumOverGroup(Communicator& group) {
  int64_t value = group.global_rank() + 1;
  ASSERT_TRUE(group.all_reduce(absl::MakeSpan(&value, 1), ReduceOp::kSum).ok());
  int64_t expected = 0;
  for (int r : group.ranks()) expected += r + 1;
  EXPECT_EQ(value, expected);
}

TEST(Backend, MpiLauncherPicksMpiAndSaysWhy) {
  auto mesh = init_device_mesh("cpu", {JobSize()}, {"DP"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(*mesh->backend("DP"), "mpi");
  EXPECT_THAT(mesh->ToString(),
              HasSubstr("backend=mpi (OMPI_COMM_WORLD_SIZE is set (mpirun))"));
  ExpectSumOverGroup(**mesh->get_group("DP"));
}

TEST(Backend, GlooForEveryDimensionUnderMpirun) {
  if (JobSize() % 2 != 0) GTEST_SKIP() << "needs an even world";
  MeshOptions options;
  options.backend = "gloo";
  auto mesh =
      init_device_mesh("cpu", {2, JobSize() / 2}, {"DP", "TP"}, options);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  for (const char* dim : {"DP", "TP"}) {
    EXPECT_EQ(*mesh->backend(dim), "gloo");
    auto group = mesh->get_group(dim);
    ASSERT_TRUE(group.ok()) << group.status();
    EXPECT_EQ((*group)->backend(), "gloo");
    ExpectSumOverGroup(**group);
  }
  auto flat = mesh->flatten({"DP", "TP"});
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ((*flat)->backend(), "gloo");
  EXPECT_EQ((*flat)->size(), JobSize());
}

TEST(Backend, PerDimensionOverrideMixesBackends) {
  if (JobSize() % 2 != 0) GTEST_SKIP() << "needs an even world";
  MeshOptions options;
  options.backend_override = {{"DP", "gloo"}};
  auto mesh =
      init_device_mesh("cpu", {2, JobSize() / 2}, {"DP", "TP"}, options);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(*mesh->backend("DP"), "gloo");
  EXPECT_EQ(*mesh->backend("TP"), "mpi");
  EXPECT_EQ((*mesh->get_group("DP"))->backend(), "gloo");
  EXPECT_EQ((*mesh->get_group("TP"))->backend(), "mpi");
  EXPECT_THAT(mesh->ToString(), HasSubstr("backend=mpi [dim 0:gloo]"));
  ExpectSumOverGroup(**mesh->get_group("DP"));
  ExpectSumOverGroup(**mesh->get_group("TP"));
}

TEST(Backend, UnusableChoicesAreRefusedOnEveryRank) {
  MeshOptions unknown;
  unknown.backend = "ucc";
  auto mesh = init_device_mesh("cpu", {JobSize()}, {"DP"}, unknown);
  EXPECT_TRUE(absl::IsInvalidArgument(mesh.status())) << mesh.status();
  EXPECT_THAT(std::string(mesh.status().message()),
              HasSubstr("'ucc': expected 'mpi', 'gloo' or 'nccl'"));

  MeshOptions nccl_on_cpu;
  nccl_on_cpu.backend_override = {{"DP", "nccl"}};
  mesh = init_device_mesh("cpu", {JobSize()}, {"DP"}, nccl_on_cpu);
  EXPECT_TRUE(absl::IsFailedPrecondition(mesh.status())) << mesh.status();
  EXPECT_THAT(std::string(mesh.status().message()),
              HasSubstr("'nccl' needs device type 'cuda', not 'cpu'"));

  MeshOptions no_such_dim;
  no_such_dim.backend_override = {{"EP", "gloo"}};
  mesh = init_device_mesh("cpu", {JobSize()}, {"DP"}, no_such_dim);
  EXPECT_TRUE(absl::IsInvalidArgument(mesh.status())) << mesh.status();
  EXPECT_THAT(std::string(mesh.status().message()), HasSubstr("'EP'"));
}

TEST(Backend, TimeoutMustBePositive) {
  MeshOptions options;
  options.timeout = absl::ZeroDuration();
  auto mesh = init_device_mesh("cpu", {JobSize()}, {"DP"}, options);
  EXPECT_TRUE(absl::IsInvalidArgument(mesh.status())) << mesh.status();
  EXPECT_THAT(std::string(mesh.status().message()),
              HasSubstr("MeshOptions.timeout is 0: expected a positive"));
}

// Issue 29: an infinite timeout was accepted and every Gloo mesh then
// failed at once with "Timed out waiting 9223372036854775807ms".
TEST(Backend, AnInfiniteTimeoutIsRefusedAtOnce) {
  for (absl::Duration timeout : {absl::InfiniteDuration(), absl::Hours(25)}) {
    MeshOptions options;
    options.timeout = timeout;
    const absl::Time start = absl::Now();
    auto mesh = init_device_mesh("cpu", {JobSize()}, {"DP"}, options);
    EXPECT_TRUE(absl::IsInvalidArgument(mesh.status())) << mesh.status();
    EXPECT_THAT(std::string(mesh.status().message()),
                HasSubstr("MeshOptions.timeout is "));
    EXPECT_THAT(std::string(mesh.status().message()),
                HasSubstr("at most a day"));
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  }
}

TEST(Backend, AHugeMeshIsRefusedBeforeMemoryIsSpent) {
  const absl::Time start = absl::Now();
  auto mesh = init_device_mesh("cpu", {1000000, 1000000}, {"DP", "TP"});
  EXPECT_TRUE(absl::IsInvalidArgument(mesh.status())) << mesh.status();
  EXPECT_THAT(std::string(mesh.status().message()),
              HasSubstr(absl::StrCat(
                  "1000000000000 ranks but the world has only ", JobSize())));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
}

TEST(Backend, HostPlacementComesFromTheGatheredHostNames) {
  auto mesh = init_device_mesh("cpu", {JobSize()}, {"DP"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  // One host here: every rank is on it, in rank order.
  EXPECT_EQ(mesh->host_size(), JobSize());
  EXPECT_EQ(mesh->host_local_rank(), JobRank());
}

}  // namespace
}  // namespace vemesh
