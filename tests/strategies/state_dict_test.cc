// TrainingState (vemesh/strategies/state_dict.h) against a serial run: a
// two-layer model trained a few AdamW (or SGD-momentum) steps under FSDP
// (HYBRID_SHARD, FULL_SHARD), ZeRO or tensor parallelism is saved, then
// loaded under another factorisation or strategy, and the loaded values,
// optimizer moments and step counts must be the serial run's; one more step
// from the loaded state must match the serial one too. Bad input is
// InvalidArgument naming the value; the elastic entries point at the live
// buffers.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "strategies_test_util.h"
#include "vemesh/checkpoint/checkpoint.h"
#include "vemesh/comm/mpi/mpi_communicator.h"
#include "vemesh/mesh/device_mesh.h"
#include "vemesh/strategies/column_parallel_linear.h"
#include "vemesh/strategies/distributed_optimizer.h"
#include "vemesh/strategies/elastic_state.h"
#include "vemesh/strategies/fully_sharded_data_parallel.h"
#include "vemesh/strategies/optimizer.h"
#include "vemesh/strategies/parameter_placement.h"
#include "vemesh/strategies/periodic_checkpoint.h"
#include "vemesh/strategies/row_parallel_linear.h"
#include "vemesh/strategies/state_dict.h"
#include "vemesh/strategies/state_snapshot.h"

