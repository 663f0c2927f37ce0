// DataParallel: the broadcast from DP rank 0 and the bucketed gradient
// average, against values computed locally for every member of the group;
// the overlapped reduction (buckets started while "backward" runs), the
// blocking baseline, and bf16 gradients within their derived error bound.
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "strategies_test_util.h"
#include "vemesh/comm/half.h"
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
  for (Parameter& p : ps)
    p.grad = Deterministic(p.value.rows(), p.value.cols(), 10 * rank + 1);
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
  for (bool overlap : {true, false})
    for (size_t bucket : {size_t{1}, size_t{7}, size_t{38}, size_t{1000}}) {
      SCOPED_TRACE(::testing::Message()
                   << "bucket " << bucket << ", DP " << g
                   << (overlap ? ", overlap" : ", blocking"));
      std::vector<Parameter> ps = MakeParams(WorldRank());
      DataParallel dp({.bucket_elements = bucket, .overlap = overlap});

      absl::StatusOr<BucketStats> b = dp.BroadcastParameters(Pointers(ps));
      ASSERT_TRUE(b.ok()) << b.status();
      const std::vector<Parameter> root =
          MakeParams(static_cast<int>(members[0]));
      for (size_t i = 0; i < ps.size(); ++i) {
        EXPECT_TRUE(Close(ps[i].value, root[i].value, 0)) << ps[i].name;
      }

      absl::StatusOr<BucketStats> a = dp.AverageGradients(Pointers(ps));
      ASSERT_TRUE(a.ok()) << a.status();
      EXPECT_EQ(a->dp_size, g);
      EXPECT_EQ(a->elements, 38u);
      const int buckets =
          g == 1 ? 0 : static_cast<int>((38 + bucket - 1) / bucket);
      EXPECT_EQ(a->collectives, buckets);
      EXPECT_EQ(b->collectives, buckets);
      for (size_t i = 0; i < ps.size(); ++i) {
        Matrix want = Matrix::Zero(ps[i].grad.rows(), ps[i].grad.cols());
        for (int64_t r : members)
          want += MakeParams(static_cast<int>(r))[i].grad;
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

// The expected average of parameter i's gradient over the DP members, and
// the mean of its absolute values (the scale of bf16's error).
struct Expected {
  Matrix mean;
  Matrix mean_abs;
};
Expected ExpectedAverage(const std::vector<int64_t>& members, size_t i,
                         int salt_step = 0) {
  Expected e;
  for (int64_t r : members) {
    Matrix grad = MakeParams(static_cast<int>(r))[i].grad;
    if (salt_step > 0) {
      grad =
          Deterministic(grad.rows(), grad.cols(), 10 * r + 1 + 0.1 * salt_step);
    }
    if (e.mean.size() == 0) {
      e.mean = Matrix::Zero(grad.rows(), grad.cols());
      e.mean_abs = e.mean;
    }
    e.mean += grad;
    e.mean_abs += grad.cwiseAbs();
  }
  e.mean /= static_cast<double>(members.size());
  e.mean_abs /= static_cast<double>(members.size());
  return e;
}

// The backward pass of a model whose parameters are listed a, b, c: it
// finishes c first. Marking only c lets exactly the buckets made of c's 21
// values start (buckets are laid out last parameter first): 3 of 7 values.
TEST(DataParallelTest, BucketsStartAsTheirGradientsBecomeReady) {
  const int n = WorldSize();
  ASSERT_TRUE(InitMesh({n}, {"DP"}));
  std::vector<Parameter> ps = MakeParams(WorldRank());
  DataParallel dp({.bucket_elements = 7});
  ASSERT_TRUE(dp.PrepareGradientSync(Pointers(ps)).ok());
  ASSERT_TRUE(dp.MarkGradientReady(&ps[2]).ok());
  absl::StatusOr<BucketStats> st = dp.FinishGradientSync();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->collectives, n == 1 ? 0 : 6);  // ceil(38 / 7)
  EXPECT_EQ(st->started_early, n == 1 ? 0 : 3);
  std::vector<int64_t> all;
  for (int r = 0; r < n; ++r) all.push_back(r);
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_TRUE(Close(ps[i].grad, ExpectedAverage(all, i).mean, 1e-12))
        << ps[i].name;
  }

  // Announced in backward order, every bucket starts before the finish.
  std::vector<Parameter> qs = MakeParams(WorldRank());
  ASSERT_TRUE(dp.PrepareGradientSync(Pointers(qs)).ok());
  for (int i = 2; i >= 0; --i) ASSERT_TRUE(dp.MarkGradientReady(&qs[i]).ok());
  st = dp.FinishGradientSync();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->started_early, st->collectives);
  EXPECT_TRUE(Close(qs[0].grad, ExpectedAverage(all, 0).mean, 1e-12));
}

