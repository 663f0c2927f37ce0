// The strategies ask VESCALE_DEVICE_MESH for their groups on every call: a
// re-init with another shape moves them to the new groups, and a TP layer
// cut for the old shape refuses to run instead of computing garbage.
#include <vector>

#include "gtest/gtest.h"
#include "strategies_test_util.h"
#include "vemesh/strategies/column_parallel_linear.h"
#include "vemesh/strategies/data_parallel.h"
#include "vemesh/strategies/linear.h"
#include "vemesh/strategies/pipeline_runner.h"

namespace vemesh::strategies {
namespace {

using testing::Close;
using testing::Deterministic;
using testing::InitMesh;
using testing::WorldRank;
using testing::WorldSize;

// Averages a gradient holding this rank's number; returns the result and
// the group size the module used.
std::pair<double, int> AverageRank(DataParallel& dp) {
  Parameter p("p", Matrix::Zero(1, 1));
  p.grad(0, 0) = WorldRank();
  std::vector<Parameter*> ps{&p};
  absl::StatusOr<BucketStats> st = dp.AverageGradients(ps);
  EXPECT_TRUE(st.ok()) << st.status();
  return {p.grad(0, 0), st.ok() ? st->dp_size : -1};
}

double MeanOf(const std::vector<int64_t>& ranks) {
  double s = 0;
  for (int64_t r : ranks) s += static_cast<double>(r);
  return s / static_cast<double>(ranks.size());
}

TEST(RegistryFollowTest, DataParallelUsesTheNewDpGroupAfterReinit) {
  const int n = WorldSize();
  DataParallel dp;  // built once, used across both meshes

  ASSERT_TRUE(InitMesh({n}, {"DP"}));
  auto [mean, size] = AverageRank(dp);
  EXPECT_EQ(size, n);
  EXPECT_DOUBLE_EQ(mean, (n - 1) / 2.0);

  if (n < 2) GTEST_SKIP() << "re-init to a different DP group needs 2 ranks";
  // Now DP is the fast dimension: groups {0,1}, {2,3}, ...
  ASSERT_TRUE(InitMesh({n / 2, 2}, {"PP", "DP"}));
  std::tie(mean, size) = AverageRank(dp);
  EXPECT_EQ(size, 2);
  EXPECT_DOUBLE_EQ(
      mean, MeanOf((*VESCALE_DEVICE_MESH.get_data_parallel_mesh()).mesh()));
  EXPECT_DOUBLE_EQ(mean, (WorldRank() / 2) * 2 + 0.5);
}

TEST(RegistryFollowTest, PipelineUsesTheNewStagesAfterReinit) {
  const int n = WorldSize();
  // A stage that passes its input through; only the stage count matters.
  class Identity : public PipelineStageModel {
   public:
    int64_t InputRows(int) const override { return 1; }
    int64_t InputCols() const override { return 2; }
    absl::StatusOr<Matrix> FirstStageInput(int) override {
      return Matrix::Ones(1, 2);
    }
    absl::StatusOr<Matrix> Forward(int, const Matrix& in) override {
      return in;
    }
    absl::StatusOr<Matrix> LossGradient(int, const Matrix& out) override {
      return out;
    }
    absl::StatusOr<Matrix> Backward(int, const Matrix& g, bool) override {
      return g;
    }
  } model;
  ASSERT_TRUE(InitMesh({n}, {"PP"}));
  absl::StatusOr<PipelineStats> st =
      RunPipeline(model, {.num_micro_batches = 2});
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->num_stages, n);
  EXPECT_EQ(st->stage, WorldRank());

  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  ASSERT_TRUE(InitMesh({2, n / 2}, {"PP", "TP"}));
  st = RunPipeline(model, {.num_micro_batches = 2});
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->num_stages, 2);
  EXPECT_EQ(st->stage, WorldRank() / (n / 2));
}

TEST(RegistryFollowTest, TensorParallelLayerRefusesAStaleSplit) {
  const int n = WorldSize();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  ASSERT_TRUE(InitMesh({n}, {"TP"}));
  const Matrix w = Deterministic(4, 8 * n, 1), b = Deterministic(1, 8 * n, 2);
  absl::StatusOr<ColumnParallelLinear> fc =
      ColumnParallelLinear::Create("fc", w, b);
  ASSERT_TRUE(fc.ok()) << fc.status();
  ASSERT_TRUE(fc->Forward(Deterministic(2, 4, 3)).ok());

  ASSERT_TRUE(InitMesh({n / 2, 2}, {"DP", "TP"}));
  if (n == 2) {
    // Same TP size and ranks: still valid, and it runs on the new group.
    EXPECT_TRUE(fc->Forward(Deterministic(2, 4, 3)).ok());
  } else {
    absl::StatusOr<Matrix> stale = fc->Forward(Deterministic(2, 4, 3));
    ASSERT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition)
        << stale.status();
    EXPECT_NE(stale.status().message().find("now has TP=2"), std::string::npos);
    // Rebuilt from the registry, it works and matches the serial layer.
    absl::StatusOr<ColumnParallelLinear> fresh =
        ColumnParallelLinear::Create("fc", w, b, {.gather_output = true});
    ASSERT_TRUE(fresh.ok());
    EXPECT_EQ(fresh->shard().tp_size(), 2);
    absl::StatusOr<Matrix> y = fresh->Forward(Deterministic(2, 4, 3));
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_TRUE(Close(*y, Linear("ref", w, b).Forward(Deterministic(2, 4, 3))));
  }
}

}  // namespace
}  // namespace vemesh::strategies
