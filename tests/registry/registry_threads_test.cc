// Queries from 8 threads while the main thread re-initialises the registry
// 100 times. Run under TSan in CI. Every answer must belong wholly to one of
// the two meshes, never to a mix.
#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace vemesh {
namespace {

TEST(RegistryThreadsTest, QueriesDuringReinitSeeWholeMeshes) {
  VeDeviceMesh reg;
  // Mesh A: (2, 4) DP x TP. Mesh B: (2, 2, 2) PP x DP x TP.
  const std::vector<int64_t> a = {2, 4}, b = {2, 2, 2};
  ASSERT_TRUE(reg.init_device_mesh("meta", a).ok());
  std::atomic<bool> stop{false};
  std::atomic<int64_t> queries{0}, mixed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      while (!stop.load()) {
        auto mesh = reg.get();
        if (!mesh.ok()) {
          ++mixed;
          continue;
        }
        const auto shape = mesh->shape();
        const auto names = mesh->mesh_dim_names();
        const bool is_a = shape == a && names.size() == 2;
        const bool is_b = shape == b && names.size() == 3 && names[0] == "PP";
        if (!is_a && !is_b) ++mixed;
        // Rank 7 is [1,3] in A and [1,1,1] in B.
        auto c = reg.get_strategy_coordinate(7);
        if (!c.ok() || !((c->size() == 2 && (*c)[1] == 3) ||
                         (c->size() == 3 && (*c)[2] == 1))) {
          ++mixed;
        }
        auto tp = reg.get_strategy_size("TP");
        if (!tp.ok() || (*tp != 4 && *tp != 2)) ++mixed;
        auto peer = reg.get_next_stage_peer();
        if (!peer.ok()) ++mixed;
        if (t % 2 == 0) {
          auto row = reg["TP"];
          if (!row.ok() || (row->size() != 4 && row->size() != 2)) ++mixed;
        }
        ++queries;
      }
    });
  }
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(reg.init_device_mesh("meta", i % 2 ? a : b).ok());
  }
  // Let the readers run against the final mesh too.
  while (queries.load() < 1000) std::this_thread::yield();
  stop = true;
  for (auto& th : threads) th.join();
  EXPECT_EQ(mixed.load(), 0);
  EXPECT_GE(queries.load(), 1000);
}

}  // namespace
}  // namespace vemesh
