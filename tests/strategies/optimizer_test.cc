// SGD and AdamW against values worked out by hand (PyTorch's rules, see
// optimizer.h), option validation, and the Parameter-list optimizer.
#include "vemesh/strategies/optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vemesh::strategies {
namespace {

using ::testing::HasSubstr;

constexpr double kTol = 1e-14;

// The gradients of three steps of a three-element run.
const std::vector<std::vector<double>> kGrads = {
    {0.5, -1.0, 0.1}, {-0.3, 0.2, 0.0}, {0.1, 0.4, -0.2}};

TEST(AdamW, FirstStepIsSignedLearningRate) {
  // Step 1: m = (1-b1) g, v = (1-b2) g^2; the bias corrections cancel them,
  // so p1 = p0 (1 - lr wd) - lr g / (|g| + eps).
  OptimizerOptions o = OptimizerOptions::AdamW(0.01);
  o.weight_decay = 0.1;
  auto opt = MakeFlatOptimizer(o, 2);
  ASSERT_TRUE(opt.ok()) << opt.status();
  std::vector<double> p = {1.0, -2.0};
  std::vector<double> g = {0.5, -1e-3};
  ASSERT_TRUE((*opt)->Step(absl::MakeSpan(p), g).ok());
  EXPECT_NEAR(p[0], 1.0 * 0.999 - 0.01 * 0.5 / (0.5 + 1e-8), kTol);
  EXPECT_NEAR(p[1], -2.0 * 0.999 + 0.01 * 1e-3 / (1e-3 + 1e-8), kTol);
  EXPECT_EQ((*opt)->step_count(), 1);
  EXPECT_EQ((*opt)->state_bytes(), 2 * 2 * sizeof(double));
}

TEST(AdamW, ThreeStepsMatchHandComputedValues) {
  // lr 0.01, weight decay 0.1, betas (0.9, 0.999), eps 1e-8. E.g. element 0,
  // step 2: p = 0.9890000002 * 0.999; m = 0.9*0.05 - 0.1*0.3 = 0.015;
  // v = 0.999*0.00025 + 0.001*0.09 = 0.00033975; p -= 0.01/0.19 * 0.015 /
  // (sqrt(0.00033975/0.001999) + 1e-8) -> 0.986096019894.
  OptimizerOptions o = OptimizerOptions::AdamW(0.01);
  o.weight_decay = 0.1;
  auto opt = MakeFlatOptimizer(o, 3);
  ASSERT_TRUE(opt.ok()) << opt.status();
  std::vector<double> p = {1.0, -2.0, 0.5};
  const std::vector<std::vector<double>> want = {
      {0.98900000020000001, -1.9880000001, 0.48950000099999991},
      {0.98609601989397755, -1.9809017393989494, 0.48230991940547696},
      {0.9825702720415429, -1.9775784416813165, 0.48522795392665102}};
  for (int t = 0; t < 3; ++t) {
    ASSERT_TRUE((*opt)->Step(absl::MakeSpan(p), kGrads[t]).ok());
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(p[i], want[t][i], kTol) << "step " << t + 1 << " elem " << i;
    }
  }
}

TEST(AdamW, DefaultsArePyTorchs) {
  OptimizerOptions o = OptimizerOptions::AdamW(1e-3);
  EXPECT_EQ(o.beta1, 0.9);
  EXPECT_EQ(o.beta2, 0.999);
  EXPECT_EQ(o.eps, 1e-8);
  EXPECT_EQ(o.resolved_weight_decay(), 1e-2);
  EXPECT_EQ(OptimizerOptions::Sgd(0.1).resolved_weight_decay(), 0.0);
  EXPECT_EQ(OptimizerOptions{}.lr, 1e-3);
  // Designated initialisers leave the decay to the kind's default.
  const OptimizerOptions d{.kind = OptimizerKind::kAdamW, .lr = 0.1};
  EXPECT_EQ(d.resolved_weight_decay(), 1e-2);
}

TEST(AdamW, ZeroPaddingStaysZero) {
  auto opt = MakeFlatOptimizer(OptimizerOptions::AdamW(0.1), 4);
  ASSERT_TRUE(opt.ok());
  std::vector<double> p = {0, 0, 0, 0};
  const std::vector<double> g = {0, 0, 0, 0};
  for (int t = 0; t < 5; ++t)
    ASSERT_TRUE((*opt)->Step(absl::MakeSpan(p), g).ok());
  for (double x : p) EXPECT_EQ(x, 0.0);
}

