// examples/train_nd/train_options.h
//
// The example's settings, and their validation into a plan.
//
//   TrainOptions o;                       // filled from the command line
//   absl::StatusOr<TrainPlan> plan = PlanTraining(o, world_size);
//   if (!plan.ok()) { /* print plan.status() on every rank, exit 2 */ }
//
// PlanTraining is pure: it needs only the options and the world size, so
// every rank reaches the same verdict without talking to the others, and a
// bad setting fails everywhere before the first collective (no hang), and a
// size that memory cannot hold (the kMax* bounds below) fails before any is
// allocated. Each error names the flag, its value and what was expected.

#ifndef EXAMPLES_TRAIN_ND_TRAIN_OPTIONS_H_
#define EXAMPLES_TRAIN_ND_TRAIN_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "mlp_shape.h"
#include "vemesh/layout/mesh_spec.h"
#include "vemesh/strategies/data_parallel_trainer.h"
#include "vemesh/strategies/optimizer.h"
#include "vemesh/strategies/pipeline_schedule.h"

namespace train_nd {

// Upper bounds of the size flags. Every rank holds its shard and the whole
// serial reference model (and a batch of its activations), so a size past
// these would end in bad_alloc on every rank; PlanTraining refuses it first.
// They sit far above what the example is for (a few hundred weights).
inline constexpr int kMaxLayers = 1024;
inline constexpr int64_t kMaxFeatures = int64_t{1} << 16;  // hidden, in, out
inline constexpr int64_t kMaxBatch = int64_t{1} << 20;
inline constexpr int kMaxMicroBatches = 4096;
inline constexpr int kMaxSteps = 1000000;
inline constexpr int64_t kMaxBucketElements = int64_t{1} << 24;
inline constexpr int kMaxExperts = 4096;
// Weights and biases of the whole model, and rows x features of one batch's
// activations over all layers: 2^24 doubles (128 MiB) each.
inline constexpr int64_t kMaxModelElements = int64_t{1} << 24;
inline constexpr int64_t kMaxActivationElements = int64_t{1} << 24;

struct TrainOptions {
  std::string mesh = "PP=2,DP=2,TP=2";
  int layers = 4;
  int64_t hidden = 64;
  int64_t input_dim = 16;
  int64_t output_dim = 8;
  int64_t batch = 32;
  int micro_batches = 4;
  int steps = 50;
  // 0: the optimizer's default (DefaultLearningRate); PlanTraining puts
  // the rate it trains at in TrainPlan::options.lr.
  double lr = 0;
  uint64_t seed = 2024;
  std::string schedule = "1f1b";
  int64_t bucket_elements = 4096;
  double tolerance = 1e-5;
  // Experts of the MoE block after layer 1 (0: no block); a multiple of
  // DP x TP, the expert-parallel group (DP: or DP_REPLICATE x DP_SHARD).
  int experts = 0;
  // The expert-parallel group's size (issue 45's expert folding): the
  // experts live on their own mesh, "experts" = (PP, EDP, EP) over the same
  // ranks, EP contiguous ranks of a stage, EDP = (DP x TP) / EP replicas
  // whose expert gradients are summed. 0: EP = DP x TP (EDP = 1).
  int expert_parallel = 0;
  // Overlap communication with compute: DP gradient buckets with the
  // backward pass, pipeline sends with the next micro-batch.
  bool overlap = true;
  // Communicate DP gradients in bfloat16 (parameters stay double). The
  // loss then differs from the serial run by more than rounding noise:
  // raise `tolerance` with it.
  bool grad_bf16 = false;
  // "sgd" (momentum 0, no weight decay) or "adam" (AdamW with PyTorch's
  // defaults: betas (0.9, 0.999), eps 1e-8, weight decay 1e-2), at `lr`.
  std::string optimizer = "sgd";
  // SGD's momentum (PyTorch's: b = momentum * b + g; 0: none). Its buffers
  // are optimizer state: checkpointed and sent to elastic joiners.
  double momentum = 0;
  // The distributed optimizer (ZeRO, vemesh/strategies/
  // distributed_optimizer.h) over DP instead of DataParallel, at
  // `zero_stage` 1 or 2.
  bool zero = false;
  int zero_stage = 2;
  // Elastic (docs/ELASTIC.md): the control plane's address; empty = a
  // static job. The launch then holds one replica, and DP in `mesh` is the
  // number of replicas that start the job.
  std::string elastic;
  // A static job's replicate dimension (DP, or DP_REPLICATE under FSDP) on
  // this backend ("gloo" or "mpi"; empty: the launch's), the other
  // dimensions on the launch's: with "gloo" under mpirun, the transports
  // of an elastic job, its baseline (bench/elastic_overhead.py).
  std::string replicate_backend;
  // Checkpoints (vemesh/checkpoint, examples/train_nd/checkpoint_state.h):
  // save into `checkpoint_dir` after every `checkpoint_every` steps (0:
  // never), in the background unless `checkpoint_async` is false, keeping
  // the last `checkpoint_keep`. `resume`: continue from the latest
  // checkpoint there, on any mesh. Elastic: `checkpoint_dir` is also where
  // a job that lost every replica's state resumes from; its saves block.
  std::string checkpoint_dir;
  int checkpoint_every = 0;
  bool checkpoint_async = true;
  int checkpoint_keep = 2;
  std::string resume;
  // The job's name, recorded in its checkpoints (SaveOptions::job) and
  // required of the checkpoint a resume reads. Empty: a resume continues
  // the resumed checkpoint's job; a fresh run names itself
  // train_nd-<host>-<pid>-<time>; elastic: the elastic job's --job.
  std::string checkpoint_job;
};

struct TrainPlan {
  TrainOptions options;
  vemesh::MeshSpec mesh;  // as given: roles are found by name
  int pp = 1;
  int dp = 1;  // with DP_REPLICATE / DP_SHARD: their product
  int tp = 1;
  // torchtitan's dimensions, 0 when the mesh lacks them. With either, the
  // replicated layers train under FullyShardedDataParallel (HYBRID_SHARD
  // with both, FULL_SHARD over DP_SHARD, NO_SHARD over DP_REPLICATE) instead
  // of DataParallel; DP is then their flattening (the registry's).
  int dp_replicate = 0;
  int dp_shard = 0;
  bool fsdp() const { return dp_replicate > 0 || dp_shard > 0; }
  // The dimension whose groups hold the replicas: DP_REPLICATE under FSDP
  // (empty when the mesh has none), else DP (empty when it has none).
  std::string replicate_dim() const;
  MlpShape shape;
  vemesh::strategies::OptimizerOptions optimizer;  // from optimizer and lr
  vemesh::strategies::PipelineSchedule schedule =
      vemesh::strategies::PipelineSchedule::k1F1B;
  int64_t rows_per_replica = 0;      // batch / DP
  int64_t rows_per_micro_batch = 0;  // batch / (DP * micro_batches)
};

// The learning rate an optimizer trains this model at when --lr is not
// given: 0.5 for SGD; 1e-3 for Adam(W), torch.optim.Adam's default (Adam
// at SGD's 0.5 diverges: loss 0.26 -> 98 by step 3).
double DefaultLearningRate(vemesh::strategies::OptimizerKind kind);

absl::StatusOr<TrainPlan> PlanTraining(const TrainOptions& options,
                                       int64_t world_size);
// The plan for `dp` replicas (an elastic membership change): the global
// batch stays, re-sharded; InvalidArgument when it does not divide.
absl::StatusOr<TrainPlan> Replan(const TrainPlan& plan, int dp);
// The plan for an elastic epoch of `replicas` replicas: DP is their number,
// or under HSDP DP_REPLICATE is, and DP their product with DP_SHARD.
absl::StatusOr<TrainPlan> ReplanReplicas(const TrainPlan& plan, int replicas);

// How the replicated layers train (the elastic mode's DataParallelTrainer):
// DDP over DP, ZeRO over DP_SHARD (--zero), or HSDP (--fsdp).
vemesh::strategies::DataParallelTrainerOptions TrainerOptions(
    const TrainPlan& plan);

}  // namespace train_nd

#endif  // EXAMPLES_TRAIN_ND_TRAIN_OPTIONS_H_
