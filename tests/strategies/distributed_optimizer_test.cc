// DistributedOptimizer (ZeRO-1/2) against the serial optimizer on the DP
// average of the gradients: SGD and AdamW, sizes that do not divide DP and
// smaller than DP, bf16 gradients within DataParallel's bound, the memory
// accounting, and bad input answered on every rank (never a hang).
#include "vemesh/strategies/distributed_optimizer.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "strategies_test_util.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/reconfigurable_communicator.h"
#include "vemesh/mesh/device_mesh.h"

namespace vemesh::strategies {
namespace {

using testing::Close;
using testing::Deterministic;
using testing::InitMesh;
using testing::WorldSize;

// Parameter shapes of one test case: the same values on every rank.
using Shapes = std::vector<std::pair<int, int>>;

std::vector<Parameter> MakeParams(const Shapes& shapes) {
  std::vector<Parameter> ps;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ps.emplace_back(absl::StrCat("p", i),
                    Deterministic(shapes[i].first, shapes[i].second, i + 0.5));
  }
  return ps;
}

std::vector<Parameter*> Pointers(std::vector<Parameter>& ps) {
  std::vector<Parameter*> out;
  for (Parameter& p : ps) out.push_back(&p);
  return out;
}

// DP rank r's gradient of parameter i at step t.
Matrix Grad(const Parameter& p, size_t i, int r, int t) {
  return Deterministic(p.value.rows(), p.value.cols(),
                       10.0 * r + 1 + 0.3 * t + 0.07 * i);
}

int DpRank() {
  return static_cast<int>(*VESCALE_DEVICE_MESH.get_data_parallel_rank());
}
int DpSize() {
  return static_cast<int>(*VESCALE_DEVICE_MESH.get_role_size("DP"));
}

OptimizerOptions Optim(OptimizerKind kind) {
  if (kind == OptimizerKind::kAdamW) {
    OptimizerOptions o = OptimizerOptions::AdamW(0.05);
    o.weight_decay = 0.1;
    return o;
  }
  OptimizerOptions o = OptimizerOptions::Sgd(0.2, 0.9);
  o.weight_decay = 0.01;
  return o;
}

// Three steps of ZeRO against the serial optimizer on averaged gradients.
void CheckAgainstSerial(const Shapes& shapes, OptimizerKind kind,
                        ZeroStage stage) {
  SCOPED_TRACE(::testing::Message()
               << OptimizerKindName(kind) << ", ZeRO-"
               << static_cast<int>(stage) << ", DP " << DpSize() << ", "
               << shapes.size() << " parameters");
  const int p = DpSize();
  const int r = DpRank();
  std::vector<Parameter> ps = MakeParams(shapes);
  std::vector<Parameter> serial = MakeParams(shapes);
  auto zero = DistributedOptimizer::Create(
      {.optimizer = Optim(kind), .stage = stage}, Pointers(ps));
  ASSERT_TRUE(zero.ok()) << zero.status();
  auto ref = Optimizer::Create(Optim(kind), Pointers(serial));
  ASSERT_TRUE(ref.ok()) << ref.status();
  size_t n = 0;
  for (const auto& [rows, cols] : shapes) n += rows * cols;
  const size_t s = (n + p - 1) / p;
  EXPECT_EQ((*zero)->elements(), n);
  EXPECT_EQ((*zero)->shard_size(), s);

  for (int t = 0; t < 3; ++t) {
    (*zero)->ZeroGrad();
    for (size_t i = 0; i < ps.size(); ++i) {
      ps[i].grad = Grad(ps[i], i, r, t);
      serial[i].grad.setZero();
      for (int q = 0; q < p; ++q) serial[i].grad += Grad(serial[i], i, q, t);
      serial[i].grad /= p;
    }
    absl::StatusOr<ZeroStepStats> st = (*zero)->Step();
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(st->collectives, p == 1 ? 0 : 2);
    ASSERT_TRUE(ref->Step().ok());
    for (size_t i = 0; i < ps.size(); ++i) {
      EXPECT_TRUE(Close(ps[i].value, serial[i].value, 1e-12))
          << ps[i].name << " step " << t;
      if (stage == ZeroStage::kOne) {
        EXPECT_TRUE(Close(ps[i].grad, serial[i].grad, 1e-12)) << ps[i].name;
      } else {
        EXPECT_EQ(ps[i].grad.size(), 0) << "ZeRO-2 keeps only the shard";
      }
    }
  }
  EXPECT_EQ((*zero)->step_count(), 3);

  const TrainingStateBytes m = (*zero)->memory();
  EXPECT_EQ(m.parameters, 8 * n);
  EXPECT_EQ(m.gradients, 8 * (stage == ZeroStage::kTwo ? s : n));
  EXPECT_EQ(m.optimizer_state, OptimizerStateBytes(Optim(kind), s));
  EXPECT_EQ((*zero)->replicated_memory().total(),
            16 * n + OptimizerStateBytes(Optim(kind), n));
}

const Shapes kAwkward = {{3, 4}, {1, 5}, {7, 3}};  // 38 values
const Shapes kTiny = {{1, 3}};                     // fewer than DP at 4, 8

void CheckAll() {
  for (const Shapes* shapes : {&kAwkward, &kTiny}) {
    for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
      for (ZeroStage stage : {ZeroStage::kOne, ZeroStage::kTwo}) {
        CheckAgainstSerial(*shapes, kind, stage);
      }
    }
  }
}

