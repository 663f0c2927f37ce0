// flatten is collective and waits for the slowest rank; it must not make the
// mesh's other calls wait with it. Before: get_group waited 4.8 s behind a
// slow peer's flatten, because flatten held the mesh's lock through its
// collective. And a one-dimension flatten registers its name, so get_group
// finds it as the header promises.
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "job_world.h"
#include "vemesh/mesh/device_mesh.h"

namespace vemesh {
namespace {

using Clock = std::chrono::steady_clock;

TEST(FlattenLockTest, GetGroupDoesNotWaitForAFlattenInProgress) {
  const int rank = vemesh::testing::JobRank();
  const int world = vemesh::testing::JobSize();
  auto mesh = init_device_mesh("cpu", {2, world / 2}, {"DP", "TP"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();

  // Rank 0 flattens at once and waits for the others, who come 1.5 s late.
  // Meanwhile a thread of rank 0 asks for a group (no MPI in that call).
  std::atomic<bool> flattening{false};
  double worst_ms = 0;
  std::thread asker;
  if (rank == 0) {
    asker = std::thread([&] {
      while (!flattening.load()) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      for (int i = 0; i < 5; ++i) {
        const auto start = Clock::now();
        auto group = mesh->get_group("TP");
        const double ms =
            std::chrono::duration<double, std::milli>(Clock::now() - start)
                .count();
        EXPECT_TRUE(group.ok()) << group.status();
        worst_ms = std::max(worst_ms, ms);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  }
  flattening = true;
  const auto start = Clock::now();
  auto flat = mesh->flatten({"DP", "TP"}, "DPTP");
  const double flatten_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  if (rank == 0) asker.join();  // before any ASSERT can return
  ASSERT_TRUE(flat.ok()) << flat.status();
  if (rank == 0) {
    // The flatten really waited for the late ranks, the asker did not.
    EXPECT_GT(flatten_ms, 1000);
    EXPECT_LT(worst_ms, 200) << "get_group waited for the flatten";
  }
  EXPECT_EQ((*flat)->size(), world);
  auto by_name = mesh->get_group("DPTP");
  ASSERT_TRUE(by_name.ok()) << by_name.status();
  EXPECT_EQ(*by_name, *flat);
}

TEST(FlattenLockTest, AOneDimensionFlattenNameFindsItsGroup) {
  const int world = vemesh::testing::JobSize();
  auto mesh = init_device_mesh("cpu", {2, world / 2}, {"DP", "TP"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto flat = mesh->flatten({"TP"}, "tensor");
  ASSERT_TRUE(flat.ok()) << flat.status();
  auto tp = mesh->get_group("TP");
  ASSERT_TRUE(tp.ok());
  EXPECT_EQ(*flat, *tp);  // one dimension is that dimension's group
  auto by_name = mesh->get_group("tensor");
  ASSERT_TRUE(by_name.ok()) << by_name.status();
  EXPECT_EQ(*by_name, *tp);
  // From a child that holds TP too; not from one that does not.
  auto child = (*mesh)["TP"];
  ASSERT_TRUE(child.ok());
  auto from_child = child->get_group("tensor");
  ASSERT_TRUE(from_child.ok()) << from_child.status();
  EXPECT_EQ(*from_child, *tp);
  auto dp_child = (*mesh)["DP"];
  ASSERT_TRUE(dp_child.ok());
  EXPECT_EQ(dp_child->get_group("tensor").status().code(),
            absl::StatusCode::kNotFound);
  // Its own name needs no registering, and the name is now taken.
  EXPECT_TRUE(mesh->flatten({"TP"}).ok());
  EXPECT_EQ(mesh->flatten({"DP"}, "tensor").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vemesh