namespace vemesh::strategies {
namespace {

using checkpoint::Box;
using checkpoint::StateDict;
using testing::Close;
using testing::Deterministic;
using ::testing::HasSubstr;
using testing::InitMesh;
using testing::WorldSize;

constexpr int kSteps = 3;
// layer0: 6 -> 8 (column-parallel under TP), layer1: 8 -> 4 (row).
const std::vector<std::pair<int64_t, int64_t>> kShapes = {
    {6, 8}, {1, 8}, {8, 4}, {1, 4}};
const std::vector<std::string> kNames = {"layer0.weight", "layer0.bias",
                                         "layer1.weight", "layer1.bias"};

std::shared_ptr<Communicator> World() {
  auto world = MpiCommunicator::World();
  EXPECT_TRUE(world.ok()) << world.status();
  return *world;
}

// A fresh directory every rank names the same (rank 0 makes it).
std::string SharedTempDir(Communicator& comm) {
  char path[256] = {};
  if (comm.rank() == 0) {
    std::strcpy(path, "/tmp/vemesh_state_dict_test_XXXXXX");
    EXPECT_NE(::mkdtemp(path), nullptr);
  }
  EXPECT_TRUE(comm.broadcast(path, sizeof(path), DataType::kUInt8, 0).ok());
  return path;
}

void RemoveShared(Communicator& comm, const std::string& dir) {
  EXPECT_TRUE(comm.barrier().ok());
  if (comm.rank() == 0) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
}

// The serial model's initial values, and step `step`'s gradient of
// parameter `i` (the same on every rank: the DP average is itself).
Matrix Initial(size_t i) {
  return Deterministic(kShapes[i].first, kShapes[i].second, 1.0 + i) * 0.5;
}
Matrix Grad(size_t i, int step) {
  return Deterministic(kShapes[i].first, kShapes[i].second,
                       10.0 * step + 3.0 * i);
}

struct Model {
  std::vector<Parameter> params;
  explicit Model(bool initial) {
    for (size_t i = 0; i < kShapes.size(); ++i) {
      // Not initial: values that a load must replace.
      params.emplace_back(
          kNames[i],
          initial ? Initial(i)
                  : Matrix::Constant(kShapes[i].first, kShapes[i].second, 9.0));
    }
  }
  std::vector<Parameter*> all() {
    std::vector<Parameter*> out;
    for (Parameter& p : params) out.push_back(&p);
    return out;
  }
  std::vector<std::vector<Parameter*>> units() {
    return {{&params[0], &params[1]}, {&params[2], &params[3]}};
  }
};

absl::Status NameWhole(Model& m, TrainingState* state) {
  for (size_t i = 0; i < kShapes.size(); ++i) {
    VEMESH_RETURN_IF_ERROR(state->AddParameter(
        &m.params[i],
        WholePlacement(kNames[i], kShapes[i].first, kShapes[i].second)));
  }
  return absl::OkStatus();
}

// The serial run: `steps` steps of `options` from the initial values.
struct Serial {
  Model model{true};
  std::unique_ptr<Optimizer> opt;
  Serial(const OptimizerOptions& options, int steps) {
    opt = std::make_unique<Optimizer>(*Optimizer::Create(options, model.all()));
    for (int s = 0; s < steps; ++s) Step(s);
  }
  void Step(int s) {
    for (size_t i = 0; i < kShapes.size(); ++i)
      model.params[i].grad = Grad(i, s);
    EXPECT_TRUE(opt->Step().ok());
  }
  // Unit `u`'s values [begin, begin + count) of the concatenation, of the
  // parameters (state "") or of an optimizer state buffer.
  std::vector<double> Flat(size_t u, const std::string& state) {
    std::vector<double> out;
    for (size_t i = 2 * u; i < 2 * u + 2; ++i) {
      if (state.empty()) {
        const Matrix& v = model.params[i].value;
        out.insert(out.end(), v.data(), v.data() + v.size());
      } else {
        for (auto& [name, span] : opt->flat(i).mutable_state()) {
          if (name == state) out.insert(out.end(), span.begin(), span.end());
        }
      }
    }
    return out;
  }
};

// One FSDP step: the gradient `Grad(., s)` on every rank.
absl::Status FsdpStep(FullyShardedDataParallel& fsdp, Model& m, int s) {
  for (size_t u = fsdp.num_units(); u-- > 0;) {
    VEMESH_RETURN_IF_ERROR(fsdp.PreBackward(u));
    for (size_t i = 2 * u; i < 2 * u + 2; ++i) m.params[i].grad = Grad(i, s);
    VEMESH_RETURN_IF_ERROR(fsdp.PostBackward(u));
  }
  VEMESH_RETURN_IF_ERROR(fsdp.FinishBackward());
  VEMESH_RETURN_IF_ERROR(fsdp.OptimizerStep());
  fsdp.ZeroGrad();
  return absl::OkStatus();
}

absl::StatusOr<FullyShardedDataParallel> MakeFsdp(Model& m, int replicate,
                                                  int shard) {
  // HYBRID_SHARD over (replicate, shard), or FULL_SHARD over shard alone.
  FsdpOptions options{.sharding_strategy = ShardingStrategy::kFullShard,
                      .shard_dims = {"shard"}};
  absl::StatusOr<DeviceMesh> mesh;
  if (replicate > 1) {
    options.sharding_strategy = ShardingStrategy::kHybridShard;
    options.replicate_dims = {"replicate"};
    mesh = init_device_mesh("cpu", {replicate, shard}, {"replicate", "shard"});
  } else {
    mesh = init_device_mesh("cpu", {shard}, {"shard"});
  }
  if (!mesh.ok()) return mesh.status();
  std::vector<FsdpUnit> units;
  std::vector<std::vector<Parameter*>> ps = m.units();
  for (size_t u = 0; u < ps.size(); ++u) {
    units.push_back({"unit" + std::to_string(u), ps[u]});
  }
  return FullyShardedDataParallel::Create(*mesh, std::move(units),
                                          std::move(options));
}

// This rank's FSDP shards (values and AdamW moments) are the serial run's.
void ExpectFsdpMatches(FullyShardedDataParallel& fsdp, Serial& serial,
                       int64_t steps) {
  for (size_t u = 0; u < fsdp.num_units(); ++u) {
    const size_t begin = fsdp.shard_elements(u) * fsdp.shard_rank();
    absl::Span<const double> shard = fsdp.local_shard(u);
    const std::vector<double> want = serial.Flat(u, "");
    for (size_t k = 0; k < shard.size(); ++k) {
      ASSERT_NEAR(shard[k], want[begin + k], 1e-12) << "unit " << u << " " << k;
    }
    ASSERT_NE(fsdp.optimizer(u), nullptr);
    EXPECT_EQ(fsdp.optimizer(u)->step_count(), steps);
    for (auto& [name, span] : fsdp.optimizer(u)->mutable_state()) {
      const std::vector<double> m = serial.Flat(u, name);
      for (size_t k = 0; k < span.size(); ++k) {
        ASSERT_NEAR(span[k], m[begin + k], 1e-12) << name << " " << u;
      }
    }
  }
}

// Whole parameters and an Optimizer's state are the serial run's.
void ExpectWholeMatches(Model& m, Optimizer& opt, Serial& serial,
                        int64_t steps) {
  for (size_t i = 0; i < kShapes.size(); ++i) {
    EXPECT_TRUE(Close(m.params[i].value, serial.model.params[i].value, 1e-12))
        << kNames[i];
    EXPECT_EQ(opt.flat(i).step_count(), steps);
    auto got = opt.flat(i).mutable_state();
    auto want = serial.opt->flat(i).mutable_state();
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < got.size(); ++k) {
      for (size_t j = 0; j < got[k].second.size(); ++j) {
        ASSERT_NEAR(got[k].second[j], want[k].second[j], 1e-12)
            << kNames[i] << "." << got[k].first;
      }
    }
  }
  EXPECT_EQ(opt.step_count(), steps);
}

// Loads into a fresh replicated model and Optimizer (DataParallel's
// shape): parameters, moments and step counts against `serial`.
void LoadWholeAndCompare(const std::string& dir, Communicator& world,
                         const OptimizerOptions& options, Serial& serial) {
  Model m(false);
  TrainingState state;
  ASSERT_TRUE(NameWhole(m, &state).ok());
  absl::StatusOr<Optimizer> opt = Optimizer::Create(options, m.all());
  ASSERT_TRUE(opt.ok());
  ASSERT_TRUE(state.AddOptimizer(*opt).ok());
  StateDict dict;
  ASSERT_TRUE(state.get_state_dict(&dict).ok());
  absl::StatusOr<checkpoint::LoadResult> r = checkpoint::Load(dict, dir, world);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(state.set_state_dict().ok());
  ExpectWholeMatches(m, *opt, serial, kSteps);
}

// FSDP + AdamW saved on (replicate, shard), loaded on every other
// factorisation of the job (and on the same), and into whole parameters.
void FsdpRoundTrip(int save_replicate) {
  const int n = WorldSize();
  auto world = World();
  const std::string dir = SharedTempDir(*world);
  const OptimizerOptions adam = OptimizerOptions::AdamW(0.01);
  Serial serial(adam, kSteps);
  {
    Model m(true);
    TrainingState state;
    ASSERT_TRUE(NameWhole(m, &state).ok());
    absl::StatusOr<FullyShardedDataParallel> fsdp =
        MakeFsdp(m, save_replicate, n / save_replicate);
    ASSERT_TRUE(fsdp.ok()) << fsdp.status();
    ASSERT_TRUE(fsdp->SetOptimizer(adam).ok());
    ASSERT_TRUE(state.AddFsdp(*fsdp, m.units()).ok());
    for (int s = 0; s < kSteps; ++s) ASSERT_TRUE(FsdpStep(*fsdp, m, s).ok());
    ExpectFsdpMatches(*fsdp, serial, kSteps);
    StateDict dict;
    absl::Status got = state.get_state_dict(&dict);
    ASSERT_TRUE(got.ok()) << got;
    ASSERT_TRUE(checkpoint::Save(dict, kSteps, dir, *world).ok());
  }
  for (int replicate = 1; replicate <= n; replicate *= 2) {
    SCOPED_TRACE(::testing::Message() << "load on replicate=" << replicate);
    // The model first (FSDP shards the values it finds), then the optimizer.
    Model m(false);
    {
      TrainingState params;
      ASSERT_TRUE(NameWhole(m, &params).ok());
      StateDict dict;
      ASSERT_TRUE(params.get_state_dict(&dict, StateDictParts::kModel).ok());
      ASSERT_TRUE(checkpoint::Load(dict, dir, *world).ok());
    }
    absl::StatusOr<FullyShardedDataParallel> fsdp =
        MakeFsdp(m, replicate, n / replicate);
    ASSERT_TRUE(fsdp.ok()) << fsdp.status();
    ASSERT_TRUE(fsdp->SetOptimizer(adam).ok());
    TrainingState state;
    ASSERT_TRUE(NameWhole(m, &state).ok());
    ASSERT_TRUE(state.AddFsdp(*fsdp, m.units()).ok());
    StateDict dict;
    ASSERT_TRUE(state.get_state_dict(&dict, StateDictParts::kOptimizer).ok());
    absl::StatusOr<checkpoint::LoadResult> r =
        checkpoint::Load(dict, dir, *world);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step, kSteps);
    ASSERT_TRUE(state.set_state_dict().ok());
    ExpectFsdpMatches(*fsdp, serial, kSteps);
    // The loaded state trains on as the serial one (bias correction too).
    ASSERT_TRUE(FsdpStep(*fsdp, m, kSteps).ok());
    Serial next(adam, kSteps + 1);
    ExpectFsdpMatches(*fsdp, next, kSteps + 1);
  }
  LoadWholeAndCompare(dir, *world, adam, serial);
  RemoveShared(*world, dir);
}

