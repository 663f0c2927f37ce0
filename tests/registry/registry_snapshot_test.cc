// Every registry query, from several threads, while another thread re-inits
// the registry over and over, alternating two meshes of the same 8-rank
// world. Each answer must be the answer of one of the two meshes: a query
// that read the registry twice (is_last_stage read the stage and the stage
// count separately) could mix them. Run under TSan too.
//
// The meshes are meta meshes with reversed rank lists, so this process
// (rank 0) sits on the last pipeline stage of both, at different places:
//   A: PP=2 x TP=4, rank 0 at [1, 3]     B: PP=4 x TP=2, rank 0 at [3, 1]
// A mix of the two (A's stage 1 against B's 4 stages) answers false.
#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace vemesh {
namespace {

// Answers as text: equal text, equal answer.
std::string Text(const DeviceMesh& m) {
  return absl::StrCat("mesh[", absl::StrJoin(m.shape(), ","), "|",
                      absl::StrJoin(m.mesh_dim_names(), ","), "|",
                      absl::StrJoin(m.mesh(), ","), "]");
}
std::string Text(int64_t v) { return absl::StrCat(v); }
std::string Text(bool v) { return v ? "true" : "false"; }
std::string Text(const Coordinate& c) { return absl::StrJoin(c, ","); }
std::string Text(const std::vector<int64_t>& v) {
  return absl::StrJoin(v, ",");
}
std::string Text(const std::vector<std::string>& v) {
  return absl::StrJoin(v, ",");
}
std::string Text(DeviceType t) { return std::string(DeviceTypeName(t)); }
std::string Text(const std::vector<DeviceMesh>& v) {
  std::string out;
  for (const DeviceMesh& m : v) out += Text(m);
  return out;
}
std::string Text(const std::shared_ptr<Communicator>& c) {
  return c == nullptr ? "null" : absl::StrCat(c->size());
}
std::string Text(const std::optional<int64_t>& v) {
  return v ? Text(*v) : "none";
}
std::string Text(const std::optional<StageNeighbor>& v) {
  return v ? absl::StrCat(v->stage, "/", v->peer, "/", Text(v->mesh)) : "none";
}
template <typename T>
std::string Text(const absl::StatusOr<T>& r) {
  if (!r.ok())
    return absl::StrCat("error ", absl::StatusCodeToString(r.status().code()));
  return Text(*r);
}

using Query = std::function<std::string(const VeDeviceMesh&)>;

// Every query of VeDeviceMesh (its public const methods).
std::vector<Query> EveryQuery() {
  const std::vector<std::string> tp = {"TP"};
  return {
      [](const VeDeviceMesh& r) { return Text(r.get()); },
      [](const VeDeviceMesh& r) { return Text(r["TP"]); },
      [tp](const VeDeviceMesh& r) { return Text(r.get_submesh(tp)); },
      [](const VeDeviceMesh& r) { return Text(r.get_strategy_size("TP")); },
      [](const VeDeviceMesh& r) {
        return Text(r.get_strategy_size(int64_t{0}));
      },
      [](const VeDeviceMesh& r) { return Text(r.get_strategy_coordinate()); },
      [](const VeDeviceMesh& r) { return Text(r.get_strategy_coordinate(5)); },
      [](const VeDeviceMesh& r) { return Text(r.lookup_rank("PP")); },
      [](const VeDeviceMesh& r) { return Text(r.lookup_rank(int64_t{1})); },
      [](const VeDeviceMesh& r) {
        return Text(r.get_global_rank({1, 1}));
      },
      [](const VeDeviceMesh& r) { return Text(r.get_rank()); },
      [](const VeDeviceMesh& r) { return Text(r.get_local_rank()); },
      [](const VeDeviceMesh& r) { return Text(r.get_coordinate()); },
      [](const VeDeviceMesh& r) { return Text(r.size()); },
      [](const VeDeviceMesh& r) { return Text(r.size("PP")); },
      [](const VeDeviceMesh& r) { return Text(r.ndim()); },
      [](const VeDeviceMesh& r) { return Text(r.shape()); },
      [](const VeDeviceMesh& r) { return Text(r.mesh_dim_names()); },
      [](const VeDeviceMesh& r) { return Text(r.device_type()); },
      [](const VeDeviceMesh& r) { return Text(r.get_role_size("PP")); },
      [](const VeDeviceMesh& r) { return Text(r.get_role_rank("TP")); },
      [](const VeDeviceMesh& r) { return Text(r.get_role_mesh("PP")); },
      [](const VeDeviceMesh& r) { return Text(r.get_role_dim_groups("TP")); },
      [](const VeDeviceMesh& r) {
        return Text(r.get_global_role_meshes("PP"));
      },
      [](const VeDeviceMesh& r) {
        return Text(r.get_pipeline_parallel_rank());
      },
      [](const VeDeviceMesh& r) { return Text(r.get_data_parallel_rank()); },
      [](const VeDeviceMesh& r) { return Text(r.get_tensor_parallel_rank()); },
      [](const VeDeviceMesh& r) {
        return Text(r.get_pipeline_parallel_mesh());
      },
      [](const VeDeviceMesh& r) { return Text(r.get_data_parallel_mesh()); },
      [](const VeDeviceMesh& r) { return Text(r.get_tensor_parallel_mesh()); },
      [](const VeDeviceMesh& r) {
        return Text(r.get_pipeline_parallel_dim_groups());
      },
      [](const VeDeviceMesh& r) {
        return Text(r.get_data_parallel_dim_groups());
      },
      [](const VeDeviceMesh& r) {
        return Text(r.get_tensor_parallel_dim_groups());
      },
      [](const VeDeviceMesh& r) {
        return Text(r.get_global_tensor_parallel_meshes());
      },
      [](const VeDeviceMesh& r) {
        return Text(r.get_global_pipeline_parallel_meshes());
      },
      [](const VeDeviceMesh& r) { return Text(r.is_first_stage()); },
      [](const VeDeviceMesh& r) { return Text(r.is_last_stage()); },
      [](const VeDeviceMesh& r) { return Text(r.get_prev_stage()); },
      [](const VeDeviceMesh& r) { return Text(r.get_next_stage(true)); },
      [](const VeDeviceMesh& r) { return Text(r.get_prev_stage_peer()); },
      [](const VeDeviceMesh& r) { return Text(r.get_next_stage_peer(true)); },
      [](const VeDeviceMesh& r) { return Text(r.is_initialized()); },
  };
}

std::vector<int64_t> Reversed(int n) {
  std::vector<int64_t> out;
  for (int i = n - 1; i >= 0; --i) out.push_back(i);
  return out;
}

absl::Status InitA(VeDeviceMesh& r) {
  InitOptions o;
  o.mesh.ranks = Reversed(8);
  return r.init_device_mesh("meta", {2, 4}, {"PP", "TP"}, o).status();
}
absl::Status InitB(VeDeviceMesh& r) {
  InitOptions o;
  o.mesh.ranks = Reversed(8);
  return r.init_device_mesh("meta", {4, 2}, {"PP", "TP"}, o).status();
}

TEST(RegistrySnapshotTest, EveryQueryAnswersFromOneMeshDuringReinits) {
  const std::vector<Query> queries = EveryQuery();
  // The answers of each mesh alone.
  std::vector<std::string> a, b;
  {
    VeDeviceMesh ra, rb;
    ASSERT_TRUE(InitA(ra).ok());
    ASSERT_TRUE(InitB(rb).ok());
    ASSERT_EQ(*ra.get_rank(), 0) << "the test expects this process as rank 0";
    for (const Query& q : queries) {
      a.push_back(q(ra));
      b.push_back(q(rb));
    }
    // The case of the report: both say true, a mix says false.
    EXPECT_TRUE(*ra.is_last_stage());
    EXPECT_TRUE(*rb.is_last_stage());
  }

  VeDeviceMesh reg;
  ASSERT_TRUE(InitA(reg).ok());
  std::atomic<bool> stop{false};
  std::atomic<int64_t> answers{0};
  std::vector<std::vector<std::string>> wrong(4);
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&, t] {
      while (!stop.load()) {
        for (size_t i = 0; i < queries.size(); ++i) {
          const std::string got = queries[i](reg);
          if (got != a[i] && got != b[i] && wrong[t].size() < 10) {
            wrong[t].push_back(absl::StrCat("query ", i, ": ", got,
                                            " (A: ", a[i], ", B: ", b[i], ")"));
          }
          answers.fetch_add(1, std::memory_order_relaxed);
        }
      }
    });
  }
  // Bounded in re-inits and in time (TSan is ~10x slower).
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(8);
  int reinits = 0;
  bool init_failed = false;
  for (; reinits < 20000 && std::chrono::steady_clock::now() < deadline;
       ++reinits) {
    // Not ASSERT: the readers must be joined before the test returns.
    if (!(reinits % 2 ? InitA(reg) : InitB(reg)).ok()) {
      init_failed = true;
      break;
    }
  }
  stop = true;
  for (auto& th : readers) th.join();
  EXPECT_FALSE(init_failed) << "a re-init failed";
  for (const auto& w : wrong) {
    for (const std::string& line : w) ADD_FAILURE() << line;
  }
  EXPECT_GE(reinits, 100);
  EXPECT_GT(answers.load(), 0);
  std::printf("%d re-inits, %lld answers\n", reinits,
              static_cast<long long>(answers.load()));
}

// Re-init and reset from several threads at once, readers meanwhile: the
// registry frees each replaced state exactly once (ASan / TSan watch).
TEST(RegistrySnapshotTest, ConcurrentReinitsAndResetsWithReaders) {
  VeDeviceMesh reg;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      while (!stop.load()) {
        auto last = reg.is_last_stage();
        if (last.ok()) {
          EXPECT_TRUE(*last);
        }
      }
    });
  }
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) {
        if ((i + t) % 3 == 0) {
          reg.reset();
        } else {
          EXPECT_TRUE((i % 2 ? InitA(reg) : InitB(reg)).ok());
        }
      }
    });
  }
  threads[3].join();
  threads[2].join();
  stop = true;
  threads[1].join();
  threads[0].join();
}

}  // namespace
}  // namespace vemesh
