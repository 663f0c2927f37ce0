// What every training job checks at its ends, as a user writes it with a
// small MLP of its own (two Linear layers, plain SGD, one process):
// - the checkpoint metadata and the resume check
//   (vemesh/strategies/training_metadata.h): a checkpoint saved with the
//   run's identity resumes; another model, a data position that is not the
//   step, or no steps left is InvalidArgument naming the checkpoint and
//   what differs;
// - the loss curve against a reference (loss_curve.h) and the elastic
//   run's one-line verdict (elastic_verdict.h).
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/checkpoint/checkpoint.h"
#include "vemesh/comm/mpi/mpi_communicator.h"
#include "vemesh/strategies/elastic_verdict.h"
#include "vemesh/strategies/linear.h"
#include "vemesh/strategies/loss_curve.h"
#include "vemesh/strategies/optimizer.h"
#include "vemesh/strategies/parameter_placement.h"
#include "vemesh/strategies/state_dict.h"
#include "vemesh/strategies/training_metadata.h"

namespace vemesh::strategies {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The user's model: 3 -> 4 -> 2, tanh between, squared error.
struct Mlp {
  Linear fc0{"fc0", Matrix::Constant(3, 4, 0.1), Matrix::Zero(1, 4)};
  Linear fc1{"fc1", Matrix::Constant(4, 2, -0.2), Matrix::Zero(1, 2)};
  std::vector<Parameter*> parameters() {
    return {&fc0.weight(), &fc0.bias(), &fc1.weight(), &fc1.bias()};
  }
  double Step(int step, Optimizer& opt) {
    Matrix x = Matrix::Constant(5, 3, 0.01 * (step + 1));
    Matrix t = Matrix::Constant(5, 2, 0.5);
    for (Parameter* p : parameters()) p->grad.setZero();
    const Matrix a = fc0.Forward(x).array().tanh().matrix();
    const Matrix y = fc1.Forward(a);
    const Matrix da = fc1.Backward(a, (y - t) / 5.0);
    fc0.Backward(x, (da.array() * (1.0 - a.array().square())).matrix());
    EXPECT_TRUE(opt.Step().ok());
    return (y - t).squaredNorm() / 10.0;
  }
};

absl::Status Name(Mlp& m, TrainingState& state) {
  for (Parameter* p : m.parameters()) {
    absl::Status s = state.AddParameter(
        p, WholePlacement(p->name, p->value.rows(), p->value.cols()));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

class TrainingMetadataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto world = MpiCommunicator::World();
    ASSERT_TRUE(world.ok()) << world.status();
    world_ = *world;
    char path[] = "/tmp/vemesh_training_metadata_test_XXXXXX";
    ASSERT_NE(::mkdtemp(path), nullptr);
    dir_ = path;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // Trains `steps` steps and saves them with `identity`.
  void TrainAndSave(int steps,
                    const std::map<std::string, std::string>& identity) {
    Mlp m;
    auto opt = Optimizer::Create(OptimizerOptions::Sgd(0.1), m.parameters());
    ASSERT_TRUE(opt.ok());
    for (int s = 0; s < steps; ++s) m.Step(s, *opt);
    TrainingState state;
    ASSERT_TRUE(Name(m, state).ok());
    checkpoint::StateDict dict;
    ASSERT_TRUE(state.get_state_dict(&dict).ok());
    SetTrainingMetadata(identity, steps, &dict);
    ASSERT_TRUE(checkpoint::Save(dict, steps, dir_, *world_).ok());
  }
  absl::StatusOr<checkpoint::LoadResult> Load(Mlp& m) {
    TrainingState state;
    if (absl::Status s = Name(m, state); !s.ok()) return s;
    checkpoint::StateDict dict;
    if (absl::Status s = state.get_state_dict(&dict); !s.ok()) return s;
    return checkpoint::Load(dict, dir_, *world_);
  }

  std::shared_ptr<Communicator> world_;
  std::string dir_;
  const std::map<std::string, std::string> mlp_ = {{"model", "mlp 3-4-2"},
                                                   {"seed", "7"}};
};

TEST_F(TrainingMetadataTest, SavedRunResumesWhereItStopped) {
  TrainAndSave(3, mlp_);
  Mlp m;
  absl::StatusOr<checkpoint::LoadResult> loaded = Load(m);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 3);
  EXPECT_EQ(loaded->metadata.at("step"), "3");
  EXPECT_EQ(loaded->metadata.at("data_position"), "3");
  EXPECT_EQ(loaded->metadata.at("model"), "mlp 3-4-2");
  EXPECT_TRUE(CheckResumable(*loaded, mlp_, /*steps=*/10).ok());
  // The loaded model continues as the uninterrupted run does.
  Mlp whole;
  auto opt_whole =
      Optimizer::Create(OptimizerOptions::Sgd(0.1), whole.parameters());
  auto opt = Optimizer::Create(OptimizerOptions::Sgd(0.1), m.parameters());
  ASSERT_TRUE(opt_whole.ok() && opt.ok());
  for (int s = 0; s < 3; ++s) whole.Step(s, *opt_whole);
  EXPECT_EQ(m.Step(3, *opt), whole.Step(3, *opt_whole));
}

TEST_F(TrainingMetadataTest, AnotherModelIsNamedWithBothValues) {
  TrainAndSave(2, mlp_);
  Mlp m;
  absl::StatusOr<checkpoint::LoadResult> loaded = Load(m);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::map<std::string, std::string> other = {{"model", "mlp 3-4-2"},
                                                    {"seed", "8"}};
  absl::Status s = CheckResumable(*loaded, other, 10);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(
      s.message(),
      AllOf(HasSubstr(loaded->path), HasSubstr("another model"),
            HasSubstr("its 'seed' is '7'"), HasSubstr("this run's is '8'")));
  // A key the checkpoint was saved without.
  s = CheckResumable(*loaded, {{"tokenizer", "bpe"}}, 10);
  EXPECT_THAT(s.message(), HasSubstr("its 'tokenizer' is missing"));
}

TEST_F(TrainingMetadataTest, NothingLeftToTrainIsNamed) {
  TrainAndSave(4, mlp_);
  Mlp m;
  absl::StatusOr<checkpoint::LoadResult> loaded = Load(m);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  absl::Status s = CheckResumable(*loaded, mlp_, /*steps=*/4);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("nothing left to train"), HasSubstr("step 4")));
  EXPECT_TRUE(CheckResumable(*loaded, mlp_, 5).ok());
}