TEST(StateDictTest, HybridShardAdamWLoadsOnEveryFactorisation) {
  FsdpRoundTrip(WorldSize() >= 2 ? 2 : 1);
}

TEST(StateDictTest, FullShardAdamWLoadsOnEveryFactorisation) {
  FsdpRoundTrip(1);
}

// ZeRO over the whole world as DP, loaded onto ZeRO over half of it (DP of
// a DP x TP mesh: another shard layout) and onto whole parameters.
TEST(StateDictTest, ZeroShardsLoadOnAnotherDpSize) {
  const int n = WorldSize();
  auto world = World();
  const std::string dir = SharedTempDir(*world);
  const OptimizerOptions adam = OptimizerOptions::AdamW(0.01);
  Serial serial(adam, kSteps);
  {
    ASSERT_TRUE(InitMesh({n}, {"DP"}));
    Model m(true);
    TrainingState state;
    ASSERT_TRUE(NameWhole(m, &state).ok());
    auto zero = DistributedOptimizer::Create({.optimizer = adam}, m.all());
    ASSERT_TRUE(zero.ok()) << zero.status();
    ASSERT_TRUE(state.AddDistributedOptimizer(**zero, m.all()).ok());
    for (int s = 0; s < kSteps; ++s) {
      for (size_t i = 0; i < kShapes.size(); ++i) m.params[i].grad = Grad(i, s);
      ASSERT_TRUE((*zero)->Step().ok());
      (*zero)->ZeroGrad();
    }
    StateDict dict;
    ASSERT_TRUE(state.get_state_dict(&dict).ok());
    ASSERT_TRUE(checkpoint::Save(dict, kSteps, dir, *world).ok());
  }
  {
    ASSERT_TRUE(n == 1 ? InitMesh({1}, {"DP"})
                       : InitMesh({n / 2, 2}, {"DP", "TP"}));
    Model m(false);
    {
      TrainingState params;
      ASSERT_TRUE(NameWhole(m, &params).ok());
      StateDict dict;
      ASSERT_TRUE(params.get_state_dict(&dict, StateDictParts::kModel).ok());
      ASSERT_TRUE(checkpoint::Load(dict, dir, *world).ok());
    }
    auto zero = DistributedOptimizer::Create({.optimizer = adam}, m.all());
    ASSERT_TRUE(zero.ok()) << zero.status();
    TrainingState state;
    ASSERT_TRUE(NameWhole(m, &state).ok());
    ASSERT_TRUE(state.AddDistributedOptimizer(**zero, m.all()).ok());
    StateDict dict;
    ASSERT_TRUE(state.get_state_dict(&dict, StateDictParts::kOptimizer).ok());
    ASSERT_TRUE(checkpoint::Load(dict, dir, *world).ok());
    ASSERT_TRUE(state.set_state_dict().ok());
    EXPECT_EQ((*zero)->step_count(), kSteps);
    // The shard's moments are the serial ones at its offset.
    const size_t begin = (*zero)->shard_size() * (*zero)->dp_rank();
    std::vector<double> m1, m2;
    for (size_t i = 0; i < kShapes.size(); ++i) {
      for (auto& [name, span] : serial.opt->flat(i).mutable_state()) {
        (name == "exp_avg" ? m1 : m2)
            .insert((name == "exp_avg" ? m1 : m2).end(), span.begin(),
                    span.end());
      }
      EXPECT_TRUE(
          Close(m.params[i].value, serial.model.params[i].value, 1e-12));
    }
    for (auto& [name, span] : (*zero)->shard_optimizer().mutable_state()) {
      const std::vector<double>& want = name == "exp_avg" ? m1 : m2;
      for (size_t k = 0; k < span.size() && begin + k < want.size(); ++k) {
        ASSERT_NEAR(span[k], want[begin + k], 1e-12) << name << " " << k;
      }
    }
    // One more step from the loaded state is the serial run's.
    for (size_t i = 0; i < kShapes.size(); ++i) {
      m.params[i].grad = Grad(i, kSteps);
    }
    ASSERT_TRUE((*zero)->Step().ok());
    Serial next(adam, kSteps + 1);
    for (size_t i = 0; i < kShapes.size(); ++i) {
      EXPECT_TRUE(Close(m.params[i].value, next.model.params[i].value, 1e-12))
          << kNames[i];
    }
  }
  LoadWholeAndCompare(dir, *world, adam, serial);
  RemoveShared(*world, dir);
}

