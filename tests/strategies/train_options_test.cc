// train_nd's flag validation: pure, so each bad value is checked here
// without MPI, and the error must name the value.
#include "train_options.h"

#include <functional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
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
  EXPECT_NE(ErrorOf(o, 4).find("has 8 ranks but the job has 4"),
            std::string::npos);

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

  o = {};
  o.optimizer = "lamb";
  EXPECT_NE(ErrorOf(o, 8).find("optimizer 'lamb' is unknown"),
            std::string::npos);

  o = {};
  o.zero = true;
  o.zero_stage = 3;
  EXPECT_NE(ErrorOf(o, 8).find("--zero_stage=3: expected 1 or 2"),
            std::string::npos);

  o = {};
  o.zero = true;
  o.elastic = "redis://localhost:1";
  o.mesh = "DP=2,TP=2";
  EXPECT_NE(ErrorOf(o, 2).find("expected DP_REPLICATE and DP_SHARD"),
            std::string::npos);
}

TEST(TrainOptionsTest, ReplicateAndShardDimensionsPlanFsdp) {
  TrainOptions o;
  o.mesh = "PP=2,DP_REPLICATE=2,DP_SHARD=2";
  absl::StatusOr<TrainPlan> plan = PlanTraining(o, 8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->fsdp());
  EXPECT_EQ(plan->dp, 4);
  EXPECT_EQ(plan->dp_replicate, 2);
  EXPECT_EQ(plan->dp_shard, 2);
  EXPECT_EQ(plan->rows_per_replica, o.batch / 4);
  o.mesh = "DP_SHARD=4,TP=2";
  plan = PlanTraining(o, 8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->dp, 4);
  EXPECT_EQ(plan->dp_replicate, 0);
  o.zero = true;
  EXPECT_NE(ErrorOf(o, 8).find("--zero: FSDP shards"), std::string::npos);
  o.zero = false;
  o = {};
  o.mesh = "DP=2,DP_SHARD=4";
  EXPECT_NE(ErrorOf(o, 8).find("DP as well"), std::string::npos);
  // Elastic HSDP: DP_REPLICATE counts replicas, a launch holds DP_SHARD x TP.
  o = {};
  o.elastic = "redis://localhost:1";
  o.mesh = "PP=1,DP_REPLICATE=3,DP_SHARD=2,TP=1";
  o.batch = 24;
  o.micro_batches = 2;
  plan = PlanTraining(o, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->dp, 6);
  EXPECT_EQ(plan->dp_replicate, 3);
  EXPECT_NE(ErrorOf(o, 6).find("launch with mpirun -n 2"), std::string::npos);
  o.mesh = "DP_SHARD=2,TP=1";
  EXPECT_NE(ErrorOf(o, 2).find("--elastic with only one of them"),
            std::string::npos);
  o.mesh = "DP_REPLICATE=3,TP=2";
  EXPECT_NE(ErrorOf(o, 2).find("--elastic with only one of them"),
            std::string::npos);
}

// --replicate_backend names the dimension whose groups hold the replicas:
// DP, or DP_REPLICATE under FSDP.
TEST(TrainOptionsTest, ReplicateBackendNamesTheReplicateDimension) {
  TrainOptions o;
  o.mesh = "DP=4,TP=2";
  o.replicate_backend = "gloo";
  absl::StatusOr<TrainPlan> plan = PlanTraining(o, 8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->replicate_dim(), "DP");
  o.mesh = "DP_REPLICATE=2,DP_SHARD=2,TP=2";
  plan = PlanTraining(o, 8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->replicate_dim(), "DP_REPLICATE");

  o.replicate_backend = "nccl";
  EXPECT_NE(ErrorOf(o, 8).find("--replicate_backend=nccl: expected gloo or "
                               "mpi"),
            std::string::npos);
  o.replicate_backend = "gloo";
  o.mesh = "DP_SHARD=4,TP=2";
  EXPECT_NE(ErrorOf(o, 8).find("has no replicate dimension"),
            std::string::npos);
  o.mesh = "TP=8";
  EXPECT_NE(ErrorOf(o, 8).find("has no replicate dimension"),
            std::string::npos);
  o.mesh = "DP=4,TP=2";
  o.elastic = "redis://127.0.0.1:6379";
  EXPECT_NE(ErrorOf(o, 2).find("--replicate_backend=gloo with --elastic"),
            std::string::npos);
}

