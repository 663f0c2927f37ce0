// ColumnParallelLinear and RowParallelLinear against the serial Linear:
// outputs, input gradients and parameter gradients, on TP groups of every
// size the world allows (1-D TP meshes and 2-D DP x TP meshes).
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "strategies_test_util.h"
#include "vemesh/strategies/column_parallel_linear.h"
#include "vemesh/strategies/linear.h"
#include "vemesh/strategies/row_parallel_linear.h"

namespace vemesh::strategies {
namespace {

using testing::Close;
using testing::Deterministic;
using testing::InitMesh;
using testing::WorldSize;

constexpr int64_t kBatch = 5;
constexpr int64_t kIn = 16;
constexpr int64_t kOut = 24;

// The (DP, TP) shapes to try on this world: all of it as TP, and TP=2.
std::vector<std::pair<int64_t, int64_t>> Shapes() {
  const int n = WorldSize();
  std::vector<std::pair<int64_t, int64_t>> shapes{{1, n}};
  if (n > 2) shapes.push_back({n / 2, 2});
  return shapes;
}

struct Reference {
  Matrix w = Deterministic(kIn, kOut, 1.0);
  Matrix b = Deterministic(1, kOut, 2.0);
  Matrix x = Deterministic(kBatch, kIn, 3.0);
  Matrix dy = Deterministic(kBatch, kOut, 4.0);
  Matrix y, dx, dw, db;
  Reference() {
    Linear ref("ref", w, b);
    y = ref.Forward(x);
    dx = ref.Backward(x, dy);
    dw = ref.weight().grad;
    db = ref.bias().grad;
  }
};

TEST(ColumnParallelLinearTest, MatchesSerialWithAndWithoutGather) {
  const Reference ref;
  for (auto [dp, tp] : Shapes()) {
    ASSERT_TRUE(InitMesh({dp, tp}, {"DP", "TP"}));
    for (bool gather : {true, false}) {
      SCOPED_TRACE(::testing::Message()
                   << "DP=" << dp << " TP=" << tp << " gather=" << gather);
      absl::StatusOr<ColumnParallelLinear> fc = ColumnParallelLinear::Create(
          "fc", ref.w, ref.b, {.gather_output = gather});
      ASSERT_TRUE(fc.ok()) << fc.status();
      const int64_t c0 = fc->shard().begin(), c = fc->shard().size();
      EXPECT_EQ(c, kOut / tp);

      absl::StatusOr<Matrix> y = fc->Forward(ref.x);
      ASSERT_TRUE(y.ok()) << y.status();
      EXPECT_TRUE(Close(*y, gather ? ref.y : Matrix(ref.y.middleCols(c0, c))));

      const Matrix dy = gather ? ref.dy : Matrix(ref.dy.middleCols(c0, c));
      absl::StatusOr<Matrix> dx = fc->Backward(ref.x, dy);
      ASSERT_TRUE(dx.ok()) << dx.status();
      EXPECT_TRUE(Close(*dx, ref.dx));
      EXPECT_TRUE(Close(fc->weight().grad, ref.dw.middleCols(c0, c)));
      EXPECT_TRUE(Close(fc->bias().grad, ref.db.middleCols(c0, c)));

      // Without the input gradient: same parameter gradients, no dx.
      absl::StatusOr<Matrix> none = fc->Backward(ref.x, dy, false);
      ASSERT_TRUE(none.ok()) << none.status();
      EXPECT_EQ(none->size(), 0);
      EXPECT_TRUE(Close(fc->weight().grad, 2 * ref.dw.middleCols(c0, c)));
    }
  }
}

TEST(RowParallelLinearTest, MatchesSerialWithSplitAndWholeInput) {
  // Row-parallel splits the input features: reuse the reference transposed
  // in role (in = kOut would not divide by 8, kIn = 16 does).
  const Reference ref;
  for (auto [dp, tp] : Shapes()) {
    ASSERT_TRUE(InitMesh({dp, tp}, {"DP", "TP"}));
    for (bool parallel_input : {true, false}) {
      SCOPED_TRACE(::testing::Message()
                   << "DP=" << dp << " TP=" << tp
                   << " input_is_parallel=" << parallel_input);
      absl::StatusOr<RowParallelLinear> fc = RowParallelLinear::Create(
          "fc", ref.w, ref.b, {.input_is_parallel = parallel_input});
      ASSERT_TRUE(fc.ok()) << fc.status();
      const int64_t r0 = fc->shard().begin(), r = fc->shard().size();
      EXPECT_EQ(r, kIn / tp);

      const Matrix x = parallel_input ? Matrix(ref.x.middleCols(r0, r)) : ref.x;
      absl::StatusOr<Matrix> y = fc->Forward(x);
      ASSERT_TRUE(y.ok()) << y.status();
      EXPECT_TRUE(Close(*y, ref.y));

      absl::StatusOr<Matrix> dx = fc->Backward(x, ref.dy);
      ASSERT_TRUE(dx.ok()) << dx.status();
      EXPECT_TRUE(Close(
          *dx, parallel_input ? Matrix(ref.dx.middleCols(r0, r)) : ref.dx));
      EXPECT_TRUE(Close(fc->weight().grad, ref.dw.middleRows(r0, r)));
      EXPECT_TRUE(Close(fc->bias().grad, ref.db));
    }
  }
}

TEST(TensorParallelTest, ColumnThenRowIsTheSerialMlp) {
  // Megatron's pairing: column (no gather) -> tanh -> row, against serial.
  const Matrix w1 = Deterministic(kIn, kOut, 5.0),
               b1 = Deterministic(1, kOut, 6.0);
  const Matrix w2 = Deterministic(kOut, kIn, 7.0),
               b2 = Deterministic(1, kIn, 8.0);
  const Matrix x = Deterministic(kBatch, kIn, 9.0);
  const Matrix dz = Deterministic(kBatch, kIn, 10.0);
  Linear s1("s1", w1, b1), s2("s2", w2, b2);
  const Matrix h = s1.Forward(x).array().tanh().matrix();
  const Matrix z = s2.Forward(h);
  const Matrix dh = s2.Backward(h, dz);
  const Matrix dx =
      s1.Backward(x, (dh.array() * (1 - h.array().square())).matrix());

  const int n = WorldSize();
  if (kOut % n != 0)
    GTEST_SKIP() << kOut << " hidden units do not split " << n << " ways";
  ASSERT_TRUE(InitMesh({n}, {"TP"}));
  absl::StatusOr<ColumnParallelLinear> p1 =
      ColumnParallelLinear::Create("p1", w1, b1);
  absl::StatusOr<RowParallelLinear> p2 =
      RowParallelLinear::Create("p2", w2, b2);
  ASSERT_TRUE(p1.ok() && p2.ok());
  absl::StatusOr<Matrix> a = p1->Forward(x);
  ASSERT_TRUE(a.ok());
  const Matrix hp = a->array().tanh().matrix();
  absl::StatusOr<Matrix> zp = p2->Forward(hp);
  ASSERT_TRUE(zp.ok());
  EXPECT_TRUE(Close(*zp, z));
  absl::StatusOr<Matrix> dhp = p2->Backward(hp, dz);
  ASSERT_TRUE(dhp.ok());
  absl::StatusOr<Matrix> dxp =
      p1->Backward(x, (dhp->array() * (1 - hp.array().square())).matrix());
  ASSERT_TRUE(dxp.ok());
  EXPECT_TRUE(Close(*dxp, dx));
  const int64_t c0 = p1->shard().begin(), c = p1->shard().size();
  EXPECT_TRUE(Close(p1->weight().grad, s1.weight().grad.middleCols(c0, c)));
  EXPECT_TRUE(Close(p2->weight().grad, s2.weight().grad.middleRows(c0, c)));
  EXPECT_TRUE(Close(p2->bias().grad, s2.bias().grad));
}

TEST(TensorParallelTest, RejectsBadShapes) {
  const int n = WorldSize();
  ASSERT_TRUE(InitMesh({n}, {"TP"}));
  absl::StatusOr<ColumnParallelLinear> bad_bias = ColumnParallelLinear::Create(
      "fc", Deterministic(4, 8, 0), Deterministic(1, 7, 0));
  EXPECT_EQ(bad_bias.status().code(), absl::StatusCode::kInvalidArgument);
  if (n > 1) {
    absl::StatusOr<RowParallelLinear> odd = RowParallelLinear::Create(
        "fc", Deterministic(n + 1, 8, 0), Deterministic(1, 8, 0));
    ASSERT_FALSE(odd.ok());
    EXPECT_NE(odd.status().message().find("fc input features"),
              std::string::npos)
        << odd.status();
  }
}

}  // namespace
}  // namespace vemesh::strategies
