// DataParallelTrainer (vemesh/strategies/data_parallel_trainer.h): each mode
// (DDP, ZeRO-1/2, HSDP) with SGD-momentum and AdamW trains a two-unit model
// on every rank's own gradients, and ends with the parameters of one serial
// optimizer fed the average gradient; AddTo names the state a checkpoint and
// an elastic mesh carry; bad input is a clear error on every rank.

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "strategies_test_util.h"
#include "vemesh/registry/ve_device_mesh.h"
#include "vemesh/strategies/data_parallel_trainer.h"
#include "vemesh/strategies/parameter_placement.h"
#include "vemesh/strategies/state_dict.h"

namespace vemesh::strategies {
namespace {

using testing::Close;
using testing::Deterministic;
using testing::InitMesh;
using testing::WorldRank;
using testing::WorldSize;

constexpr int kSteps = 3;
const std::vector<std::pair<int64_t, int64_t>> kShapes = {
    {3, 4}, {1, 4}, {4, 2}};
const std::vector<std::string> kNames = {"layer0.weight", "layer0.bias",
                                         "layer1.weight"};

// What rank `rank` computes as its gradient of parameter `i` at `step`.
Matrix Gradient(int rank, size_t i, int step) {
  return Deterministic(kShapes[i].first, kShapes[i].second,
                       0.3 * rank + 1.7 * static_cast<double>(i) + 0.11 * step);
}

// The serial run: one optimizer over the whole model, fed the mean of every
// rank's gradient.
std::vector<Matrix> Serial(const OptimizerOptions& options, int ranks) {
  std::vector<Parameter> params;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    params.emplace_back(
        kNames[i], Deterministic(kShapes[i].first, kShapes[i].second, 0.5 * i));
  }
  std::vector<Parameter*> ptrs;
  for (Parameter& p : params) ptrs.push_back(&p);
  auto opt = Optimizer::Create(options, ptrs);
  EXPECT_TRUE(opt.ok()) << opt.status();
  for (int step = 0; step < kSteps; ++step) {
    for (size_t i = 0; i < params.size(); ++i) {
      Matrix sum = Matrix::Zero(kShapes[i].first, kShapes[i].second);
      for (int r = 0; r < ranks; ++r) sum += Gradient(r, i, step);
      params[i].grad = sum / static_cast<double>(ranks);
    }
    EXPECT_TRUE(opt->Step().ok());
  }
  std::vector<Matrix> out;
  for (Parameter& p : params) out.push_back(p.value);
  return out;
}

struct Case {
  DataParallelMode mode;
  OptimizerOptions optimizer;
  ZeroStage zero_stage = ZeroStage::kTwo;
};

void TrainsAsSerial(const Case& c) {
  const int n = WorldSize();
  const int shard = n % 2 == 0 ? 2 : 1;
  if (c.mode == DataParallelMode::kDdp) {
    ASSERT_TRUE(InitMesh({n}, {"DP"}));
  } else {
    ASSERT_TRUE(InitMesh({n / shard, shard}, {"DP_REPLICATE", "DP_SHARD"}));
  }
  absl::StatusOr<DeviceMesh> mesh = VESCALE_DEVICE_MESH.get();
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  std::vector<Parameter> params;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    params.emplace_back(
        kNames[i], Deterministic(kShapes[i].first, kShapes[i].second, 0.5 * i));
  }
  TrainingState state;
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(state
                    .AddParameter(&params[i],
                                  WholePlacement(kNames[i], kShapes[i].first,
                                                 kShapes[i].second))
                    .ok());
  }
  auto trainer = DataParallelTrainer::Create(
      *mesh, {{"layer0", {&params[0], &params[1]}}, {"layer1", {&params[2]}}},
      {.mode = c.mode,
       .optimizer = c.optimizer,
       .zero_stage = c.zero_stage,
       .bucket_elements = 5});  // several buckets
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  DataParallelTrainer& t = **trainer;
  ASSERT_TRUE(t.AddTo(state).ok());
  for (int step = 0; step < kSteps; ++step) {
    ASSERT_TRUE(t.BeginStep().ok());
    // The backward pass: this rank's gradient into the gathered parameters.
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_EQ(params[i].grad.rows(), kShapes[i].first) << "step " << step;
      params[i].grad += Gradient(WorldRank(), i, step);
    }
    ASSERT_TRUE(t.AfterBackward().ok());
    ASSERT_TRUE(t.Step().ok());
  }
  const std::vector<Matrix> want = Serial(c.optimizer, n);
  std::vector<Matrix> got;
  if (t.fsdp() != nullptr) {
    for (size_t u = 0; u < 2; ++u) {
      auto full = t.fsdp()->FullParameters(u);
      ASSERT_TRUE(full.ok()) << full.status();
      for (Matrix& m : *full) got.push_back(std::move(m));
    }
  } else {
    for (Parameter& p : params) got.push_back(p.value);
  }
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(Close(got[i], want[i], 1e-12)) << kNames[i];
  }
  // The state a checkpoint saves: every parameter and its optimizer state.
  checkpoint::StateDict dict;
  ASSERT_TRUE(state.get_state_dict(&dict).ok());
  std::set<std::string> saved;
  for (const checkpoint::Piece& p : dict.pieces()) saved.insert(p.name);
  const std::vector<std::string> kinds =
      c.optimizer.kind == OptimizerKind::kAdamW
          ? std::vector<std::string>{"exp_avg", "exp_avg_sq"}
          : std::vector<std::string>{"momentum_buffer"};
  // AddTo named the optimizer's state: every rank holds a piece of each
  // kind (its shard of it, when sharded), under a parameter's name; sharded,
  // the first replica's ranks (the copy a checkpoint writes).
  const bool writes = c.mode == DataParallelMode::kDdp ||
                      (t.replicate_group() && t.replicate_group()->rank() == 0);
  for (const std::string& kind : writes ? kinds : std::vector<std::string>{}) {
    int pieces = 0;
    for (const std::string& name : kNames)
      pieces += saved.count(name + "." + kind);
    EXPECT_GT(pieces, 0) << kind;
  }
  auto entries = state.elastic_state();
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_FALSE(entries->empty());
  if (c.mode == DataParallelMode::kDdp) {
    EXPECT_EQ(t.shard_group(), nullptr);
  } else {
    ASSERT_NE(t.shard_group(), nullptr);
    EXPECT_EQ(t.shard_group()->size(), shard);
    EXPECT_EQ(t.replicate_group()->size(), n / shard);
  }
}

