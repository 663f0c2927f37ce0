// DeviceMesh::abort and shrink on MPI (this binary under mpirun, 4 ranks)
// and on Gloo (thread-ranks meeting in a MemoryStore, in every process):
//   * abort() aborts every group of the mesh, its children and its
//     flattenings at once: operations answer Aborted without waiting; it is
//     idempotent; flatten is then FailedPrecondition;
//   * shrink(dim, exclude) on the survivors only: the groups along `dim`
//     lose the excluded coordinates, the other groups are the same
//     communicators, and after abort() every group is rebuilt;
//   * bad input is InvalidArgument naming the value.
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job_world.h"
#include "vemesh/bootstrap/store_bootstrap.h"
#include "vemesh/mesh/device_mesh.h"
#include "vemesh/rendezvous/memory_store.h"

namespace vemesh {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start)
      .count();
}

// The sum over `group` of each member's global rank.
absl::StatusOr<int64_t> SumOfRanks(Communicator& group) {
  int64_t mine = group.global_rank();
  int64_t sum = 0;
  VEMESH_RETURN_IF_ERROR(
      group.all_reduce(&mine, &sum, 1, DataType::kInt64, ReduceOp::kSum));
  return sum;
}

// -- MPI ---------------------------------------------------------------------

bool FourRanks() { return vemesh::testing::JobSize() == 4; }

TEST(MeshAbortMpi, EveryGroupAndFlatteningFailsAtOnceAndAbortIsIdempotent) {
  if (!FourRanks()) GTEST_SKIP() << "needs 4 MPI ranks";
  auto mesh = init_device_mesh("cpu", {2, 2}, {"DP", "TP"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto flat = mesh->flatten({"DP", "TP"}, "DPTP");
  ASSERT_TRUE(flat.ok()) << flat.status();
  auto child = (*mesh)["TP"];
  ASSERT_TRUE(child.ok());
  ASSERT_TRUE(child->abort().ok());  // a child aborts its root's groups
  ASSERT_TRUE(mesh->abort().ok());   // again: nothing more happens
  const auto start = Clock::now();
  for (const char* dim : {"DP", "TP", "DPTP"}) {
    auto group = mesh->get_group(dim);
    ASSERT_TRUE(group.ok()) << group.status();
    EXPECT_TRUE((*group)->aborted()) << dim;
    absl::Status s = (*group)->barrier();
    EXPECT_TRUE(absl::IsAborted(s)) << dim << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("DeviceMesh::abort() was called"));
  }
  EXPECT_LT(MsSince(start), 1000);
  auto again = mesh->flatten({"DP", "TP"}, "DPTP2");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition)
      << again.status();
  EXPECT_EQ(MPI_Barrier(MPI_COMM_WORLD), MPI_SUCCESS);
}