TEST(Sgd, PlainAndMomentumMatchHandComputedValues) {
  auto plain = MakeFlatOptimizer(OptimizerOptions::Sgd(0.1), 3);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->state_bytes(), 0u);
  std::vector<double> p = {1.0, -2.0, 0.5};
  ASSERT_TRUE((*plain)->Step(absl::MakeSpan(p), kGrads[0]).ok());
  EXPECT_NEAR(p[0], 0.95, kTol);
  EXPECT_NEAR(p[1], -1.9, kTol);
  EXPECT_NEAR(p[2], 0.49, kTol);

  // Momentum 0.9, weight decay 0.01: b1 = g1 + 0.01 p0, b_t = 0.9 b + d_t.
  OptimizerOptions o = OptimizerOptions::Sgd(0.1, 0.9);
  o.weight_decay = 0.01;
  auto mom = MakeFlatOptimizer(o, 3);
  ASSERT_TRUE(mom.ok());
  EXPECT_EQ((*mom)->state_bytes(), 3 * sizeof(double));
  p = {1.0, -2.0, 0.5};
  const std::vector<std::vector<double>> want = {
      {0.949, -1.898, 0.4895},
      {0.932151, -1.824302, 0.4795605},
      {0.906054749, -1.796149498, 0.4901353895}};
  for (int t = 0; t < 3; ++t) {
    ASSERT_TRUE((*mom)->Step(absl::MakeSpan(p), kGrads[t]).ok());
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(p[i], want[t][i], kTol) << "step " << t + 1 << " elem " << i;
    }
  }
}

TEST(Optimizer, RejectsOptionsOutOfRange) {
  auto expect_bad = [](OptimizerOptions o, const char* name) {
    absl::Status s = ValidateOptimizerOptions(o);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << name << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(name));
    EXPECT_TRUE(absl::IsInvalidArgument(MakeFlatOptimizer(o, 1).status()));
    EXPECT_TRUE(absl::IsInvalidArgument(Optimizer::Create(o, {}).status()));
  };
  OptimizerOptions o = OptimizerOptions::AdamW(-0.1);
  expect_bad(o, "lr=-0.1");
  o = OptimizerOptions::AdamW(0.1);
  o.beta1 = 1.0;
  expect_bad(o, "beta1=1");
  o = OptimizerOptions::AdamW(0.1);
  o.beta2 = -0.5;
  expect_bad(o, "beta2=-0.5");
  o = OptimizerOptions::AdamW(0.1);
  o.eps = 0;
  expect_bad(o, "eps=0");
  o = OptimizerOptions::AdamW(0.1);
  o.weight_decay = -1;
  expect_bad(o, "weight_decay=-1");
  o = OptimizerOptions::AdamW(std::nan(""));
  expect_bad(o, "lr=nan");
  expect_bad(OptimizerOptions::Sgd(0.1, -0.9), "momentum=-0.9");
  // SGD ignores Adam's options.
  o = OptimizerOptions::Sgd(0.1);
  o.beta1 = 2;
  EXPECT_TRUE(ValidateOptimizerOptions(o).ok());
}

TEST(Optimizer, StepRejectsWrongSizes) {
  auto opt = MakeFlatOptimizer(OptimizerOptions::AdamW(0.1), 3);
  ASSERT_TRUE(opt.ok());
  std::vector<double> p = {1, 2, 3};
  const std::vector<double> g = {1, 2};
  absl::Status s = (*opt)->Step(absl::MakeSpan(p), g);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("gradient 2 elements; expected 3"));
  EXPECT_EQ((*opt)->step_count(), 0);
  EXPECT_EQ(p, (std::vector<double>{1, 2, 3}));
}

TEST(Optimizer, ParseKind) {
  EXPECT_EQ(*ParseOptimizerKind("sgd"), OptimizerKind::kSgd);
  EXPECT_EQ(*ParseOptimizerKind("Adam"), OptimizerKind::kAdamW);
  EXPECT_EQ(*ParseOptimizerKind("adamw"), OptimizerKind::kAdamW);
  absl::StatusOr<OptimizerKind> bad = ParseOptimizerKind("lamb");
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(bad.status().message(), HasSubstr("'lamb'"));
}

