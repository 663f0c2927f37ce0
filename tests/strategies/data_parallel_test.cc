// DataParallel: the broadcast from DP rank 0 and the bucketed gradient
// average, against values computed locally for every member of the group.
#include <vector>

#include "gtest/gtest.h"
#include "strategies_test_util.h"
#include "vemesh/strategies/data_parallel.h"

namespace vemesh::strategies {
namespace {

using testing::Close;
using testing::Deterministic;
using testing::InitMesh;
using testing::WorldRank;
using testing::WorldSize;

// Three parameters of awkward sizes (12 + 5 + 21 = 38 doubles), filled
// from `rank` so every rank can compute any other rank's values.
std::vector<Parameter> MakeParams(int rank) {
  std::vector<Parameter> ps;
  ps.emplace_back("a", Deterministic(3, 4, rank));
  ps.emplace_back("b", Deterministic(1, 5, rank + 0.5));
  ps.emplace_back("c", Deterministic(7, 3, rank + 0.25));
  for (Parameter& p : ps) p.grad = Deterministic(p.value.rows(), p.value.cols(), 10 * rank + 1);
  return ps;
}

std::vector<Parameter*> Pointers(std::vector<Parameter>& ps) {
  std::vector<Parameter*> out;
  for (Parameter& p : ps) out.push_back(&p);
  return out;
}

// The members of this rank's DP group, as the registry lists them.
std::vector<int64_t> DpMembers() {
  absl::StatusOr<DeviceMesh> dp = VESCALE_DEVICE_MESH.get_data_parallel_mesh();
  if (!dp.ok()) return {WorldRank()};
  return dp->mesh();
}

void CheckOnCurrentMesh() {
  const std::vector<int64_t> members = DpMembers();
  const int g = static_cast<int>(members.size());
  for (size_t bucket : {size_t{1}, size_t{7}, size_t{38}, size_t{1000}}) {
    SCOPED_TRACE(::testing::Message() << "bucket " << bucket << ", DP " << g);
    std::vector<Parameter> ps = MakeParams(WorldRank());
    const DataParallel dp({.bucket_elements = bucket});

    absl::StatusOr<BucketStats> b = dp.BroadcastParameters(Pointers(ps));
    ASSERT_TRUE(b.ok()) << b.status();
    const std::vector<Parameter> root = MakeParams(static_cast<int>(members[0]));
    for (size_t i = 0; i < ps.size(); ++i) {
      EXPECT_TRUE(Close(ps[i].value, root[i].value, 0)) << ps[i].name;
    }

    absl::StatusOr<BucketStats> a = dp.AverageGradients(Pointers(ps));
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->dp_size, g);
    EXPECT_EQ(a->elements, 38u);
    const int buckets = g == 1 ? 0 : static_cast<int>((38 + bucket - 1) / bucket);
    EXPECT_EQ(a->collectives, buckets);
    EXPECT_EQ(b->collectives, buckets);
    for (size_t i = 0; i < ps.size(); ++i) {
      Matrix want = Matrix::Zero(ps[i].grad.rows(), ps[i].grad.cols());
      for (int64_t r : members) want += MakeParams(static_cast<int>(r))[i].grad;
      want /= g;
      EXPECT_TRUE(Close(ps[i].grad, want, 1e-12)) << ps[i].name;
    }
  }
}

TEST(DataParallelTest, WholeWorldAsDp) {
  ASSERT_TRUE(InitMesh({WorldSize()}, {"DP"}));
  CheckOnCurrentMesh();
}

TEST(DataParallelTest, DpGroupsOfA2DMesh) {
  const int n = WorldSize();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  // DP is the slow dimension here, so a DP group strides over TP.
  ASSERT_TRUE(InitMesh({n / 2, 2}, {"DP", "TP"}));
  CheckOnCurrentMesh();
}

TEST(DataParallelTest, MeshWithoutDpIsANoOp) {
  ASSERT_TRUE(InitMesh({WorldSize()}, {"PP"}));
  std::vector<Parameter> ps = MakeParams(WorldRank());
  const Matrix before = ps[0].grad;
  absl::StatusOr<BucketStats> a = DataParallel().AverageGradients(Pointers(ps));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dp_size, 1);
  EXPECT_EQ(a->collectives, 0);
  EXPECT_TRUE(Close(ps[0].grad, before, 0));
}

}  // namespace
}  // namespace vemesh::strategies
