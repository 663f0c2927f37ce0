// train_nd's flag validation: pure, so each bad value is checked here
// without MPI, and the error must name the value.
#include "train_options.h"

#include <string>

#include "gtest/gtest.h"

namespace train_nd {
namespace {

std::string ErrorOf(const TrainOptions& o, int64_t world) {
  absl::StatusOr<TrainPlan> plan = PlanTraining(o, world);
  return plan.ok() ? "" : std::string(plan.status().message());
}

TEST(TrainOptionsTest, DefaultPlanOnEightRanks) {
  absl::StatusOr<TrainPlan> plan = PlanTraining(TrainOptions{}, 8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->pp, 2);
  EXPECT_EQ(plan->dp, 2);
  EXPECT_EQ(plan->tp, 2);
  EXPECT_EQ(plan->rows_per_replica, 16);
  EXPECT_EQ(plan->rows_per_micro_batch, 4);
}

TEST(TrainOptionsTest, AbsentRolesAreOne) {
  TrainOptions o;
  o.mesh = "TP=4";
  absl::StatusOr<TrainPlan> plan = PlanTraining(o, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->pp, 1);
  EXPECT_EQ(plan->dp, 1);
  EXPECT_EQ(plan->tp, 4);
}

TEST(TrainOptionsTest, NamesTheBadValue) {
  TrainOptions o;
  EXPECT_NE(ErrorOf(o, 4).find("has 8 ranks but the job has 4"), std::string::npos);

  o = {};
  o.mesh = "PP=2,DP=2,TP=";
  EXPECT_NE(ErrorOf(o, 8).find("--mesh"), std::string::npos);

  o = {};
  o.mesh = "PP=2,XP=4";
  EXPECT_NE(ErrorOf(o, 8).find("'XP' is not a role"), std::string::npos);

  o = {};
  o.mesh = "PP=2,PP=4";
  EXPECT_NE(ErrorOf(o, 8).find("'PP' appears twice"), std::string::npos);

  o = {};
  o.mesh = "PP=8";
  EXPECT_NE(ErrorOf(o, 8).find("PP=8 pipeline stages but --layers=4"),
            std::string::npos);

  o = {};
  o.batch = 36;  // DP 2 x 4 micro-batches = 8
  EXPECT_NE(ErrorOf(o, 8).find("--batch=36 is not divisible by DP x "
                               "--micro_batches = 2 x 4 = 8"),
            std::string::npos);

  o = {};
  o.mesh = "TP=8";
  o.output_dim = 4;
  o.layers = 3;  // the last layer is column-parallel: outputs split over TP
  EXPECT_NE(ErrorOf(o, 8).find("--output_dim=4 is not divisible by TP=8"),
            std::string::npos);

  o = {};
  o.hidden = 63;
  EXPECT_NE(ErrorOf(o, 8).find("--hidden=63 is not divisible by TP=2"),
            std::string::npos);

  o = {};
  o.schedule = "zigzag";
  EXPECT_NE(ErrorOf(o, 8).find("'zigzag'"), std::string::npos);

  o = {};
  o.lr = -1;
  EXPECT_NE(ErrorOf(o, 8).find("--lr=-1"), std::string::npos);

  o = {};
  o.micro_batches = 0;
  EXPECT_NE(ErrorOf(o, 8).find("--micro_batches=0"), std::string::npos);
}

TEST(TrainOptionsTest, EvenLayerCountKeepsOutputsWhole) {
  // With 4 layers the last is row-parallel: output_dim need not divide TP.
  TrainOptions o;
  o.mesh = "TP=8";
  o.output_dim = 3;
  EXPECT_EQ(ErrorOf(o, 8), "");
}

TEST(MlpShapeTest, StagesTakeContiguousLayers) {
  MlpShape s;
  s.layers = 5;
  EXPECT_EQ(s.stage_layers(0, 2).begin, 0);
  EXPECT_EQ(s.stage_layers(0, 2).end, 3);
  EXPECT_EQ(s.stage_layers(1, 2).begin, 3);
  EXPECT_EQ(s.stage_layers(1, 2).end, 5);
  EXPECT_EQ(s.stage_layers(3, 4).begin, 4);
  EXPECT_EQ(s.stage_layers(3, 4).end, 5);
}

}  // namespace
}  // namespace train_nd