TEST(DistributedOptimizerTest, WholeWorldAsDpMatchesSerial) {
  ASSERT_TRUE(InitMesh({WorldSize()}, {"DP"}));
  CheckAll();
}

TEST(DistributedOptimizerTest, DpGroupsOfA2DMeshMatchSerial) {
  const int n = WorldSize();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  ASSERT_TRUE(InitMesh({n / 2, 2}, {"DP", "TP"}));
  CheckAll();
}

// torchtitan's names: DP is DP_REPLICATE x DP_SHARD, flattened.
TEST(DistributedOptimizerTest, ReplicateTimesShardMatchesSerial) {
  const int n = WorldSize();
  if (n < 4) GTEST_SKIP() << "needs 4 ranks";
  if (n == 8) {
    ASSERT_TRUE(InitMesh({2, 2, 2}, {"DP_REPLICATE", "DP_SHARD", "TP"}));
  } else {
    ASSERT_TRUE(InitMesh({2, n / 2}, {"DP_REPLICATE", "DP_SHARD"}));
  }
  EXPECT_EQ(DpSize(), 4);
  CheckAll();
}

TEST(DistributedOptimizerTest, MeshWithoutDpIsAPlainOptimizer) {
  ASSERT_TRUE(InitMesh({WorldSize()}, {"PP"}));
  CheckAgainstSerial(kAwkward, OptimizerKind::kAdamW, ZeroStage::kTwo);
}

// bf16 gradients: SGD without momentum moves each value by lr times the
// averaged gradient, so the values' error is lr times the gradient's, within
// DataParallel's bound gamma_{P+1} * mean_r |g_r| (data_parallel_test.cc).
TEST(DistributedOptimizerTest, Bf16GradientsAreWithinTheirRoundingBound) {
  const int p = WorldSize();
  ASSERT_TRUE(InitMesh({p}, {"DP"}));
  const double u = std::ldexp(1.0, -8);
  const double gamma = (p + 1) * u / (1 - (p + 1) * u);
  constexpr double kLr = 0.25;
  for (ZeroStage stage : {ZeroStage::kOne, ZeroStage::kTwo}) {
    std::vector<Parameter> ps = MakeParams(kAwkward);
    const std::vector<Parameter> before = MakeParams(kAwkward);
    auto zero =
        DistributedOptimizer::Create({.optimizer = OptimizerOptions::Sgd(kLr),
                                      .stage = stage,
                                      .gradient_type = GradientType::kBFloat16},
                                     Pointers(ps));
    ASSERT_TRUE(zero.ok()) << zero.status();
    for (size_t i = 0; i < ps.size(); ++i)
      ps[i].grad = Grad(ps[i], i, DpRank(), 0);
    ASSERT_TRUE((*zero)->Step().ok());
    int inexact = 0;
    for (size_t i = 0; i < ps.size(); ++i) {
      Matrix mean = Matrix::Zero(ps[i].value.rows(), ps[i].value.cols());
      Matrix mean_abs = mean;
      for (int q = 0; q < p; ++q) {
        mean += Grad(ps[i], i, q, 0) / p;
        mean_abs += Grad(ps[i], i, q, 0).cwiseAbs() / p;
      }
      const Matrix want = before[i].value - kLr * mean;
      for (int64_t k = 0; k < want.size(); ++k) {
        EXPECT_LE(std::abs(ps[i].value.data()[k] - want.data()[k]),
                  kLr * gamma * mean_abs.data()[k] + 1e-15)
            << ps[i].name << "[" << k << "]";
        inexact += ps[i].value.data()[k] != want.data()[k];
      }
    }
    if (p > 1) {
      EXPECT_GT(inexact, 0) << "bf16 rounding left every value exact";
    }
  }
}