TEST(MeshShrinkMpi, TheSurvivorsMakeASmallerDimensionWithoutTheLeavingRank) {
  if (!FourRanks()) GTEST_SKIP() << "needs 4 MPI ranks";
  const int rank = vemesh::testing::JobRank();
  auto mesh = init_device_mesh("cpu", {4}, {"DP"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  if (rank != 2) {  // rank 2 leaves (planned removal): it does not call
    auto smaller = mesh->shrink("DP", {2});
    ASSERT_TRUE(smaller.ok()) << smaller.status();
    EXPECT_THAT(smaller->mesh(), ElementsAre(0, 1, 3));
    EXPECT_EQ(smaller->global_rank(), rank);
    auto dp = smaller->get_group("DP");
    ASSERT_TRUE(dp.ok());
    EXPECT_EQ((*dp)->backend(), "mpi");
    EXPECT_THAT((*dp)->ranks(), ElementsAre(0, 1, 3));
    auto sum = SumOfRanks(**dp);
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, 0 + 1 + 3);
    // The old mesh is untouched.
    auto old = mesh->get_group("DP");
    EXPECT_FALSE((*old)->aborted());
  }
  EXPECT_EQ(MPI_Barrier(MPI_COMM_WORLD), MPI_SUCCESS);
}

TEST(MeshShrinkMpi, AfterAbortEveryDimensionIsRebuilt) {
  if (!FourRanks()) GTEST_SKIP() << "needs 4 MPI ranks";
  const int rank = vemesh::testing::JobRank();
  auto mesh = init_device_mesh("cpu", {2, 2}, {"DP", "TP"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto old_tp = mesh->get_group("TP");
  ASSERT_TRUE(mesh->abort().ok());
  if (rank < 2) {  // DP coordinate 1 (ranks 2, 3) leaves
    auto smaller = mesh->shrink("DP", {1});
    ASSERT_TRUE(smaller.ok()) << smaller.status();
    EXPECT_THAT(smaller->shape(), ElementsAre(1, 2));
    auto tp = smaller->get_group("TP");
    ASSERT_TRUE(tp.ok());
    EXPECT_NE(tp->get(), old_tp->get());  // rebuilt, not the aborted one
    auto sum = SumOfRanks(**tp);
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, 0 + 1);
  }
  EXPECT_EQ(MPI_Barrier(MPI_COMM_WORLD), MPI_SUCCESS);
}

// -- Gloo, thread-ranks
// --------------------------------------------------------

constexpr absl::Duration kTimeout = absl::Seconds(30);

void OnThreads(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (std::thread& t : threads) t.join();
}

absl::StatusOr<DeviceMesh> GlooMesh(std::shared_ptr<MemoryStore> store,
                                    int rank, std::vector<int64_t> shape,
                                    std::vector<std::string> names,
                                    absl::Duration timeout = kTimeout) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  VEMESH_ASSIGN_OR_RETURN(MeshLayout layout, MeshLayout::Create(shape, names));
  MeshOptions options;
  options.backend = "gloo";
  options.timeout = timeout;
  options.bootstrap = std::make_shared<StoreBootstrap>(
      std::move(store), rank, static_cast<int>(n), "job");
  return DeviceMesh::Create(DeviceType::kCpu, layout, options);
}

TEST(MeshAbortGloo, EveryGroupAndFlatteningFailsAtOnce) {
  auto store = std::make_shared<MemoryStore>();
  OnThreads(4, [&](int r) {
    auto mesh = GlooMesh(store, r, {2, 2}, {"DP", "TP"});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    auto flat = mesh->flatten({"DP", "TP"}, "DPTP");
    ASSERT_TRUE(flat.ok()) << flat.status();
    EXPECT_EQ((*flat)->backend(), "gloo");
    ASSERT_TRUE(mesh->abort().ok());
    ASSERT_TRUE(mesh->abort().ok());
    const auto start = Clock::now();
    for (const char* dim : {"DP", "TP", "DPTP"}) {
      auto group = mesh->get_group(dim);
      ASSERT_TRUE(group.ok());
      absl::Status s = (*group)->barrier();
      EXPECT_TRUE(absl::IsAborted(s)) << dim << ": " << s;
    }
    EXPECT_LT(MsSince(start), 1000);
  });
}

// Gloo cannot interrupt a wait inside its collectives: abort() closes the
// connections (peers fail at once) and the blocked collective returns
// Aborted at the latest at the Gloo timeout (MeshOptions::timeout, 3 s
// here), never hangs.
TEST(MeshAbortGloo, ABlockedCollectiveReturnsAbortedByTheGlooTimeout) {
  auto store = std::make_shared<MemoryStore>();
  std::atomic<bool> checked{false};
  OnThreads(2, [&](int r) {
    auto mesh = GlooMesh(store, r, {2}, {"DP"}, absl::Seconds(3));
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    if (r == 1) {  // alive, connected, never joins the all_reduce
      while (!checked.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return;
    }
    auto dp = *mesh->get_group("DP");
    int64_t x = 1;
    auto work = dp->iall_reduce(&x, &x, 1, DataType::kInt64, ReduceOp::kSum);
    ASSERT_TRUE(work.ok()) << work.status();
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      ASSERT_TRUE(mesh->abort().ok());
    });
    const auto start = Clock::now();
    absl::Status s = (*work)->wait();
    const double ms = MsSince(start);
    aborter.join();
    checked.store(true);
    EXPECT_TRUE(absl::IsAborted(s)) << s;
    EXPECT_LT(ms, 3000 + 2000) << s;
  });
}