TEST(DataParallelTrainerTest, DdpSgdMomentumAsSerial) {
  TrainsAsSerial({DataParallelMode::kDdp, OptimizerOptions::Sgd(0.1, 0.9)});
}

TEST(DataParallelTrainerTest, DdpAdamWAsSerial) {
  TrainsAsSerial({DataParallelMode::kDdp, OptimizerOptions::AdamW(0.01)});
}

TEST(DataParallelTrainerTest, ZeroOneAdamWAsSerial) {
  TrainsAsSerial({DataParallelMode::kZero, OptimizerOptions::AdamW(0.01),
                  ZeroStage::kOne});
}

TEST(DataParallelTrainerTest, ZeroTwoSgdMomentumAsSerial) {
  TrainsAsSerial({DataParallelMode::kZero, OptimizerOptions::Sgd(0.1, 0.9)});
}

TEST(DataParallelTrainerTest, HsdpAdamWAsSerial) {
  TrainsAsSerial({DataParallelMode::kHsdp, OptimizerOptions::AdamW(0.01)});
}

TEST(DataParallelTrainerTest, HsdpSgdMomentumAsSerial) {
  TrainsAsSerial({DataParallelMode::kHsdp, OptimizerOptions::Sgd(0.1, 0.9)});
}

TEST(DataParallelTrainerBadInputTest, MissingDimensionAndNoUnitsNamed) {
  ASSERT_TRUE(InitMesh({WorldSize()}, {"DP"}));
  absl::StatusOr<DeviceMesh> mesh = VESCALE_DEVICE_MESH.get();
  ASSERT_TRUE(mesh.ok());
  Parameter p("w", Deterministic(2, 2, 0));
  auto hsdp = DataParallelTrainer::Create(*mesh, {{"layer0", {&p}}},
                                          {.mode = DataParallelMode::kHsdp});
  ASSERT_TRUE(absl::IsInvalidArgument(hsdp.status())) << hsdp.status();
  EXPECT_NE(hsdp.status().message().find("'DP_SHARD'"), std::string::npos)
      << hsdp.status();
  auto none = DataParallelTrainer::Create(*mesh, {}, {});
  ASSERT_TRUE(absl::IsInvalidArgument(none.status())) << none.status();
  EXPECT_NE(none.status().message().find("no units"), std::string::npos);
}

// A parameter listed in two units would be averaged and stepped twice:
// refused in every mode, naming the parameter and both units.
TEST(DataParallelTrainerBadInputTest, ParameterInTwoUnitsNamed) {
  const int n = WorldSize();
  const int shard = n % 2 == 0 ? 2 : 1;
  for (DataParallelMode mode : {DataParallelMode::kDdp, DataParallelMode::kZero,
                                DataParallelMode::kHsdp}) {
    if (mode == DataParallelMode::kDdp) {
      ASSERT_TRUE(InitMesh({n}, {"DP"}));
    } else {
      ASSERT_TRUE(InitMesh({n / shard, shard}, {"DP_REPLICATE", "DP_SHARD"}));
    }
    absl::StatusOr<DeviceMesh> mesh = VESCALE_DEVICE_MESH.get();
    ASSERT_TRUE(mesh.ok());
    Parameter w("fc.weight", Deterministic(2, 2, 0));
    Parameter b("fc.bias", Deterministic(1, 2, 1));
    auto twice = DataParallelTrainer::Create(
        *mesh, {{"encoder", {&w, &b}}, {"decoder", {&w}}}, {.mode = mode});
    ASSERT_TRUE(absl::IsInvalidArgument(twice.status())) << twice.status();
    const std::string message(twice.status().message());
    for (const char* name : {"'fc.weight'", "'encoder'", "'decoder'"}) {
      EXPECT_NE(message.find(name), std::string::npos)
          << name << " not in: " << message;
    }
    // Twice in one unit: said so, not "in 'encoder' and in 'encoder'".
    auto repeated = DataParallelTrainer::Create(
        *mesh, {{"encoder", {&w, &b, &w}}}, {.mode = mode});
    ASSERT_TRUE(absl::IsInvalidArgument(repeated.status()))
        << repeated.status();
    EXPECT_THAT(std::string(repeated.status().message()),
                ::testing::HasSubstr(
                    "parameter 'fc.weight' is listed twice in unit 'encoder'"));
  }
}

}  // namespace
}  // namespace vemesh::strategies