// Every rank gets InvalidArgument, and nobody hangs in a collective.
TEST(DistributedOptimizerTest, RanksThatDisagreeAllGetInvalidArgument) {
  const int p = WorldSize();
  ASSERT_TRUE(InitMesh({p}, {"DP"}));
  const bool odd_one = DpRank() == p - 1;
  // One rank has an extra parameter.
  Shapes shapes = kAwkward;
  if (odd_one && p > 1) shapes.push_back({2, 2});
  std::vector<Parameter> ps = MakeParams(shapes);
  auto zero = DistributedOptimizer::Create({}, Pointers(ps));
  if (p > 1) {
    EXPECT_TRUE(absl::IsInvalidArgument(zero.status())) << zero.status();
    // The first DP rank that differs, and both values.
    EXPECT_NE(zero.status().message().find(absl::StrCat(
                  "DP rank ", p - 1, " has 4 parameters of 42 values")),
              std::string::npos)
        << zero.status();
    EXPECT_NE(
        zero.status().message().find("DP rank 0 has 3 parameters of 38 values"),
        std::string::npos)
        << zero.status();
  }
  // The same counts, different shapes.
  shapes = kAwkward;
  if (odd_one && p > 1) shapes[0] = {4, 3};
  ps = MakeParams(shapes);
  zero = DistributedOptimizer::Create({}, Pointers(ps));
  if (p > 1) {
    EXPECT_TRUE(absl::IsInvalidArgument(zero.status())) << zero.status();
    EXPECT_NE(zero.status().message().find(absl::StrCat(
                  "DP rank ", p - 1, " has 3 parameters of 38 values [4x3, ")),
              std::string::npos)
        << zero.status();
    EXPECT_NE(zero.status().message().find("DP rank 0 has 3 parameters of 38 "
                                           "values [3x4, "),
              std::string::npos)
        << zero.status();
  }
  // One rank's option out of range.
  ps = MakeParams(kAwkward);
  DistributedOptimizerOptions o{.optimizer = OptimizerOptions::AdamW(0.1)};
  if (odd_one) o.optimizer.beta2 = 1.5;
  zero = DistributedOptimizer::Create(o, Pointers(ps));
  EXPECT_TRUE(absl::IsInvalidArgument(zero.status())) << zero.status();
  EXPECT_NE(zero.status().message().find(odd_one ? "beta2=1.5" : "rejected"),
            std::string::npos)
      << zero.status();
  // A null parameter on one rank.
  std::vector<Parameter*> ptrs = Pointers(ps);
  if (odd_one) ptrs.push_back(nullptr);
  zero = DistributedOptimizer::Create({}, ptrs);
  EXPECT_TRUE(absl::IsInvalidArgument(zero.status())) << zero.status();
}

TEST(DistributedOptimizerTest, StepWithChangedShapesStepsNothing) {
  const int p = WorldSize();
  ASSERT_TRUE(InitMesh({p}, {"DP"}));
  for (ZeroStage stage : {ZeroStage::kOne, ZeroStage::kTwo}) {
    std::vector<Parameter> ps = MakeParams(kAwkward);
    auto zero = DistributedOptimizer::Create(
        {.optimizer = OptimizerOptions::AdamW(0.1), .stage = stage},
        Pointers(ps));
    ASSERT_TRUE(zero.ok()) << zero.status();
    for (size_t i = 0; i < ps.size(); ++i) ps[i].grad = Grad(ps[i], i, 0, 0);
    // The last rank's gradient has the wrong shape.
    if (DpRank() == p - 1) ps[1].grad = Matrix::Zero(5, 1);
    const Matrix before = ps[0].value;
    absl::StatusOr<ZeroStepStats> st = (*zero)->Step();
    EXPECT_TRUE(absl::IsInvalidArgument(st.status())) << st.status();
    EXPECT_NE(st.status().message().find("nothing was stepped"),
              std::string::npos)
        << st.status();
    EXPECT_TRUE(Close(ps[0].value, before, 0));
    EXPECT_EQ((*zero)->step_count(), 0);
    // Repaired, it steps.
    for (size_t i = 0; i < ps.size(); ++i) ps[i].grad = Grad(ps[i], i, 0, 0);
    st = (*zero)->Step();
    ASSERT_TRUE(st.ok()) << st.status();
    if (stage == ZeroStage::kTwo) {
      // Forgetting ZeroGrad after a ZeRO-2 step is named.
      st = (*zero)->Step();
      EXPECT_TRUE(absl::IsInvalidArgument(st.status())) << st.status();
      EXPECT_NE(st.status().message().find("ZeroGrad"), std::string::npos)
          << st.status();
    }
  }
}