TEST(DataParallelTest, GradientSyncMisuseIsReported) {
  ASSERT_TRUE(InitMesh({WorldSize()}, {"DP"}));
  std::vector<Parameter> ps = MakeParams(WorldRank());
  Parameter stranger("stranger", Matrix::Zero(1, 1));
  DataParallel dp;
  EXPECT_EQ(dp.MarkGradientReady(&ps[0]).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(dp.FinishGradientSync().status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(dp.PrepareGradientSync(Pointers(ps)).ok());
  EXPECT_EQ(dp.PrepareGradientSync(Pointers(ps)).code(),
            absl::StatusCode::kFailedPrecondition);
  absl::Status s = dp.MarkGradientReady(&stranger);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'stranger'"), absl::string_view::npos) << s;
  ASSERT_TRUE(dp.MarkGradientReady(&ps[1]).ok());
  s = dp.MarkGradientReady(&ps[1]);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("already marked"), absl::string_view::npos) << s;
  // The misuse changed nothing: the sync still completes, and closes.
  absl::StatusOr<BucketStats> st = dp.FinishGradientSync();
  EXPECT_TRUE(st.ok()) << st.status();
  EXPECT_FALSE(dp.sync_open());
}

// bf16's unit roundoff u = 2^-8 (8 significand bits with the implicit one).
// One bf16 all_reduce over P ranks rounds each rank's value once to bf16
// (after an exact-enough double -> float step: one more rounding of at most
// 2^-24, counted as a full u to keep the bound simple) and then rounds at
// most P - 1 partial sums, whatever the order the backend combines them in.
// Standard summation analysis (Higham, Accuracy and Stability of Numerical
// Algorithms, 4.2) bounds the error of such a sum by gamma_n * sum |g_r|
// with n = P + 1 roundings on any path, gamma_n = n u / (1 - n u). Dividing
// by P (in double) is exact for P a power of two, so the average is within
// gamma_{P+1} * mean_r |g_r|, element by element.
double Gamma(int n) {
  const double u = std::ldexp(1.0, -8);
  return n * u / (1 - n * u);
}

TEST(DataParallelTest, Bf16GradientsAreWithinTheirRoundingBound) {
  const int n = WorldSize();
  ASSERT_TRUE(InitMesh({n}, {"DP"}));
  std::vector<int64_t> all;
  for (int r = 0; r < n; ++r) all.push_back(r);
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlap" : "blocking");
    std::vector<Parameter> ps = MakeParams(WorldRank());
    DataParallel dp({.bucket_elements = 7,
                     .overlap = overlap,
                     .gradient_type = GradientType::kBFloat16});
    absl::StatusOr<BucketStats> st = dp.AverageGradients(Pointers(ps));
    ASSERT_TRUE(st.ok()) << st.status();
    if (n == 1) {
      // No communication, no rounding: the gradients are untouched.
      EXPECT_TRUE(Close(ps[0].grad, MakeParams(WorldRank())[0].grad, 0));
      continue;
    }
    int inexact = 0;
    for (size_t i = 0; i < ps.size(); ++i) {
      const Expected e = ExpectedAverage(all, i);
      for (int64_t k = 0; k < e.mean.size(); ++k) {
        const double got = ps[i].grad.data()[k];
        const double bound = Gamma(n + 1) * e.mean_abs.data()[k];
        EXPECT_LE(std::abs(got - e.mean.data()[k]), bound)
            << ps[i].name << "[" << k << "]";
        // The sum really travelled as bf16: P * average is a bf16 value
        // (when P is a power of two, so that the division was exact).
        const double sum = got * n;
        if ((n & (n - 1)) == 0) {
          EXPECT_EQ(static_cast<double>(
                        static_cast<float>(BFloat16(static_cast<float>(sum)))),
                    sum)
              << ps[i].name << "[" << k << "]";
        }
        inexact += got != e.mean.data()[k];
      }
    }
    EXPECT_GT(inexact, 0) << "bf16 rounding left every gradient exact";
  }
}

// K SGD steps with bf16 gradients against the same steps in double. The
// gradients do not depend on the weights here, so the weights' difference
// is lr times the sum of the per-step gradient errors, each within the
// bound above: |w_bf16 - w| <= lr * sum_k gamma_{P+1} mean_r |g_{r,k}|.
TEST(DataParallelTest, Bf16MasterWeightsTrackDoubleOverSteps) {
  const int n = WorldSize();
  ASSERT_TRUE(InitMesh({n}, {"DP"}));
  std::vector<int64_t> all;
  for (int r = 0; r < n; ++r) all.push_back(r);
  constexpr int kSteps = 5;
  constexpr double kLr = 0.25;
  std::vector<Parameter> ps = MakeParams(WorldRank());
  std::vector<Matrix> want, bound;
  for (const Parameter& p : ps) {
    want.push_back(p.value);
    bound.push_back(Matrix::Zero(p.value.rows(), p.value.cols()));
  }
  DataParallel dp(
      {.bucket_elements = 16, .gradient_type = GradientType::kBFloat16});
  for (int step = 1; step <= kSteps; ++step) {
    for (Parameter& p : ps) {
      p.grad = Deterministic(p.value.rows(), p.value.cols(),
                             10 * WorldRank() + 1 + 0.1 * step);
    }
    ASSERT_TRUE(dp.PrepareGradientSync(Pointers(ps)).ok());
    for (int i = 2; i >= 0; --i) ASSERT_TRUE(dp.MarkGradientReady(&ps[i]).ok());
    absl::StatusOr<BucketStats> st = dp.FinishGradientSync();
    ASSERT_TRUE(st.ok()) << st.status();
    for (size_t i = 0; i < ps.size(); ++i) {
      ps[i].SgdStep(kLr);
      const Expected e = ExpectedAverage(all, i, step);
      want[i] -= kLr * e.mean;
      if (n > 1) bound[i] += kLr * Gamma(n + 1) * e.mean_abs;
    }
  }
  for (size_t i = 0; i < ps.size(); ++i) {
    for (int64_t k = 0; k < want[i].size(); ++k) {
      EXPECT_LE(std::abs(ps[i].value.data()[k] - want[i].data()[k]),
                bound[i].data()[k] + 1e-14)
          << ps[i].name << "[" << k << "]";
    }
  }
}

}  // namespace
}  // namespace vemesh::strategies