TEST(Optimizer, StepsParametersLikeFlatRuns) {
  Parameter w{"w", Matrix::Constant(2, 3, 0.5)};
  Parameter b{"b", Matrix::Constant(1, 3, -0.25)};
  OptimizerOptions o = OptimizerOptions::AdamW(0.05);
  auto opt = Optimizer::Create(o, {&w, &b});
  ASSERT_TRUE(opt.ok()) << opt.status();
  EXPECT_EQ(opt->state_bytes(), 9 * 2 * sizeof(double));
  // The same rule on one flat run of the concatenation.
  auto flat = MakeFlatOptimizer(o, 9);
  ASSERT_TRUE(flat.ok());
  std::vector<double> all(9);
  for (int t = 0; t < 3; ++t) {
    for (int i = 0; i < 6; ++i) w.grad.data()[i] = std::sin(t + i);
    for (int i = 0; i < 3; ++i) b.grad.data()[i] = std::cos(t * i);
    std::vector<double> p(w.value.data(), w.value.data() + 6);
    p.insert(p.end(), b.value.data(), b.value.data() + 3);
    if (t == 0) all = p;
    std::vector<double> g(w.grad.data(), w.grad.data() + 6);
    g.insert(g.end(), b.grad.data(), b.grad.data() + 3);
    ASSERT_TRUE(opt->Step().ok());
    ASSERT_TRUE((*flat)->Step(absl::MakeSpan(all), g).ok());
    opt->ZeroGrad();
    EXPECT_EQ(w.grad.norm(), 0.0);
  }
  for (int i = 0; i < 6; ++i) EXPECT_EQ(w.value.data()[i], all[i]);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(b.value.data()[i], all[6 + i]);
  EXPECT_EQ(opt->step_count(), 3);
  EXPECT_EQ(OptimizerStateBytes(o, 9), opt->state_bytes());
  EXPECT_EQ(ReplicatedStateBytes(o, 9).total(), 9 * 4 * sizeof(double));
  EXPECT_EQ(OptimizerStateBytes(OptimizerOptions::Sgd(0.1), 9), 0u);
  EXPECT_EQ(OptimizerStateBytes(OptimizerOptions::Sgd(0.1, 0.9), 9), 72u);
}

TEST(Optimizer, RejectsNullRepeatedAndResizedParameters) {
  Parameter w{"w", Matrix::Zero(2, 2)};
  EXPECT_THAT(Optimizer::Create(OptimizerOptions::Sgd(0.1), {&w, nullptr})
                  .status()
                  .message(),
              HasSubstr("parameter 1 is null"));
  EXPECT_THAT(Optimizer::Create(OptimizerOptions::Sgd(0.1), {&w, &w})
                  .status()
                  .message(),
              HasSubstr("'w') is listed twice"));
  auto opt = Optimizer::Create(OptimizerOptions::Sgd(0.1), {&w});
  ASSERT_TRUE(opt.ok());
  w.value = Matrix::Zero(3, 3);
  absl::Status s = opt->Step();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("'w' has 9 values"));
}

// A checkpoint restores mutable_state() and the step count: the restored
// optimizer's next step is the uninterrupted one's, bit for bit.
TEST(Optimizer, StateAndStepCountRestoreExactly) {
  for (const OptimizerOptions& o :
       {OptimizerOptions::AdamW(0.01), OptimizerOptions::Sgd(0.1, 0.9)}) {
    auto a = MakeFlatOptimizer(o, 3);
    auto b = MakeFlatOptimizer(o, 3);
    ASSERT_TRUE(a.ok() && b.ok());
    std::vector<double> va = {1.0, -2.0, 0.5};
    for (int t = 0; t < 3; ++t) {
      const std::vector<double> g = {0.1 * t, -0.3, 0.7 / (t + 1)};
      ASSERT_TRUE((*a)->Step(absl::MakeSpan(va), absl::MakeConstSpan(g)).ok());
    }
    auto from = (*a)->mutable_state();
    auto into = (*b)->mutable_state();
    ASSERT_EQ(from.size(), o.kind == OptimizerKind::kAdamW ? 2u : 1u);
    ASSERT_EQ(into.size(), from.size());
    for (size_t i = 0; i < from.size(); ++i) {
      EXPECT_EQ(from[i].first, into[i].first);
      std::copy(from[i].second.begin(), from[i].second.end(),
                into[i].second.begin());
    }
    (*b)->set_step_count((*a)->step_count());
    std::vector<double> vb = va;
    const std::vector<double> g = {0.2, 0.4, -0.1};
    ASSERT_TRUE((*a)->Step(absl::MakeSpan(va), absl::MakeConstSpan(g)).ok());
    ASSERT_TRUE((*b)->Step(absl::MakeSpan(vb), absl::MakeConstSpan(g)).ok());
    EXPECT_EQ(va, vb);
    EXPECT_EQ((*b)->step_count(), 4);
  }
  auto plain = MakeFlatOptimizer(OptimizerOptions::Sgd(0.1), 3);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE((*plain)->mutable_state().empty());
}

}  // namespace
}  // namespace vemesh::strategies