TEST(DistributedOptimizerTest, ReinitThatChangesDpIsFailedPrecondition) {
  const int p = WorldSize();
  if (p < 2) GTEST_SKIP() << "needs 2 ranks";
  ASSERT_TRUE(InitMesh({p}, {"DP"}));
  std::vector<Parameter> ps = MakeParams(kAwkward);
  auto zero = DistributedOptimizer::Create({}, Pointers(ps));
  ASSERT_TRUE(zero.ok()) << zero.status();
  ASSERT_TRUE(InitMesh({p / 2, 2}, {"DP", "TP"}));
  for (size_t i = 0; i < ps.size(); ++i) ps[i].grad.setOnes();
  absl::StatusOr<ZeroStepStats> st = (*zero)->Step();
  EXPECT_EQ(st.status().code(), absl::StatusCode::kFailedPrecondition)
      << st.status();
}

std::vector<int> RanksOf(const Communicator& c) {
  return {c.ranks().begin(), c.ranks().end()};
}

// The (replicate, shard) groups of a 2 x (n / 2) mesh, and this rank's
// replica alone (a group of one).
struct HsdpGroups {
  std::shared_ptr<Communicator> both, shard, alone;
};
absl::StatusOr<HsdpGroups> MakeHsdpGroups() {
  const int n = WorldSize();
  VEMESH_ASSIGN_OR_RETURN(
      DeviceMesh mesh,
      init_device_mesh("cpu", {2, n / 2}, {"replicate", "shard"}));
  HsdpGroups g;
  VEMESH_ASSIGN_OR_RETURN(g.both, mesh.get_group("replicate"));
  VEMESH_ASSIGN_OR_RETURN(g.shard, mesh.get_group("shard"));
  VEMESH_ASSIGN_OR_RETURN(g.alone, g.both->split(g.both->rank(), 0));
  return g;
}