// Issue 47: the elastic loop trains with the library's optimizers (AdamW,
// ZeRO over DP_SHARD inside a replica); ZeRO over the elastic DP itself
// cannot be carried to a joiner and is refused, naming the way that works.
TEST(TrainOptionsTest, ElasticTrainsWithAdamAndZeroOverDpShard) {
  TrainOptions o;
  o.elastic = "redis://localhost:1";
  o.mesh = "PP=1,DP_REPLICATE=3,DP_SHARD=2,TP=1";
  o.batch = 24;
  o.micro_batches = 2;
  o.optimizer = "adam";
  EXPECT_TRUE(PlanTraining(o, 2).ok()) << PlanTraining(o, 2).status();
  o.zero = true;
  EXPECT_TRUE(PlanTraining(o, 2).ok()) << PlanTraining(o, 2).status();
  o.mesh = "PP=1,DP=3,TP=2";
  EXPECT_NE(ErrorOf(o, 2).find("ZeRO would shard the optimizer state over DP"),
            std::string::npos)
      << ErrorOf(o, 2);
  o.zero = false;
  EXPECT_TRUE(PlanTraining(o, 2).ok()) << PlanTraining(o, 2).status();
}

TEST(TrainOptionsTest, ExpertsComposeWithReplicateAndShardDimensions) {
  // The expert-parallel group is DP_REPLICATE x DP_SHARD x TP of a stage.
  TrainOptions o;
  o.layers = 4;
  o.experts = 8;
  o.mesh = "DP_REPLICATE=2,DP_SHARD=2,TP=2";
  absl::StatusOr<TrainPlan> plan = PlanTraining(o, 8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->fsdp());
  EXPECT_EQ(plan->shape.experts, 8);
  o.mesh = "PP=2,DP_SHARD=2,TP=2";
  plan = PlanTraining(o, 8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->dp, 2);
  // Still spread evenly: 4 experts over 8 expert-parallel ranks is not.
  o.mesh = "DP_SHARD=4,TP=2";
  o.experts = 4;
  EXPECT_NE(ErrorOf(o, 8).find("DP_REPLICATE x DP_SHARD x TP = 8"),
            std::string::npos);
  // And what FSDP still refuses with or without experts.
  o.experts = 8;
  o.zero = true;
  EXPECT_NE(ErrorOf(o, 8).find("--zero: FSDP shards"), std::string::npos);
}

TEST(TrainOptionsTest, OptimizerFlagsMakeThePlansOptimizer) {
  TrainOptions o;
  o.optimizer = "adam";
  o.lr = 0.01;
  absl::StatusOr<TrainPlan> plan = PlanTraining(o, 8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->optimizer.kind, vemesh::strategies::OptimizerKind::kAdamW);
  EXPECT_EQ(plan->optimizer.lr, 0.01);
  EXPECT_EQ(plan->optimizer.resolved_weight_decay(), 1e-2);
  o.optimizer = "SGD";
  plan = PlanTraining(o, 8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->optimizer.kind, vemesh::strategies::OptimizerKind::kSgd);
  EXPECT_EQ(plan->optimizer.momentum, 0.0);
  o.momentum = 0.9;
  plan = PlanTraining(o, 8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->optimizer.momentum, 0.9);
  // Momentum is SGD's; a bad value is named.
  o.optimizer = "adam";
  plan = PlanTraining(o, 8);
  EXPECT_TRUE(absl::IsInvalidArgument(plan.status())) << plan.status();
  EXPECT_THAT(plan.status().message(),
              testing::HasSubstr("--momentum=0.9 with --optimizer=adam"));
  o.optimizer = "sgd";
  o.momentum = -1;
  plan = PlanTraining(o, 8);
  EXPECT_TRUE(absl::IsInvalidArgument(plan.status())) << plan.status();
  EXPECT_THAT(plan.status().message(),
              testing::HasSubstr("--momentum=-1: expected a finite value"));
}

// Without --lr each optimizer trains at its own default rate (Adam at
// SGD's 0.5 diverged); a given --lr wins, and 0 stands for the default.
TEST(TrainOptionsTest, LearningRateDefaultsPerOptimizer) {
  TrainOptions o;
  absl::StatusOr<TrainPlan> plan = PlanTraining(o, 8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->optimizer.lr, 0.5);
  EXPECT_EQ(plan->options.lr, 0.5);
  o.optimizer = "adam";
  plan = PlanTraining(o, 8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->optimizer.lr, 1e-3);
  EXPECT_EQ(plan->options.lr, 1e-3);
  o.lr = 0.02;
  plan = PlanTraining(o, 8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->optimizer.lr, 0.02);
}

