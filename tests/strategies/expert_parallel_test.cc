// ExpertParallelMoe against a serial computation of the same experts: every
// rank builds the tokens of every EP member (they are a function of the
// member's rank), routes them as that member does and computes x W_e + b_e
// with all experts at hand, then checks its own outputs, input gradients
// and its experts' gradients. EP groups are flattened from a PP,DP,TP mesh:
// DP x TP (adjacent) and PP x TP (not adjacent).
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "strategies_test_util.h"
#include "vemesh/strategies/expert_parallel.h"

namespace vemesh::strategies {
namespace {

using testing::Close;
using testing::Deterministic;
using testing::InitMesh;
using testing::WorldSize;

constexpr int64_t kIn = 5;
constexpr int64_t kOut = 3;

ExpertInit Expert(int e) {
  return {Deterministic(kIn, kOut, 100.0 + e),
          Deterministic(1, kOut, 200.0 + e)};
}

// EP member r's tokens: an uneven row count (0 for member 1, so an empty
// contribution is covered) and ids that route unevenly.
int64_t RowsOf(int r) { return r == 1 ? 0 : 3 + 2 * r; }
Matrix TokensOf(int r) { return Deterministic(RowsOf(r), kIn, 1.0 + r); }
Matrix GradOf(int r) { return Deterministic(RowsOf(r), kOut, 50.0 + r); }
std::vector<int> RouteOf(int r, int experts) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < RowsOf(r); ++i) ids.push_back(1000 * r + i);
  return RouteByHash(ids, experts, /*seed=*/7);
}

void CheckAgainstSerial(const std::shared_ptr<Communicator>& ep, int experts) {
  const int g = ep->size();
  const int me = ep->rank();
  SCOPED_TRACE(::testing::Message() << experts << " experts over EP " << g);
  absl::StatusOr<ExpertParallelMoe> moe =
      ExpertParallelMoe::Create("moe", experts, ep, Expert);
  ASSERT_TRUE(moe.ok()) << moe.status();
  EXPECT_EQ(moe->local_experts(), experts / g);
  EXPECT_EQ(moe->first_expert(), me * (experts / g));

  // Twice, as two micro-batches in flight: both forwards, then both
  // backwards, so the expert gradients accumulate.
  MoeDispatch d1, d2;
  const Matrix x = TokensOf(me);
  const std::vector<int> route = RouteOf(me, experts);
  absl::StatusOr<Matrix> y1 = moe->Forward(x, route, &d1);
  ASSERT_TRUE(y1.ok()) << y1.status();
  absl::StatusOr<Matrix> y2 = moe->Forward(2 * x, route, &d2);
  ASSERT_TRUE(y2.ok()) << y2.status();
  absl::StatusOr<Matrix> dx1 = moe->Backward(d1, GradOf(me));
  ASSERT_TRUE(dx1.ok()) << dx1.status();
  absl::StatusOr<Matrix> dx2 = moe->Backward(d2, GradOf(me));
  ASSERT_TRUE(dx2.ok()) << dx2.status();

  // Serial: all experts here, every member's tokens.
  std::vector<Matrix> want_dw(experts, Matrix::Zero(kIn, kOut));
  std::vector<Matrix> want_db(experts, Matrix::Zero(1, kOut));
  for (int r = 0; r < g; ++r) {
    const Matrix xr = TokensOf(r);
    const Matrix gr = GradOf(r);
    const std::vector<int> er = RouteOf(r, experts);
    Matrix yr(xr.rows(), kOut), dxr(xr.rows(), kIn);
    for (int64_t i = 0; i < xr.rows(); ++i) {
      const ExpertInit w = Expert(er[i]);
      yr.row(i) = xr.row(i) * w.weight + w.bias;
      dxr.row(i) = gr.row(i) * w.weight.transpose();
      // Both micro-batches: inputs x and 2x, the same output gradient.
      want_dw[er[i]] += 3 * xr.row(i).transpose() * gr.row(i);
      want_db[er[i]] += 2 * gr.row(i);
    }
    if (r != me) continue;
    EXPECT_TRUE(Close(*y1, yr, 1e-12));
    EXPECT_TRUE(Close(*dx1, dxr, 1e-12));
    EXPECT_TRUE(Close(*dx2, dxr, 1e-12));
  }
  // The second forward, recomputed directly.
  Matrix want_y2(x.rows(), kOut);
  for (int64_t i = 0; i < x.rows(); ++i) {
    const ExpertInit w = Expert(route[i]);
    want_y2.row(i) = 2 * x.row(i) * w.weight + w.bias;
  }
  EXPECT_TRUE(Close(*y2, want_y2, 1e-12));

  std::vector<Parameter*> params = moe->parameters();
  ASSERT_EQ(params.size(), static_cast<size_t>(2 * moe->local_experts()));
  for (int j = 0; j < moe->local_experts(); ++j) {
    const int e = moe->first_expert() + j;
    EXPECT_TRUE(Close(params[2 * j]->grad, want_dw[e], 1e-12))
        << "expert " << e;
    EXPECT_TRUE(Close(params[2 * j + 1]->grad, want_db[e], 1e-12))
        << "expert " << e;
  }
}