// Issue 47: HSDP-style ZeRO created once over a replicate group that is a
// ReconfigurableCommunicator. Two replicas step together, then each alone
// (the other replica lost), then together again; each step averages over the
// DP ranks there at that step (shards x replicas), as the serial optimizer
// on the same average does. In the steps alone both replicas see the same
// gradients (their DP ranks are their shard ranks), so they stay equal.
TEST(DistributedOptimizerTest, HsdpReplicateGroupThatChangesSizeMatchesSerial) {
  const int n = WorldSize();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  absl::StatusOr<HsdpGroups> groups = MakeHsdpGroups();
  ASSERT_TRUE(groups.ok()) << groups.status();
  const int shards = n / 2;
  constexpr int kPhase = 2;
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
    for (ZeroStage stage : {ZeroStage::kOne, ZeroStage::kTwo}) {
      SCOPED_TRACE(::testing::Message() << OptimizerKindName(kind) << ", ZeRO-"
                                        << static_cast<int>(stage));
      auto replicate = std::make_shared<ReconfigurableCommunicator>(
          "DP_REPLICATE", std::string(groups->both->backend()));
      ASSERT_TRUE(
          replicate->configure(groups->both, RanksOf(*groups->both), 1).ok());
      std::vector<Parameter> ps = MakeParams(kAwkward);
      std::vector<Parameter> serial = MakeParams(kAwkward);
      auto zero = DistributedOptimizer::Create({.optimizer = Optim(kind),
                                                .stage = stage,
                                                .shard_group = groups->shard,
                                                .replicate_group = replicate},
                                               Pointers(ps));
      ASSERT_TRUE(zero.ok()) << zero.status();
      EXPECT_EQ((*zero)->num_shards(), shards);
      EXPECT_EQ((*zero)->shard_rank(), groups->shard->rank());
      EXPECT_EQ((*zero)->shard_size(), (38u + shards - 1) / shards);
      auto ref = Optimizer::Create(Optim(kind), Pointers(serial));
      ASSERT_TRUE(ref.ok()) << ref.status();
      for (int t = 0; t < 3 * kPhase; ++t) {
        if (t == kPhase) {
          ASSERT_TRUE(
              replicate->configure(groups->alone, RanksOf(*groups->alone), 2)
                  .ok());
        } else if (t == 2 * kPhase) {
          ASSERT_TRUE(
              replicate->configure(groups->both, RanksOf(*groups->both), 3)
                  .ok());
        }
        const int replicas = t < kPhase || t >= 2 * kPhase ? 2 : 1;
        const int p = replicas * shards;
        ASSERT_EQ((*zero)->dp_size(), p);
        (*zero)->ZeroGrad();
        for (size_t i = 0; i < ps.size(); ++i) {
          ps[i].grad = Grad(ps[i], i, (*zero)->dp_rank(), t);
          serial[i].grad.setZero();
          for (int q = 0; q < p; ++q)
            serial[i].grad += Grad(serial[i], i, q, t);
          serial[i].grad /= p;
        }
        absl::StatusOr<ZeroStepStats> st = (*zero)->Step();
        ASSERT_TRUE(st.ok()) << "step " << t << ": " << st.status();
        EXPECT_EQ(st->dp_size, p);
        EXPECT_EQ(st->collectives,
                  (shards > 1 ? 2 : 0) + (replicas > 1 ? 1 : 0));
        ASSERT_TRUE(ref->Step().ok());
        for (size_t i = 0; i < ps.size(); ++i) {
          EXPECT_TRUE(Close(ps[i].value, serial[i].value, 1e-12))
              << ps[i].name << " step " << t;
          if (stage == ZeroStage::kOne) {
            EXPECT_TRUE(Close(ps[i].grad, serial[i].grad, 1e-12))
                << ps[i].name << " step " << t;
          }
        }
      }
      EXPECT_EQ((*zero)->step_count(), 3 * kPhase);
    }
  }
}

TEST(DistributedOptimizerTest, HsdpGroupsThatDoNotFitAreNamed) {
  const int n = WorldSize();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  absl::StatusOr<HsdpGroups> groups = MakeHsdpGroups();
  ASSERT_TRUE(groups.ok()) << groups.status();
  std::vector<Parameter> ps = MakeParams(kAwkward);
  // A replicate group without a shard group: local, no collective.
  auto zero =
      DistributedOptimizer::Create({.optimizer = OptimizerOptions::Sgd(0.1),
                                    .replicate_group = groups->both},
                                   Pointers(ps));
  EXPECT_TRUE(absl::IsInvalidArgument(zero.status())) << zero.status();
  EXPECT_NE(zero.status().message().find("shard_group is null"),
            std::string::npos)
      << zero.status();
  // A replicate group between configurations: the step answers its status
  // with nothing stepped, and steps once a group is configured again.
  auto replicate = std::make_shared<ReconfigurableCommunicator>(
      "DP_REPLICATE", std::string(groups->both->backend()));
  ASSERT_TRUE(
      replicate->configure(groups->both, RanksOf(*groups->both), 1).ok());
  zero = DistributedOptimizer::Create({.optimizer = OptimizerOptions::Sgd(0.1),
                                       .shard_group = groups->shard,
                                       .replicate_group = replicate},
                                      Pointers(ps));
  ASSERT_TRUE(zero.ok()) << zero.status();
  ASSERT_TRUE(replicate
                  ->unconfigure(absl::UnavailableError(
                      "DP_REPLICATE is between membership epochs"))
                  .ok());
  for (size_t i = 0; i < ps.size(); ++i) ps[i].grad.setOnes();
  absl::StatusOr<ZeroStepStats> st = (*zero)->Step();
  EXPECT_TRUE(absl::IsUnavailable(st.status())) << st.status();
  EXPECT_NE(st.status().message().find("between membership epochs"),
            std::string::npos)
      << st.status();
  EXPECT_EQ((*zero)->step_count(), 0);
  ASSERT_TRUE(
      replicate->configure(groups->both, RanksOf(*groups->both), 2).ok());
  st = (*zero)->Step();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ((*zero)->step_count(), 1);
  // A shard group whose size changed since Create: FailedPrecondition,
  // nothing stepped.
  if (n < 4) return;
  auto shard = std::make_shared<ReconfigurableCommunicator>(
      "DP_SHARD", std::string(groups->shard->backend()));
  ASSERT_TRUE(shard->configure(groups->shard, RanksOf(*groups->shard), 1).ok());
  zero = DistributedOptimizer::Create(
      {.optimizer = OptimizerOptions::Sgd(0.1), .shard_group = shard},
      Pointers(ps));
  ASSERT_TRUE(zero.ok()) << zero.status();
  ASSERT_TRUE(shard->configure(groups->alone, RanksOf(*groups->alone), 2).ok());
  (*zero)->ZeroGrad();
  for (size_t i = 0; i < ps.size(); ++i) ps[i].grad.setOnes();
  const Matrix before = ps[0].value;
  st = (*zero)->Step();
  EXPECT_EQ(st.status().code(), absl::StatusCode::kFailedPrecondition)
      << st.status();
  EXPECT_NE(st.status().message().find("shard group's size is now 1"),
            std::string::npos)
      << st.status();
  EXPECT_TRUE(Close(ps[0].value, before, 0));
}