TEST(MeshShrinkGloo, OneCoordinateLeavesTheOtherGroupsStay) {
  auto store = std::make_shared<MemoryStore>();
  OnThreads(6, [&](int r) {
    // DP=3 x TP=2: ranks 2, 3 are DP coordinate 1.
    auto mesh = GlooMesh(store, r, {3, 2}, {"DP", "TP"});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    if (r == 2 || r == 3) return;  // leaving: they do not call
    auto old_tp = mesh->get_group("TP");
    auto smaller = mesh->shrink("DP", {1});
    ASSERT_TRUE(smaller.ok()) << smaller.status();
    EXPECT_THAT(smaller->mesh(), ElementsAre(0, 1, 4, 5));
    EXPECT_THAT(smaller->shape(), ElementsAre(2, 2));
    auto tp = smaller->get_group("TP");
    EXPECT_EQ(tp->get(), old_tp->get());  // the same communicator
    auto dp = smaller->get_group("DP");
    ASSERT_TRUE(dp.ok());
    EXPECT_EQ((*dp)->backend(), "gloo");
    auto sum = SumOfRanks(**dp);
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, r % 2 == 0 ? 0 + 4 : 1 + 5);
    // The shrunk mesh has no world to flatten over.
    EXPECT_EQ(smaller->flatten({"DP", "TP"}).status().code(),
              absl::StatusCode::kFailedPrecondition);
  });
}

TEST(MeshShrinkGloo, AfterAbortEveryDimensionIsRebuilt) {
  auto store = std::make_shared<MemoryStore>();
  OnThreads(4, [&](int r) {
    auto mesh = GlooMesh(store, r, {2, 2}, {"DP", "TP"});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    ASSERT_TRUE(mesh->abort().ok());
    if (r >= 2) return;  // DP coordinate 1 leaves
    auto smaller = mesh->shrink("DP", {1});
    ASSERT_TRUE(smaller.ok()) << smaller.status();
    auto tp = smaller->get_group("TP");
    ASSERT_TRUE(tp.ok());
    EXPECT_FALSE((*tp)->aborted());
    auto sum = SumOfRanks(**tp);
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, 0 + 1);
  });
}

TEST(MeshShrinkGloo, AKeptGroupAbortedAloneIsFailedPrecondition) {
  auto store = std::make_shared<MemoryStore>();
  OnThreads(4, [&](int r) {
    auto mesh = GlooMesh(store, r, {2, 2}, {"DP", "TP"});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    if (r != 0) return;
    (*mesh->get_group("TP"))->abort("a timeout");
    auto smaller = mesh->shrink("DP", {1});
    EXPECT_EQ(smaller.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(smaller.status().message(), HasSubstr("call abort()"));
  });
}

TEST(MeshShrinkGloo, BadInputIsInvalidArgumentNamingTheValue) {
  auto store = std::make_shared<MemoryStore>();
  OnThreads(2, [&](int r) {
    auto mesh = GlooMesh(store, r, {2}, {"DP"});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    auto check = [&](absl::string_view dim, std::vector<int64_t> exclude,
                     absl::string_view says) {
      auto s = mesh->shrink(dim, exclude).status();
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_THAT(s.message(), HasSubstr(says));
    };
    check("EP", {0}, "'EP'");
    check("DP", {5}, "coordinate 5");
    check("DP", {-1}, "coordinate -1");
    check("DP", {0, 1}, "excluding all 2");
    check("DP", {r}, absl::StrCat("coordinate ", r, ", which exclude names"));
  });
}

TEST(MeshShrinkMeta, AMetaMeshShrinksItsLayout) {
  auto layout = MeshLayout::Create({3, 2}, {"DP", "TP"});
  ASSERT_TRUE(layout.ok());
  DeviceMesh meta = DeviceMesh::Meta(*layout, 0);
  auto smaller = meta.shrink("DP", {2});
  ASSERT_TRUE(smaller.ok()) << smaller.status();
  EXPECT_THAT(smaller->mesh(), ElementsAre(0, 1, 2, 3));
  ASSERT_TRUE(meta.abort().ok());
}

}  // namespace
}  // namespace vemesh