// Sizes that would end in bad_alloc on every rank (reported: --batch=10^12,
// --hidden=10^9, --layers=10^6, --micro_batches=2^31-1) are refused before
// any memory is spent, naming the flag, its value and the bound.
TEST(TrainOptionsTest, SizesPastTheBoundsAreRefusedByName) {
  struct Case {
    std::function<void(TrainOptions&)> set;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](TrainOptions& o) { o.batch = 1000000000000; },
       "--batch=1000000000000: expected an integer from 1 to 1048576"},
      {[](TrainOptions& o) { o.hidden = 1000000000; },
       "--hidden=1000000000: expected an integer from 1 to 65536"},
      {[](TrainOptions& o) { o.layers = 1000000; },
       "--layers=1000000: expected an integer from 1 to 1024"},
      {[](TrainOptions& o) { o.micro_batches = 2147483647; },
       "--micro_batches=2147483647: expected an integer from 1 to 4096"},
      {[](TrainOptions& o) { o.steps = 2000000000; },
       "--steps=2000000000: expected an integer from 1 to 1000000"},
      {[](TrainOptions& o) { o.input_dim = 1 << 20; },
       "--input_dim=1048576: expected an integer from 1 to 65536"},
      {[](TrainOptions& o) { o.output_dim = 1 << 20; },
       "--output_dim=1048576: expected an integer from 1 to 65536"},
      {[](TrainOptions& o) { o.bucket_elements = int64_t{1} << 32; },
       "--bucket_elements=4294967296: expected an integer from 1 to "
       "16777216"},
      // Each flag in range, the whole model not: 65536^2 weights a layer.
      {[](TrainOptions& o) { o.hidden = 65536; },
       "--layers=4 --hidden=65536 --input_dim=16 --output_dim=8: the model "
       "has 8591704072 weights and biases; expected at most 16777216"},
      {[](TrainOptions& o) {
         o.batch = 1 << 20;
         o.hidden = 4096;
         o.layers = 2;
       },
       "one batch's activations are 1048576 rows x 4120 features"},
  };
  for (const Case& c : cases) {
    TrainOptions o;
    c.set(o);
    const std::string error = ErrorOf(o, 8);
    EXPECT_NE(error.find(c.message), std::string::npos)
        << "got: " << error << "\nwanted: " << c.message;
  }
  // The bounds themselves are accepted (as far as the bounds go).
  TrainOptions o;
  o.mesh = "TP=1";
  o.layers = 2;
  o.hidden = 2048;
  o.batch = 2048;
  o.micro_batches = 4;
  o.steps = kMaxSteps;
  o.bucket_elements = kMaxBucketElements;
  EXPECT_EQ(ErrorOf(o, 1), "");
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

TEST(TrainOptionsTest, CheckpointFlagsGoTogether) {
  TrainOptions o;
  o.checkpoint_dir = "/tmp/ck";
  EXPECT_NE(ErrorOf(o, 8).find("--checkpoint_dir=/tmp/ck without "
                               "--checkpoint_every"),
            std::string::npos);
  o = {};
  o.checkpoint_every = 2;
  EXPECT_NE(ErrorOf(o, 8).find("--checkpoint_every=2 without --checkpoint_dir"),
            std::string::npos);
  o = {};
  o.checkpoint_async = false;
  EXPECT_NE(ErrorOf(o, 8).find("--checkpoint_async=false without"),
            std::string::npos);
  o = {};
  o.checkpoint_dir = "/tmp/ck";
  o.checkpoint_every = -1;
  EXPECT_NE(ErrorOf(o, 8).find("--checkpoint_every=-1"), std::string::npos);
  o = {};
  o.mesh = "PP=1,DP=2,TP=2";
  o.elastic = "redis://127.0.0.1:6379";
  o.resume = "/tmp/ck";
  EXPECT_NE(ErrorOf(o, 2).find("--resume=/tmp/ck with --elastic"),
            std::string::npos);
  o = {};
  o.checkpoint_dir = "/tmp/ck";
  o.checkpoint_every = 3;
  o.checkpoint_async = false;
  o.resume = "/tmp/ck";  // resume and keep saving into the same directory
  EXPECT_TRUE(PlanTraining(o, 8).ok());
}

}  // namespace
}  // namespace train_nd