// Issue 47: one shard coordinate's replicate group fails (its partner
// replica lost) while the other's works: the shard group's collectives
// still pair up (no rank waits for one that left), the failed ranks step
// nothing and answer the replicate group's status.
TEST(DistributedOptimizerTest, FailedReplicateGroupLeavesTheShardGroupMatched) {
  const int n = WorldSize();
  if (n < 4 || n % 2 != 0) GTEST_SKIP() << "needs 2 replicas of 2+ shards";
  absl::StatusOr<HsdpGroups> groups = MakeHsdpGroups();
  ASSERT_TRUE(groups.ok()) << groups.status();
  for (ZeroStage stage : {ZeroStage::kOne, ZeroStage::kTwo}) {
    auto replicate = std::make_shared<ReconfigurableCommunicator>(
        "DP_REPLICATE", std::string(groups->both->backend()));
    ASSERT_TRUE(
        replicate->configure(groups->both, RanksOf(*groups->both), 1).ok());
    std::vector<Parameter> ps = MakeParams(kAwkward);
    auto zero =
        DistributedOptimizer::Create({.optimizer = OptimizerOptions::AdamW(0.1),
                                      .stage = stage,
                                      .shard_group = groups->shard,
                                      .replicate_group = replicate},
                                     Pointers(ps));
    ASSERT_TRUE(zero.ok()) << zero.status();
    const bool lost = groups->shard->rank() == 0;
    if (lost) {
      ASSERT_TRUE(replicate
                      ->unconfigure(absl::UnavailableError(
                          "DP_REPLICATE is between membership epochs"))
                      .ok());
    }
    (*zero)->ZeroGrad();
    for (Parameter& p : ps) p.grad.setOnes();
    absl::StatusOr<ZeroStepStats> st = (*zero)->Step();
    if (lost) {
      EXPECT_TRUE(absl::IsUnavailable(st.status())) << st.status();
      EXPECT_EQ((*zero)->step_count(), 0);
    } else {
      EXPECT_TRUE(st.ok()) << st.status();
    }
    // Every rank is back in step: a collective over all of them completes.
    int64_t one = 1;
    ASSERT_TRUE(
        groups->shard->all_reduce(absl::MakeSpan(&one, 1), ReduceOp::kSum)
            .ok());
    EXPECT_EQ(one, groups->shard->size());
  }
}

TEST(DistributedOptimizerTest, ParseZeroStage) {
  EXPECT_EQ(*ParseZeroStage("1"), ZeroStage::kOne);
  EXPECT_EQ(*ParseZeroStage("2"), ZeroStage::kTwo);
  EXPECT_TRUE(absl::IsInvalidArgument(ParseZeroStage("3").status()));
}

}  // namespace
}  // namespace vemesh::strategies