// A column- and a row-parallel layer over TP = the world, SGD with
// momentum, saved as TP blocks and loaded whole.
TEST(StateDictTest, TensorParallelLayersLoadWhole) {
  const int n = WorldSize();
  auto world = World();
  ASSERT_TRUE(InitMesh({n}, {"TP"}));
  const std::string dir = SharedTempDir(*world);
  const OptimizerOptions sgd = OptimizerOptions::Sgd(0.05, 0.9);
  Serial serial(sgd, kSteps);
  {
    auto fc0 = ColumnParallelLinear::Create("fc0", Initial(0), Initial(1));
    auto fc1 = RowParallelLinear::Create("fc1", Initial(2), Initial(3));
    ASSERT_TRUE(fc0.ok() && fc1.ok());
    TrainingState state;
    ASSERT_TRUE(state.AddColumnParallel("layer0", *fc0).ok());
    ASSERT_TRUE(state.AddRowParallel("layer1", *fc1).ok());
    std::vector<Parameter*> ps = fc0->parameters();
    for (Parameter* p : fc1->parameters()) ps.push_back(p);
    auto opt = Optimizer::Create(sgd, ps);
    ASSERT_TRUE(opt.ok());
    ASSERT_TRUE(state.AddOptimizer(*opt).ok());
    const int64_t c = fc0->shard().begin(), cn = fc0->shard().size();
    const int64_t r = fc1->shard().begin(), rn = fc1->shard().size();
    for (int s = 0; s < kSteps; ++s) {
      // Each rank's block of the serial gradient.
      fc0->weight().grad = Grad(0, s).middleCols(c, cn);
      fc0->bias().grad = Grad(1, s).middleCols(c, cn);
      fc1->weight().grad = Grad(2, s).middleRows(r, rn);
      fc1->bias().grad = Grad(3, s);
      ASSERT_TRUE(opt->Step().ok());
    }
    StateDict dict;
    ASSERT_TRUE(state.get_state_dict(&dict).ok());
    ASSERT_TRUE(checkpoint::Save(dict, kSteps, dir, *world).ok());
  }
  LoadWholeAndCompare(dir, *world, sgd, serial);
  RemoveShared(*world, dir);
}

// -- Local: placements, bad input, the elastic entries ---------------------