TEST_F(TrainingMetadataTest, DataPositionOtherThanTheStepIsNamed) {
  checkpoint::LoadResult loaded;
  loaded.step = 5;
  loaded.path = "/ckpt/step_5";
  loaded.metadata = {
      {"model", "mlp 3-4-2"}, {"seed", "7"}, {"data_position", "1234"}};
  absl::Status s = CheckResumable(loaded, mlp_, 10);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr("/ckpt/step_5"),
                                 HasSubstr("data_position '1234'")));
}

TEST(LossCurveTest, ComparesTheStepsTrainedAgainstTheReference) {
  Mlp m;
  auto opt = Optimizer::Create(OptimizerOptions::Sgd(0.1), m.parameters());
  ASSERT_TRUE(opt.ok());
  std::vector<double> serial;
  for (int s = 0; s < 6; ++s) serial.push_back(m.Step(s, *opt));
  // A replica that joined at step 2 and trained 2..5, one step slightly off.
  std::map<int64_t, double> losses = {{2, serial[2]},
                                      {3, serial[3] * (1 + 1e-7)},
                                      {4, serial[4]},
                                      {5, serial[5]}};
  absl::StatusOr<LossCurveComparison> c = CompareLossCurve(losses, serial);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->steps, 4u);
  EXPECT_EQ(c->first_step, 2);
  EXPECT_EQ(c->last_step, 5);
  EXPECT_EQ(c->worst_step, 3);
  EXPECT_NEAR(c->max_relative_difference, 1e-7, 1e-12);
  EXPECT_TRUE(c->Within(1e-6));
  EXPECT_FALSE(c->Within(1e-8));
  // Nothing trained is never within; a NaN is the worst and stays so.
  EXPECT_FALSE(CompareLossCurve({}, serial)->Within(1.0));
  losses[2] = std::numeric_limits<double>::quiet_NaN();
  c = CompareLossCurve(losses, serial);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->worst_step, 2);
  EXPECT_FALSE(c->Within(1e300));
  // A step the reference lacks.
  EXPECT_THAT(CompareLossCurve({{6, 1.0}}, serial).status().message(),
              HasSubstr("step 6 is outside the reference's 6 steps"));
}

TEST(ElasticVerdictTest, OneLineSaysWhatPassedAndWhatDidNot) {
  ElasticLoopResult done;
  done.replica = 2;
  done.replica_dim = "DP_REPLICATE";
  done.replicas = 3;
  done.recoveries = 1;
  done.identical = true;
  done.communicators_at_start = done.communicators_at_end = 7;
  LossCurveComparison curve{.steps = 4,
                            .first_step = 2,
                            .last_step = 5,
                            .max_relative_difference = 1e-12,
                            .worst_step = 3};
  ElasticVerdict v = JudgeElasticRun(done, curve, 1e-9);
  EXPECT_TRUE(v.pass);
  EXPECT_EQ(v.line,
            "PASS: replica 2: loss curve vs serial reference over steps 3..6 "
            "(4 steps): max relative difference 1e-12 (step 4) < 1e-09; "
            "parameters identical across DP_REPLICATE=3 replicas; 1 "
            "recoveries; communicators 7 (after start 7)");
  done.communicators_at_end = 8;  // one leaked
  EXPECT_FALSE(JudgeElasticRun(done, curve, 1e-9).pass);
  done.communicators_at_end = 7;
  done.identical = false;
  done.comparison = absl::AbortedError("DP_SHARD lost");
  v = JudgeElasticRun(done, curve, 1e-9);
  EXPECT_FALSE(v.pass);
  EXPECT_THAT(v.line, HasSubstr("parameters DIFFERENT (not compared: "
                                "ABORTED: DP_SHARD lost) across"));
}

}  // namespace
}  // namespace vemesh::strategies
