// The registry and MPI communicators in a program that initialised MPI with
// MPI_THREAD_FUNNELED: only the main thread may call MPI. vemesh must
//   * refuse MPI work asked from another thread (FailedPrecondition naming
//     the level) instead of calling MPI there;
//   * free a replaced mesh's communicators on the thread that reset, not on
//     an idle worker that once queried the registry.
// Own main(): the shared test main asks for MPI_THREAD_MULTIPLE.
#include <mpi.h>

#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/comm/mpi/mpi_environment.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace vemesh {
namespace {

using ::testing::HasSubstr;

int WorldSize() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// Runs `f` on a new thread and waits for it.
template <typename F>
void OnWorker(F f) {
  std::thread t(f);
  t.join();
}

TEST(RegistryFunneledTest, TheProgramChoseFunneled) {
  EXPECT_EQ(MpiThreadLevel(), MPI_THREAD_FUNNELED);
  EXPECT_TRUE(CheckMpiThread("main").ok());
}

TEST(RegistryFunneledTest, InitFromAWorkerThreadIsRefusedBeforeMpi) {
  VeDeviceMesh reg;
  absl::Status status;
  OnWorker(
      [&] { status = reg.init_device_mesh("cpu", {WorldSize()}).status(); });
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("MPI_THREAD_FUNNELED"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("init_device_mesh"));
  EXPECT_FALSE(reg.is_initialized());
  // A meta mesh needs no MPI: allowed anywhere.
  OnWorker([&] { status = reg.init_device_mesh("meta", {2, 2}).status(); });
  EXPECT_TRUE(status.ok()) << status;
}

TEST(RegistryFunneledTest, CommunicatorOpsFromAWorkerAreRefused) {
  VeDeviceMesh reg;
  ASSERT_TRUE(reg.init_device_mesh("cpu", {WorldSize()}, {"TP"}).ok());
  auto tp = reg.get_tensor_parallel_dim_groups();  // a query: any thread
  ASSERT_TRUE(tp.ok()) << tp.status();
  absl::Status status;
  int64_t x = 1;
  OnWorker([&] {
    status = (*tp)->all_reduce(absl::MakeSpan(&x, 1), ReduceOp::kSum);
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("all_reduce"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("MPI_THREAD_FUNNELED"));
  OnWorker([&] { status = (*tp)->split(0, 0).status(); });
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  // The main thread may.
  EXPECT_TRUE((*tp)->all_reduce(absl::MakeSpan(&x, 1), ReduceOp::kSum).ok());
  EXPECT_EQ(x, WorldSize());
  tp->reset();
  reg.reset();
}

TEST(RegistryFunneledTest, ResetFreesCommunicatorsOnTheResettingThread) {
  const int64_t before = LiveCommunicatorCount();
  VeDeviceMesh reg;
  ASSERT_TRUE(reg.init_device_mesh("cpu", {1, WorldSize()}, {"DP", "TP"}).ok());
  EXPECT_GT(LiveCommunicatorCount(), before);

  // A worker queries (taking and dropping a communicator), then stays idle
  // and alive until told to go.
  std::mutex mu;
  std::condition_variable cv;
  bool queried = false, go = false;
  std::thread worker([&] {
    EXPECT_TRUE(reg.get_tensor_parallel_dim_groups().ok());
    EXPECT_TRUE(*reg.is_last_stage());
    EXPECT_TRUE(reg.get_data_parallel_mesh().ok());
    std::unique_lock<std::mutex> lock(mu);
    queried = true;
    cv.notify_all();
    cv.wait(lock, [&] { return go; });
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return queried; });
  }
  // The idle worker holds nothing: the reset frees every communicator now,
  // here, on the main thread.
  reg.reset();
  EXPECT_EQ(LiveCommunicatorCount(), before);
  {
    std::lock_guard<std::mutex> lock(mu);
    go = true;
  }
  cv.notify_all();
  worker.join();
  EXPECT_EQ(LiveCommunicatorCount(), before);
}

TEST(RegistryFunneledTest, ResetFromAWorkerLeavesTheFreeToTheMainThread) {
  const int64_t before = LiveCommunicatorCount();
  VeDeviceMesh reg;
  ASSERT_TRUE(reg.init_device_mesh("cpu", {WorldSize()}, {"TP"}).ok());
  OnWorker([&] { reg.reset(); });
  // Forgotten at once...
  EXPECT_FALSE(reg.is_initialized());
  EXPECT_EQ(reg.get_strategy_size("TP").status().code(),
            absl::StatusCode::kFailedPrecondition);
  // ...but its communicators wait for a thread that may free them.
  EXPECT_GT(LiveCommunicatorCount(), before);
  reg.reset();
  EXPECT_EQ(LiveCommunicatorCount(), before);
}

}  // namespace
}  // namespace vemesh

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int provided = MPI_THREAD_SINGLE;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) !=
      MPI_SUCCESS) {
    std::fprintf(stderr, "MPI_Init_thread failed\n");
    return 1;
  }
  if (provided != MPI_THREAD_FUNNELED) {
    std::fprintf(stderr, "MPI granted thread level %d, not FUNNELED\n",
                 provided);
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    // Rank 0 prints the report; the others only their failures.
    delete ::testing::UnitTest::GetInstance()->listeners().Release(
        ::testing::UnitTest::GetInstance()
            ->listeners()
            .default_result_printer());
  }
  int failed = RUN_ALL_TESTS();
  // The job fails when any rank failed.
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  VESCALE_DEVICE_MESH.reset();
  MPI_Finalize();
  return any;
}
