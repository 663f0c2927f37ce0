// Issue 45: queries of a named mesh from 6 threads while the main thread
// replaces and resets it 100 times, and re-initialises the default mesh.
// Run under TSan in CI. Every answer of the named mesh belongs wholly to one
// of its two shapes (or says it is not initialised now, naming the meshes);
// the default mesh's answers never change while the named one does.
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace vemesh {
namespace {

TEST(RegistryNamedThreadsTest, QueriesDuringReplaceAndResetSeeWholeMeshes) {
  VeDeviceMesh reg;
  // Default: PP=2, DP=2, TP=2. Experts: (PP, EP) = (2, 4) or (PP, EDP, EP)
  // = (2, 2, 2), meta (no communication).
  ASSERT_TRUE(reg.init_device_mesh("meta", {2, 2, 2}, {"PP", "DP", "TP"}).ok());
  InitOptions o;
  o.mesh_name = "experts";
  const std::vector<int64_t> a = {2, 4}, b = {2, 2, 2};
  const std::vector<std::string> an = {"PP", "EP"}, bn = {"PP", "EDP", "EP"};
  ASSERT_TRUE(reg.init_device_mesh("meta", a, an, o).ok());
  const MeshName experts("experts");
  std::atomic<bool> stop{false};
  std::atomic<int64_t> queries{0}, wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&] {
      while (!stop.load()) {
        auto ep = reg.get_role_size("EP", experts);
        if (ep.ok()) {
          if (*ep != 4 && *ep != 2) ++wrong;
        } else if (!absl::IsNotFound(ep.status())) {
          ++wrong;
        }
        // Rank 7: [1, 3] in a, [1, 1, 1] in b.
        auto c = reg.get_strategy_coordinate(7, experts);
        if (c.ok() && !((c->size() == 2 && (*c)[1] == 3) ||
                        (c->size() == 3 && (*c)[2] == 1))) {
          ++wrong;
        }
        // EP is never the default mesh's: an error naming the experts, or,
        // while they are reset, veScale's 1 for a role no mesh has.
        auto missing = reg.get_role_size("EP");
        if (missing.ok() ? *missing != 1
                         : !absl::IsFailedPrecondition(missing.status())) {
          ++wrong;
        }
        auto tp = reg.get_tensor_parallel_rank();
        if (!tp.ok()) ++wrong;
        ++queries;
      }
    });
  }
  for (int i = 0; i < 100; ++i) {
    if (i % 3 == 2) {
      reg.reset(experts);
    } else {
      ASSERT_TRUE(
          reg.init_device_mesh("meta", i % 2 ? a : b, i % 2 ? an : bn, o).ok());
    }
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (queries.load() < 1000 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  stop = true;
  for (auto& th : threads) th.join();
  EXPECT_GE(queries.load(), 1000);
  EXPECT_EQ(wrong.load(), 0);
  reg.reset_all();
  EXPECT_TRUE(reg.mesh_names().empty());
}

}  // namespace
}  // namespace vemesh