TEST(ParameterPlacementTest, HeaderExampleBoxes) {
  auto col = ColumnParallelPlacements("layer0", 64, 128, 1, 4);
  ASSERT_TRUE(col.ok());
  EXPECT_EQ((*col)[0].box, (Box{{0, 32}, {64, 32}}));
  EXPECT_EQ((*col)[1].box, (Box{{0, 32}, {1, 32}}));
  auto row = RowParallelPlacements("layer1", 128, 64, 1, 4);
  ASSERT_TRUE(row.ok());
  EXPECT_EQ((*row)[0].box, (Box{{32, 0}, {32, 64}}));
  EXPECT_EQ((*row)[1].box, (Box{{0, 0}, {1, 64}}));
  auto pieces = FlatRunPieces(*col, 2000, 64);
  ASSERT_TRUE(pieces.ok());
  ASSERT_EQ(pieces->size(), 3u);
  EXPECT_EQ((*pieces)[0].box, (Box{{62, 48}, {1, 16}}));
  EXPECT_EQ((*pieces)[1].box, (Box{{63, 32}, {1, 32}}));
  EXPECT_EQ((*pieces)[2].placement, 1u);
  EXPECT_EQ((*pieces)[2].box, (Box{{0, 32}, {1, 16}}));
  EXPECT_EQ((*pieces)[2].offset, 48);
  auto past = FlatRunPieces(*col, 2000, 100);
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(past.status().message(), HasSubstr("[2000, 2100)"));
  auto odd = ColumnParallelPlacements("layer0", 64, 126, 1, 4);
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(odd.status().message(), HasSubstr("126 output features"));
}

TEST(StateDictTest, WholeParametersAreNamedByTheirNamesAndShapes) {
  Parameter w("moe.expert3.weight", Matrix::Zero(4, 2));
  Parameter b("moe.expert3.bias", Matrix::Zero(1, 2));
  TrainingState state;
  ASSERT_TRUE(state.AddWholeParameters({&w, &b}).ok());
  checkpoint::StateDict dict;
  ASSERT_TRUE(state.get_state_dict(&dict, StateDictParts::kModel).ok());
  ASSERT_EQ(dict.pieces().size(), 2u);
  EXPECT_EQ(dict.pieces()[0].name, "moe.expert3.weight");
  EXPECT_EQ(dict.pieces()[0].global_shape, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(dict.pieces()[0].box, (Box{{0, 0}, {4, 2}}));
  EXPECT_EQ(dict.pieces()[1].name, "moe.expert3.bias");
  EXPECT_EQ(dict.pieces()[1].global_shape, (std::vector<int64_t>{1, 2}));

  // A null one, and one FSDP freed (its shape is gone): named.
  TrainingState other;
  absl::Status s = other.AddWholeParameters({nullptr});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("null parameter"));
  Parameter freed("layer0.weight", Matrix());
  s = other.AddWholeParameters({&freed});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("layer0.weight is freed"));
}

TEST(StateDictBadInputTest, TwoPiecesWithOneName) {
  Parameter a("a", Matrix::Zero(2, 3)), b("b", Matrix::Zero(2, 3));
  TrainingState state;
  ASSERT_TRUE(state.AddParameter(&a, WholePlacement("w", 2, 3)).ok());
  absl::Status s = state.AddParameter(&b, WholePlacement("w", 2, 3));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'w' is added twice"));
  s = state.AddParameter(&a, WholePlacement("v", 2, 3));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'a' is added twice"));
}