// PP=2 (when there are 4 or more ranks), DP, TP=2.
bool InitPpDpTp() {
  const int n = WorldSize();
  if (n < 4 || n % 4 != 0) return false;
  return InitMesh({2, n / 4, 2}, {"PP", "DP", "TP"});
}

TEST(ExpertParallelTest, EpOverDpTimesTp) {
  if (!InitPpDpTp()) GTEST_SKIP() << "needs a multiple of 4 ranks";
  absl::StatusOr<DeviceMesh> mesh = VESCALE_DEVICE_MESH.get();
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  absl::StatusOr<std::shared_ptr<Communicator>> ep =
      mesh->flatten({"DP", "TP"}, "EP");
  ASSERT_TRUE(ep.ok()) << ep.status();
  ASSERT_EQ((*ep)->size(), WorldSize() / 2);
  for (int per_rank : {1, 3}) CheckAgainstSerial(*ep, per_rank * (*ep)->size());
}

TEST(ExpertParallelTest, EpOverNonAdjacentPpTimesTp) {
  if (!InitPpDpTp()) GTEST_SKIP() << "needs a multiple of 4 ranks";
  absl::StatusOr<DeviceMesh> mesh = VESCALE_DEVICE_MESH.get();
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  absl::StatusOr<std::shared_ptr<Communicator>> ep =
      mesh->flatten({"PP", "TP"}, "PPTP");
  ASSERT_TRUE(ep.ok()) << ep.status();
  ASSERT_EQ((*ep)->size(), 4);
  CheckAgainstSerial(*ep, 8);
}

TEST(ExpertParallelTest, WholeWorldAndSingleRank) {
  ASSERT_TRUE(InitMesh({WorldSize()}, {"EP"}));
  absl::StatusOr<std::shared_ptr<Communicator>> ep =
      VESCALE_DEVICE_MESH.get()->get_group("EP");
  ASSERT_TRUE(ep.ok()) << ep.status();
  CheckAgainstSerial(*ep, 2 * WorldSize());
}

TEST(ExpertParallelTest, BadInputIsNamed) {
  ASSERT_TRUE(InitMesh({WorldSize()}, {"EP"}));
  std::shared_ptr<Communicator> ep =
      *VESCALE_DEVICE_MESH.get()->get_group("EP");
  if (WorldSize() > 1) {
    absl::StatusOr<ExpertParallelMoe> uneven =
        ExpertParallelMoe::Create("moe", WorldSize() + 1, ep, Expert);
    EXPECT_EQ(uneven.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(uneven.status().message().find("multiple of"),
              absl::string_view::npos)
        << uneven.status();
  }
  absl::StatusOr<ExpertParallelMoe> moe =
      ExpertParallelMoe::Create("moe", WorldSize(), ep, Expert);
  ASSERT_TRUE(moe.ok()) << moe.status();
  MoeDispatch d;
  // Checked before any communication, so each rank may fail alone.
  absl::StatusOr<Matrix> y =
      moe->Forward(Matrix::Zero(2, kIn), {0, WorldSize()}, &d);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(y.status().message().find("routed to expert"),
            absl::string_view::npos)
      << y.status();
  y = moe->Forward(Matrix::Zero(2, kIn + 1), {0, 0}, &d);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  y = moe->Forward(Matrix::Zero(2, kIn), {0}, &d);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vemesh::strategies
