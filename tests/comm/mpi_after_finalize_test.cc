// An MPI communicator used after the program called MPI_Finalize: Open MPI
// would abort the process; vemesh answers FailedPrecondition saying MPI was
// finalised, as communicator.h promises. Own main(): it finalises MPI
// before the tests run, which the shared test main would not tolerate.
#include <mpi.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/bootstrap/bootstrap_over.h"
#include "vemesh/comm/mpi/mpi_communicator.h"
#include "vemesh/comm/mpi/mpi_environment.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace vemesh {
namespace {

using ::testing::HasSubstr;

// Made while MPI ran, used after MPI_Finalize.
std::shared_ptr<MpiCommunicator> g_world;
std::shared_ptr<Communicator> g_split;
std::shared_ptr<Communicator> g_registry_tp;

void ExpectFinalised(const absl::Status& s, const std::string& op) {
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << op << ": " << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("finalised")) << op;
  EXPECT_THAT(std::string(s.message()), HasSubstr(op));
}

void ExpectEveryOpRefused(Communicator& c) {
  std::vector<double> a(2, 1.0), b(2 * c.size(), 0.0);
  ExpectFinalised(c.barrier(), "barrier");
  ExpectFinalised(c.broadcast(absl::MakeSpan(a), 0), "broadcast");
  ExpectFinalised(c.all_reduce(absl::MakeSpan(a), ReduceOp::kSum),
                  "all_reduce");
  ExpectFinalised(c.all_gather(absl::MakeConstSpan(a), absl::MakeSpan(b)),
                  "all_gather");
  ExpectFinalised(c.reduce_scatter(absl::MakeConstSpan(b), absl::MakeSpan(a),
                                   ReduceOp::kSum),
                  "reduce_scatter");
  ExpectFinalised(c.send(absl::MakeConstSpan(a), 0), "send");
  ExpectFinalised(c.recv(absl::MakeSpan(a), 0), "recv");
  ExpectFinalised(c.send_recv(absl::MakeConstSpan(a), 0, absl::MakeSpan(a), 0),
                  "send_recv");
  ExpectFinalised(c.split(0, 0).status(), "split");
  ExpectFinalised(MakeBootstrapOver(c, absl::Now() + absl::Seconds(1)).status(),
                  "MakeBootstrapOver");
}

TEST(MpiAfterFinalizeTest, MpiIsFinalised) { EXPECT_FALSE(MpiIsUsable()); }

TEST(MpiAfterFinalizeTest, WorldOpsAreFailedPrecondition) {
  ASSERT_NE(g_world, nullptr);
  ExpectEveryOpRefused(*g_world);
}

TEST(MpiAfterFinalizeTest, SplitOpsAreFailedPrecondition) {
  ASSERT_NE(g_split, nullptr);
  ExpectEveryOpRefused(*g_split);
}

TEST(MpiAfterFinalizeTest, RegistryCommunicatorOpsAreFailedPrecondition) {
  ASSERT_NE(g_registry_tp, nullptr);
  ExpectEveryOpRefused(*g_registry_tp);
  // The registry's queries call no MPI: they still answer.
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_strategy_size("TP"), 1);
  auto again = VESCALE_DEVICE_MESH.get_tensor_parallel_dim_groups();
  ASSERT_TRUE(again.ok());
  ExpectFinalised((*again)->barrier(), "barrier");
}

TEST(MpiAfterFinalizeTest, LettingGoAfterFinalizeFreesNothingAndDoesNotAbort) {
  g_split.reset();
  g_world.reset();
  g_registry_tp.reset();
  VESCALE_DEVICE_MESH.reset();
  SUCCEED();
}

}  // namespace
}  // namespace vemesh

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // The program owns MPI: vemesh adopts it and leaves finalising to it.
  if (MPI_Init(&argc, &argv) != MPI_SUCCESS) return 1;
  auto world = vemesh::MpiCommunicator::World();
  if (!world.ok()) {
    std::fprintf(stderr, "%s\n", world.status().ToString().c_str());
    return 1;
  }
  vemesh::g_world = *world;
  auto split = (*world)->split(0, 0);
  auto mesh = VESCALE_DEVICE_MESH.init_device_mesh("cpu", {1}, {"TP"});
  auto tp = VESCALE_DEVICE_MESH.get_tensor_parallel_dim_groups();
  if (!split.ok() || !mesh.ok() || !tp.ok()) {
    std::fprintf(stderr, "setup failed\n");
    return 1;
  }
  vemesh::g_split = *split;
  vemesh::g_registry_tp = *tp;
  MPI_Finalize();
  return RUN_ALL_TESTS();
}