TEST(StateDictBadInputTest, BoxOutsideTheGlobalShape) {
  Parameter a("a", Matrix::Zero(2, 3));
  TrainingState state;
  absl::Status s = state.AddParameter(&a, {"w", {4, 4}, Box{{3, 0}, {2, 3}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'w': box [3:5, 0:3]"));
  EXPECT_THAT(s.message(), HasSubstr("[4, 4]"));
  // A value whose shape is not its box.
  s = state.AddParameter(&a, {"w", {4, 4}, Box{{0, 0}, {2, 2}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'w' is 2x3 on this rank"));
}

TEST(StateDictBadInputTest, OptimizerOverAParameterNotAdded) {
  Parameter a("a", Matrix::Zero(2, 3)), b("b", Matrix::Zero(1, 3));
  TrainingState state;
  ASSERT_TRUE(state.AddParameter(&a, WholePlacement("a", 2, 3)).ok());
  auto opt = Optimizer::Create(OptimizerOptions::Sgd(0.1), {&a, &b});
  ASSERT_TRUE(opt.ok());
  absl::Status s = state.AddOptimizer(*opt);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'b', which was not added"));
  auto one = Optimizer::Create(OptimizerOptions::Sgd(0.1), {&a});
  auto two = Optimizer::Create(OptimizerOptions::Sgd(0.1), {&a});
  ASSERT_TRUE(state.AddOptimizer(*one).ok());
  s = state.AddOptimizer(*two);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'a', which another optimizer"));
}

TEST(StateDictStepsTest, SetStateDictAppliesOnlyListedStepCounts) {
  Parameter a("a", Matrix::Zero(2, 3));
  TrainingState state;
  ASSERT_TRUE(state.AddParameter(&a, WholePlacement("a", 2, 3)).ok());
  auto opt = Optimizer::Create(OptimizerOptions::AdamW(0.1), {&a});
  ASSERT_TRUE(opt.ok());
  ASSERT_TRUE(state.AddOptimizer(*opt).ok());
  opt->set_step_count(5);
  StateDict all;
  ASSERT_TRUE(state.get_state_dict(&all).ok());
  // a, a.exp_avg, a.exp_avg_sq, a.step (an I64 scalar holding 5).
  ASSERT_EQ(all.pieces().size(), 4u);
  const checkpoint::Piece& step = all.pieces().back();
  EXPECT_EQ(step.name, "a.step");
  EXPECT_TRUE(step.global_shape.empty());
  EXPECT_EQ(*static_cast<int64_t*>(step.data), 5);
  *static_cast<int64_t*>(step.data) = 7;  // as a Load would
  ASSERT_TRUE(state.set_state_dict().ok());
  EXPECT_EQ(opt->step_count(), 7);
  // A model-only dict lists no counts, and applies none.
  StateDict model;
  ASSERT_TRUE(state.get_state_dict(&model, StateDictParts::kModel).ok());
  EXPECT_EQ(model.pieces().size(), 1u);
  opt->set_step_count(9);
  ASSERT_TRUE(state.set_state_dict().ok());
  EXPECT_EQ(opt->step_count(), 9);
}

TEST(StateDictElasticTest, EntriesAreTheLiveBuffersAndTheStepCounts) {
  Parameter a("a", Deterministic(2, 3, 1.0)), b("b", Deterministic(1, 3, 2));
  TrainingState state;
  ASSERT_TRUE(
      state.AddParameter(&a, WholePlacement("layer0.weight", 2, 3)).ok());
  ASSERT_TRUE(state.AddParameter(&b, WholePlacement("layer0.bias", 1, 3)).ok());
  auto opt = Optimizer::Create(OptimizerOptions::AdamW(0.1), {&a, &b});
  ASSERT_TRUE(opt.ok());
  ASSERT_TRUE(state.AddOptimizer(*opt).ok());
  a.grad.setConstant(1.0);
  b.grad.setConstant(2.0);
  ASSERT_TRUE(opt->Step().ok());
  absl::StatusOr<std::vector<ElasticStateEntry>> entries =
      state.elastic_state();
  ASSERT_TRUE(entries.ok()) << entries.status();
  std::vector<std::string> names;
  for (const ElasticStateEntry& e : *entries) names.push_back(e.name);
  EXPECT_THAT(names,
              ::testing::ElementsAre(
                  "layer0.weight", "layer0.bias", "layer0.weight.exp_avg",
                  "layer0.weight.exp_avg_sq", "layer0.bias.exp_avg",
                  "layer0.bias.exp_avg_sq", "optimizer.steps"));
  // Live: the parameter's own storage, and the optimizer's.
  absl::Span<char> w = (*entries)[0].bytes();
  EXPECT_EQ(w.data(), reinterpret_cast<char*>(a.value.data()));
  EXPECT_EQ(w.size(), 6 * sizeof(double));
  absl::Span<char> m = (*entries)[2].bytes();
  EXPECT_EQ(m.data(), reinterpret_cast<char*>(
                          opt->flat(0).mutable_state()[0].second.data()));
  // The step counts: out, cleared, back in.
  const ElasticStateEntry& steps = entries->back();
  ASSERT_FALSE(steps.bytes);
  absl::StatusOr<std::string> saved = steps.state_dict();
  ASSERT_TRUE(saved.ok());
  EXPECT_EQ(saved->size(), 2 * sizeof(int64_t));
  opt->set_step_count(0);
  ASSERT_TRUE(steps.load_state_dict(*saved).ok());
  EXPECT_EQ(opt->flat(1).step_count(), 1);
  EXPECT_EQ(opt->step_count(), 1);
  EXPECT_EQ(steps.load_state_dict("x").code(),
            absl::StatusCode::kInvalidArgument);
}

// A step undone (an elastic step that did not commit): the parameters, the
// AdamW moments and the step counts are back as they were at Save, and the
// redone step gives what the first one gave.
TEST(StateSnapshotTest, RestoreUndoesAStepParametersMomentsAndCounts) {
  Parameter a("a", Deterministic(2, 3, 1.0)), b("b", Deterministic(1, 3, 2));
  TrainingState state;
  ASSERT_TRUE(
      state.AddParameter(&a, WholePlacement("layer0.weight", 2, 3)).ok());
  ASSERT_TRUE(state.AddParameter(&b, WholePlacement("layer0.bias", 1, 3)).ok());
  auto opt = Optimizer::Create(OptimizerOptions::AdamW(0.1), {&a, &b});
  ASSERT_TRUE(opt.ok());
  ASSERT_TRUE(state.AddOptimizer(*opt).ok());
  StateSnapshot before;
  EXPECT_EQ(before.Restore(state).code(),
            absl::StatusCode::kFailedPrecondition);
  const auto step = [&] {
    a.grad.setConstant(1.0);
    b.grad.setConstant(-2.0);
    return opt->Step();
  };
  ASSERT_TRUE(step().ok());
  ASSERT_TRUE(before.Save(state).ok());
  const Matrix a1 = a.value;
  const std::vector<double> m1(opt->flat(0).mutable_state()[0].second.begin(),
                               opt->flat(0).mutable_state()[0].second.end());
  ASSERT_TRUE(step().ok());
  const Matrix a2 = a.value;
  ASSERT_NE(a2, a1);
  ASSERT_EQ(opt->step_count(), 2);
  ASSERT_TRUE(before.Restore(state).ok());
  EXPECT_EQ(a.value, a1);
  absl::Span<double> m = opt->flat(0).mutable_state()[0].second;
  EXPECT_EQ(std::vector<double>(m.begin(), m.end()), m1);
  EXPECT_EQ(opt->step_count(), 1);
  EXPECT_EQ(opt->flat(1).step_count(), 1);
  ASSERT_TRUE(step().ok());  // redone: bit-identical (bias correction too)
  EXPECT_EQ(a.value, a2);
  EXPECT_GT(before.bytes(), 0u);
  // A buffer of another size since Save: nothing written.
  a.value = Matrix::Zero(3, 3);
  EXPECT_TRUE(absl::IsInvalidArgument(before.Restore(state)));
}

// The elastic loop saves before every step with one StateSnapshot (its
// buffers kept across steps): each Restore gives the state of the latest
// Save (values, AdamW moments, step counts), a state that grew since (an
// Add*) is listed again, a Restore into another TrainingState naming the
// same buffers works, and a failed Save leaves nothing to Restore.
TEST(StateSnapshotTest, KeptAcrossStepsFollowsTheLatestSaveAndStateChanges) {
  Parameter a("a", Deterministic(2, 3, 1.0));
  TrainingState state;
  ASSERT_TRUE(
      state.AddParameter(&a, WholePlacement("layer0.weight", 2, 3)).ok());
  auto opt = Optimizer::Create(OptimizerOptions::AdamW(0.1), {&a});
  ASSERT_TRUE(opt.ok());
  ASSERT_TRUE(state.AddOptimizer(*opt).ok());
  const auto step = [&](double g) {
    a.grad.setConstant(g);
    return opt->Step();
  };
  const auto moments = [&] {
    std::vector<std::vector<double>> out;
    for (auto& [name, values] : opt->flat(0).mutable_state()) {
      out.emplace_back(values.begin(), values.end());
    }
    return out;
  };
  StateSnapshot before;
  for (int k = 0; k < 5; ++k) {
    ASSERT_TRUE(before.Save(state).ok());
    const Matrix saved = a.value;
    const auto saved_moments = moments();
    ASSERT_TRUE(step(1.0 + k).ok());
    ASSERT_TRUE(before.Restore(state).ok()) << "step " << k;
    EXPECT_EQ(a.value, saved) << "step " << k;
    EXPECT_EQ(moments(), saved_moments) << "step " << k;  // AdamW's m and v
    EXPECT_EQ(opt->step_count(), k) << "step " << k;
    ASSERT_TRUE(step(1.0 + k).ok());  // the step redone, then kept
  }
  // The state grows: the next Save lists it again.
  Parameter c("c", Deterministic(1, 3, 3.0));
  ASSERT_TRUE(state.AddParameter(&c, WholePlacement("head.weight", 1, 3)).ok());
  ASSERT_TRUE(before.Save(state).ok());
  const Matrix c0 = c.value;
  c.value.setConstant(-1.0);
  ASSERT_TRUE(before.Restore(state).ok());
  EXPECT_EQ(c.value, c0);
  // Another TrainingState over the same buffers, named alike.
  TrainingState twin;
  ASSERT_TRUE(
      twin.AddParameter(&a, WholePlacement("layer0.weight", 2, 3)).ok());
  ASSERT_TRUE(twin.AddOptimizer(*opt).ok());
  ASSERT_TRUE(twin.AddParameter(&c, WholePlacement("head.weight", 1, 3)).ok());
  c.value.setConstant(-2.0);
  ASSERT_TRUE(before.Restore(twin).ok());
  EXPECT_EQ(c.value, c0);
  // A Save that fails leaves nothing to Restore, never a mix of two steps.
  a.value = Matrix::Zero(3, 3);
  EXPECT_FALSE(before.Save(state).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(before.Restore(state)));
}

// Periodic checkpoints (periodic_checkpoint.h): AdamW trained 6 steps with a
// save every 2, in the background; each AfterStep commits the save before
// it; the job restarted fresh resumes from the latest with the parameters,
// the moments and the step counts as trained (one more step equals the
// serial run's); a checkpoint of another model is refused by its identity.
TEST(PeriodicCheckpointTest, SavesInTheBackgroundAndAFreshJobResumes) {
  auto world = World();
  const std::string dir = SharedTempDir(*world);
  const OptimizerOptions adam = OptimizerOptions::AdamW(0.01);
  const PeriodicCheckpointOptions options{
      .dir = dir, .every = 2, .keep_last = 2, .identity = {{"model", "m1"}}};
  {
    Model m(true);
    TrainingState state;
    ASSERT_TRUE(NameWhole(m, &state).ok());
    auto opt = Optimizer::Create(adam, m.all());
    ASSERT_TRUE(opt.ok());
    ASSERT_TRUE(state.AddOptimizer(*opt).ok());
    auto ckpt = PeriodicCheckpoint::Create(world, options);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    auto start = (*ckpt)->Restore(state);
    ASSERT_TRUE(start.ok()) << start.status();
    EXPECT_EQ(*start, 0);  // an empty directory: a fresh start
    std::vector<std::optional<int64_t>> committed;
    for (int s = 0; s < 6; ++s) {
      for (size_t i = 0; i < kShapes.size(); ++i) m.params[i].grad = Grad(i, s);
      ASSERT_TRUE(opt->Step().ok());
      auto saved = (*ckpt)->AfterStep(state, s + 1, /*writer=*/true);
      ASSERT_TRUE(saved.ok()) << saved.status();
      committed.push_back(*saved);
    }
    EXPECT_THAT(committed,
                ::testing::ElementsAre(std::nullopt, std::nullopt, std::nullopt,
                                       2, std::nullopt, 4));
    auto last = (*ckpt)->Finish();
    ASSERT_TRUE(last.ok()) << last.status();
    EXPECT_EQ(*last, 6);
  }
  auto latest = checkpoint::LatestStep(dir);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, 6);
  {
    Model m(false);
    TrainingState state;
    ASSERT_TRUE(NameWhole(m, &state).ok());
    auto opt = Optimizer::Create(adam, m.all());
    ASSERT_TRUE(opt.ok());
    ASSERT_TRUE(state.AddOptimizer(*opt).ok());
    auto ckpt = PeriodicCheckpoint::Create(world, options);
    ASSERT_TRUE(ckpt.ok());
    auto start = (*ckpt)->Restore(state);
    ASSERT_TRUE(start.ok()) << start.status();
    EXPECT_EQ(*start, 6);
    ASSERT_TRUE((*ckpt)->restored().has_value());
    EXPECT_EQ((*ckpt)->restored()->metadata.at("data_position"), "6");
    Serial serial(adam, 6);
    for (size_t i = 0; i < kShapes.size(); ++i) {
      EXPECT_EQ(m.params[i].value, serial.model.params[i].value) << kNames[i];
    }
    EXPECT_EQ(opt->step_count(), 6);
    // One more step from the loaded moments and counts is the serial one.
    serial.Step(6);
    for (size_t i = 0; i < kShapes.size(); ++i) m.params[i].grad = Grad(i, 6);
    ASSERT_TRUE(opt->Step().ok());
    for (size_t i = 0; i < kShapes.size(); ++i) {
      EXPECT_EQ(m.params[i].value, serial.model.params[i].value) << kNames[i];
    }
  }
  {
    Model m(false);
    TrainingState state;
    ASSERT_TRUE(NameWhole(m, &state).ok());
    PeriodicCheckpointOptions other = options;
    other.identity = {{"model", "m2"}};
    auto ckpt = PeriodicCheckpoint::Create(world, other);
    ASSERT_TRUE(ckpt.ok());
    absl::StatusOr<int64_t> start = (*ckpt)->Restore(state);
    EXPECT_EQ(start.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(start.status().message(),
                HasSubstr("its 'model' is 'm1'; this one's is 'm2'"));
    // Refused before any buffer was written (inside the load, from the one
    // manifest it read).
    for (const Parameter& p : m.params) {
      EXPECT_TRUE((p.value.array() == 9.0).all()) << p.name;
    }
  }
  RemoveShared(*world, dir);
}

// One copy of the model saves together: a writer flag that differs across
// its ranks is InvalidArgument on every rank (before, the ranks with the
// flag started a collective save alone: a hang).
TEST(PeriodicCheckpointTest, AWriterFlagThatDiffersIsAnErrorOnEveryRank) {
  auto world = World();
  const std::string dir = SharedTempDir(*world);
  Model m(true);
  TrainingState state;
  ASSERT_TRUE(NameWhole(m, &state).ok());
  auto ckpt = PeriodicCheckpoint::Create(world, {.dir = dir, .every = 1});
  ASSERT_TRUE(ckpt.ok());
  auto saved = (*ckpt)->AfterStep(state, 1, /*writer=*/world->rank() == 0);
  if (world->size() == 1) {
    ASSERT_TRUE(saved.ok()) << saved.status();  // one rank: it agrees
    EXPECT_TRUE((*ckpt)->Finish().ok());
  } else {
    EXPECT_EQ(saved.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(saved.status().message(),
                HasSubstr("`writer` differs across the ranks of one copy"));
  }
  RemoveShared(*world, dir);
}

TEST(PeriodicCheckpointTest, BadOptionsAreNamed) {
  auto world = World();
  EXPECT_THAT(PeriodicCheckpoint::Create(world, {.dir = "/tmp/x", .every = -1})
                  .status()
                  .message(),
              HasSubstr("options.every is -1"));
  EXPECT_THAT(PeriodicCheckpoint::Create(world, {.dir = ""}).status().message(),
              HasSubstr("options.dir is empty"));
  EXPECT_THAT(
      PeriodicCheckpoint::Create(world, {.dir = "/tmp/x", .keep_last = 0})
          .status()
          .message(),
      HasSubstr("options.keep_last is 0"));
  EXPECT_THAT(
      PeriodicCheckpoint::Create(nullptr, {.dir = "/tmp/x"}).status().message(),
      HasSubstr("world is null"));
}

}  // namespace
}  // namespace vemesh::strategies
