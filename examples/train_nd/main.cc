// train_nd: trains a small MLP with pipeline, data and tensor parallelism at
// once, on any mesh, and checks the loss curve against a serial run.
//
//   mpirun -n 8 train_nd --mesh PP=2,DP=2,TP=2
//
// Every rank: parse and validate the flags (no communication, so a bad
// value fails on every rank, before any collective), initialise
// VESCALE_DEVICE_MESH, build its part of the model, and train. Per step:
// the pipeline runs the micro-batches (activations and gradients between
// stages, TP collectives inside each layer), the gradients are averaged
// over DP (DataParallel, or the ZeRO DistributedOptimizer with --zero), the
// optimizer (SGD or AdamW) updates every shard, and the last stage's loss is
// averaged over DP and broadcast along PP so every rank knows it. Global rank 0
// prints the steps; at the end every rank trains the serial reference
// in-process and compares the curves, so all ranks exit alike.

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint_state.h"
#include "elastic_loop.h"
#include "parallel_mlp_stage.h"
#include "serial_mlp.h"
#include "synthetic_data.h"
#include "train_options.h"
#include "train_step.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/bootstrap/launch_session.h"
#include "vemesh/checkpoint/async_saver.h"
#include "vemesh/checkpoint/checkpoint.h"
#include "vemesh/registry/ve_device_mesh.h"
#include "vemesh/strategies/data_parallel.h"
#include "vemesh/strategies/distributed_optimizer.h"
#include "vemesh/strategies/fully_sharded_data_parallel.h"
#include "vemesh/strategies/optimizer.h"
#include "vemesh/strategies/pipeline_runner.h"
#include "vemesh/strategies/role_group.h"
#include "vemesh/strategies/training_metadata.h"

namespace {
const train_nd::TrainOptions kDefaults;
}  // namespace

ABSL_FLAG(std::string, mesh, kDefaults.mesh,
          "the device mesh, NAME=SIZE for PP, DP and TP, or DP_REPLICATE and "
          "DP_SHARD instead of DP (FSDP; absent roles are 1)");
ABSL_FLAG(int, layers, kDefaults.layers, "linear layers in the MLP");
ABSL_FLAG(int64_t, hidden, kDefaults.hidden, "hidden width");
ABSL_FLAG(int64_t, input_dim, kDefaults.input_dim, "input features");
ABSL_FLAG(int64_t, output_dim, kDefaults.output_dim, "regression outputs");
ABSL_FLAG(int64_t, batch, kDefaults.batch, "global batch size per step");
ABSL_FLAG(int, micro_batches, kDefaults.micro_batches,
          "micro-batches per step and DP replica");
ABSL_FLAG(int, steps, kDefaults.steps, "SGD steps");
ABSL_FLAG(double, lr, kDefaults.lr,
          "learning rate; 0 (the default) picks the optimizer's: sgd 0.5, "
          "adam 0.001 (torch.optim.Adam's default)");
ABSL_FLAG(std::string, optimizer, kDefaults.optimizer,
          "sgd, or adam (AdamW with PyTorch's defaults), here and in the "
          "serial reference");
ABSL_FLAG(double, momentum, kDefaults.momentum,
          "SGD's momentum (0: none; --optimizer=sgd only), here and in the "
          "serial reference");
ABSL_FLAG(bool, zero, kDefaults.zero,
          "the distributed optimizer (ZeRO) over DP instead of DataParallel: "
          "optimizer state (and, at stage 2, gradients) sharded over DP");
ABSL_FLAG(int, zero_stage, kDefaults.zero_stage,
          "with --zero: 1 (shard the optimizer state) or 2 (and the "
          "gradients)");
ABSL_FLAG(uint64_t, seed, kDefaults.seed, "seed of data and weights");
ABSL_FLAG(std::string, schedule, kDefaults.schedule,
          "pipeline schedule: gpipe or 1f1b");
ABSL_FLAG(int64_t, bucket_elements, kDefaults.bucket_elements,
          "doubles per DP gradient all_reduce bucket");
ABSL_FLAG(int, experts, kDefaults.experts,
          "experts of the MoE block after layer 1, spread over DP x TP (DP: "
          "or DP_REPLICATE x DP_SHARD) of each stage (0: no block)");
ABSL_FLAG(int, expert_parallel, kDefaults.expert_parallel,
          "the experts' expert-parallel group size on their own mesh "
          "(\"experts\": PP x EDP x EP over the same ranks); a divisor of DP "
          "x TP, the rest is EDP (expert data parallelism). 0: DP x TP");
ABSL_FLAG(bool, overlap, kDefaults.overlap,
          "overlap DP gradient all_reduces with the backward pass and pipeline "
          "sends with compute");
ABSL_FLAG(bool, grad_bf16, kDefaults.grad_bf16,
          "all_reduce DP gradients in bfloat16 (weights stay double; raise "
          "--tolerance)");
ABSL_FLAG(double, tolerance, kDefaults.tolerance,
          "largest relative loss difference from the serial run");
ABSL_FLAG(std::string, placement_out, "",
          "rank 0 writes the job's placement (get_placement() as JSON, what "
          "`vemesh plan --check` reads) to this file");
ABSL_FLAG(std::string, elastic, "",
          "elastic job: the control plane, redis://HOST:PORT; this launch is "
          "one DP replica (docs/ELASTIC.md)");
ABSL_FLAG(std::string, replicate_backend, kDefaults.replicate_backend,
          "static job: the replicate dimension (DP, or DP_REPLICATE) on gloo "
          "or mpi, the others on the launch's backend; gloo under mpirun is "
          "an elastic job's transports (its baseline)");
ABSL_FLAG(int, replica, -1, "elastic: this launch's replica id");
ABSL_FLAG(int, min_replicas, 1, "elastic: fewer live replicas is an error");
ABSL_FLAG(int, heartbeat_ms, 1000,
          "elastic: a rank silent for this long is dead");
ABSL_FLAG(int, op_timeout_ms, 3000, "elastic: bound of a DP operation");
ABSL_FLAG(int, recovery_timeout_ms, 60000,
          "elastic: bound of one recovery (and of forming the first epoch, "
          "after its form timeout), retries included");
ABSL_FLAG(int, form_timeout_ms, 10000,
          "elastic: how long the first epoch waits for every starting "
          "replica before it forms with the ones that came");
ABSL_FLAG(std::string, job, "train_nd",
          "elastic: the job's name in the control plane");
ABSL_FLAG(bool, lease_detection, false,
          "elastic: survivors learn of a lost replica from its lease alone "
          "(the way before the quorum round; a benchmark's baseline)");
ABSL_FLAG(bool, agree_every_step, false,
          "elastic: end_step agrees over DP every step, as before issue 47 "
          "(bench/elastic_overhead.py's baseline; default: the step's own DP "
          "operations are the agreement)");
ABSL_FLAG(int, pace_ms, 0,
          "elastic: each step lasts at least this long (demos, fault tests)");
ABSL_FLAG(std::string, checkpoint_dir, kDefaults.checkpoint_dir,
          "save checkpoints (safetensors shards + manifest) into DIR; elastic: "
          "also where a job that lost every replica resumes from");
ABSL_FLAG(int, checkpoint_every, kDefaults.checkpoint_every,
          "with --checkpoint_dir: save after every K steps");
ABSL_FLAG(bool, checkpoint_async, kDefaults.checkpoint_async,
          "save in the background (training stalls only for the copy to "
          "host memory); false: block until the checkpoint is durable");
ABSL_FLAG(int, checkpoint_keep, kDefaults.checkpoint_keep,
          "keep the last K checkpoints in --checkpoint_dir");
ABSL_FLAG(std::string, resume, kDefaults.resume,
          "continue from the latest checkpoint in DIR (saved on any mesh); "
          "the loss curve is checked against the serial run of all steps");
ABSL_FLAG(std::string, checkpoint_job, kDefaults.checkpoint_job,
          "the job's name, recorded in its checkpoints; with --resume, the "
          "checkpoint must be this job's (default: a resume continues the "
          "checkpoint's job, a fresh run gets a name of its own; elastic: "
          "--job)");
ABSL_FLAG(int, fingerprint_every, 0,
          "elastic: compare the replicas' state fingerprints every N steps "
          "(0: only after each membership change)");
ABSL_FLAG(std::string, fault, "",
          "elastic fault tests: STEP:WHERE[:RANK] (see elastic_loop.h)");

namespace train_nd {
namespace {

using vemesh::strategies::DataParallel;
using vemesh::strategies::DistributedOptimizer;
using vemesh::strategies::FullyShardedDataParallel;
using vemesh::strategies::Optimizer;
using vemesh::strategies::Parameter;
using vemesh::strategies::PipelineOptions;
using vemesh::strategies::RunPipeline;
using vemesh::strategies::TrainingStateBytes;

TrainOptions OptionsFromFlags() {
  TrainOptions o;
  o.mesh = absl::GetFlag(FLAGS_mesh);
  o.layers = absl::GetFlag(FLAGS_layers);
  o.hidden = absl::GetFlag(FLAGS_hidden);
  o.input_dim = absl::GetFlag(FLAGS_input_dim);
  o.output_dim = absl::GetFlag(FLAGS_output_dim);
  o.batch = absl::GetFlag(FLAGS_batch);
  o.micro_batches = absl::GetFlag(FLAGS_micro_batches);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.lr = absl::GetFlag(FLAGS_lr);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.schedule = absl::GetFlag(FLAGS_schedule);
  o.bucket_elements = absl::GetFlag(FLAGS_bucket_elements);
  o.tolerance = absl::GetFlag(FLAGS_tolerance);
  o.experts = absl::GetFlag(FLAGS_experts);
  o.expert_parallel = absl::GetFlag(FLAGS_expert_parallel);
  o.overlap = absl::GetFlag(FLAGS_overlap);
  o.grad_bf16 = absl::GetFlag(FLAGS_grad_bf16);
  o.optimizer = absl::GetFlag(FLAGS_optimizer);
  o.momentum = absl::GetFlag(FLAGS_momentum);
  o.zero = absl::GetFlag(FLAGS_zero);
  o.zero_stage = absl::GetFlag(FLAGS_zero_stage);
  o.elastic = absl::GetFlag(FLAGS_elastic);
  o.replicate_backend = absl::GetFlag(FLAGS_replicate_backend);
  o.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  o.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  o.checkpoint_async = absl::GetFlag(FLAGS_checkpoint_async);
  o.checkpoint_keep = absl::GetFlag(FLAGS_checkpoint_keep);
  o.resume = absl::GetFlag(FLAGS_resume);
  o.checkpoint_job = absl::GetFlag(FLAGS_checkpoint_job);
  return o;
}

// The losses of steps first_step + 1 .. steps (first_step: 0, or where a
// resumed run started).
struct TrainResult {
  int64_t first_step = 0;
  std::vector<double> losses;
};

// A communicator over every rank of `mesh`, for the checkpoint collectives.
absl::StatusOr<std::shared_ptr<vemesh::Communicator>> WorldGroup(
    vemesh::DeviceMesh& mesh) {
  if (mesh.mesh_dim_names().size() == 1) return mesh.get_group(0);
  return mesh.flatten(mesh.mesh_dim_names(), "CHECKPOINT_WORLD");
}

// Trains on the current registry mesh; `world` (all ranks) saves and loads
// checkpoints when the plan asks for them.
absl::StatusOr<TrainResult> Train(const TrainPlan& plan, bool print,
                                  vemesh::Communicator* world,
                                  const std::string& fresh_job) {
  absl::StatusOr<std::unique_ptr<ParallelMlpStage>> stage =
      ParallelMlpStage::Create(plan);
  if (!stage.ok()) return stage.status();
  std::vector<Parameter*> params = (*stage)->parameters();
  const std::vector<Parameter*> experts = (*stage)->expert_parameters();
  DataParallel dp(
      {.bucket_elements = static_cast<size_t>(plan.options.bucket_elements),
       .overlap = plan.options.overlap,
       .gradient_type = plan.options.grad_bf16
                            ? vemesh::strategies::GradientType::kBFloat16
                            : vemesh::strategies::GradientType::kFloat64});
  // (With --zero, dp only broadcasts the initial parameters.)
  // Replicas were initialised differently on purpose; this makes them equal.
  absl::StatusOr<vemesh::strategies::BucketStats> bcast =
      dp.BroadcastParameters(params);
  if (!bcast.ok()) return bcast.status();
  // --resume: the parameters now (FSDP and ZeRO shard the values they find
  // when they are made), the optimizer state once the optimizers exist.
  TrainResult result;
  // What this rank trains, named once: the checkpoints' pieces point into
  // it (and into the modules it names). The model first, before FSDP frees
  // the parameters; the optimizers once they exist.
  vemesh::strategies::TrainingState state;
  if (absl::Status s = (*stage)->NameParameters(&state); !s.ok()) return s;
  std::optional<vemesh::checkpoint::LoadResult> resumed;
  if (!plan.options.resume.empty()) {
    // The parameters alone (the optimizers do not exist yet).
    vemesh::checkpoint::StateDict dict;
    if (absl::Status s = state.get_state_dict(
            &dict, vemesh::strategies::StateDictParts::kModel);
        !s.ok()) {
      return s;
    }
    // A named job resumes only its own checkpoint.
    vemesh::checkpoint::LoadOptions load_options;
    load_options.job = plan.options.checkpoint_job;
    absl::StatusOr<vemesh::checkpoint::LoadResult> loaded =
        vemesh::checkpoint::Load(dict, plan.options.resume, *world,
                                 load_options);
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat("--resume=", plan.options.resume, ": ",
                                       loaded.status().message()));
    }
    if (absl::Status s = vemesh::strategies::CheckResumable(
            *loaded, CheckpointIdentity(plan), plan.options.steps);
        !s.ok()) {
      return absl::Status(
          s.code(), absl::StrCat("--resume=", plan.options.resume,
                                 " with --steps=", plan.options.steps, ": ",
                                 s.message()));
    }
    result.first_step = loaded->step;
    resumed = *std::move(loaded);
    if (print) {
      std::printf("train_nd: resumed at step %lld from %s\n",
                  static_cast<long long>(resumed->step), resumed->path.c_str());
      std::fflush(stdout);
    }
  }
  // Sizes for the memory line, before FSDP frees the parameters.
  size_t elements = 0;
  for (const Parameter* p : params) elements += p->value.size();
  size_t expert_elements = 0;
  for (const Parameter* p : experts) expert_elements += p->value.size();
  // The optimizers: the experts' (each lives on one rank) and the replicated
  // layers': a local one after DataParallel's average, or ZeRO's.
  const vemesh::strategies::GradientType gradient_type =
      plan.options.grad_bf16 ? vemesh::strategies::GradientType::kBFloat16
                             : vemesh::strategies::GradientType::kFloat64;
  absl::StatusOr<Optimizer> expert_opt =
      Optimizer::Create(plan.optimizer, experts);
  if (!expert_opt.ok()) return expert_opt.status();
  std::optional<Optimizer> local_opt;
  std::unique_ptr<DistributedOptimizer> zero;
  std::optional<FullyShardedDataParallel> fsdp;
  // HSDP's loss is summed over these (GlobalLoss), as the elastic step does.
  std::shared_ptr<vemesh::Communicator> loss_shard, loss_replicate;
  if (plan.fsdp()) {
    // One unit per layer of this stage, sharded over DP_SHARD (of this TP
    // slice: each TP rank shards its own part), replicated over
    // DP_REPLICATE. The parameters are equal after the broadcast above.
    vemesh::strategies::FsdpOptions o;
    if (plan.dp_shard > 0) o.shard_dims = {"DP_SHARD"};
    if (plan.dp_replicate > 0) o.replicate_dims = {"DP_REPLICATE"};
    o.sharding_strategy =
        plan.dp_shard == 0 ? vemesh::strategies::ShardingStrategy::kNoShard
        : plan.dp_replicate == 0
            ? vemesh::strategies::ShardingStrategy::kFullShard
            : vemesh::strategies::ShardingStrategy::kHybridShard;
    o.mixed_precision = plan.options.grad_bf16
                            ? vemesh::strategies::MixedPrecision::kBFloat16
                            : vemesh::strategies::MixedPrecision::kNone;
    // This stage's mesh (every dimension but PP): the stages hold
    // different units, and each agrees and shards its own.
    absl::StatusOr<vemesh::DeviceMesh> mesh = VESCALE_DEVICE_MESH.get();
    if (!mesh.ok()) return mesh.status();
    std::vector<std::string> stage_dims;
    for (const std::string& d : mesh->mesh_dim_names()) {
      if (d != "PP") stage_dims.push_back(d);
    }
    if (stage_dims.size() < mesh->mesh_dim_names().size()) {
      mesh = mesh->slice(stage_dims);
      if (!mesh.ok()) return mesh.status();
    }
    absl::StatusOr<FullyShardedDataParallel> f =
        FullyShardedDataParallel::Create(*mesh, (*stage)->fsdp_units(), o);
    if (!f.ok()) return f.status();
    fsdp.emplace(*std::move(f));
    if (plan.dp_shard > 0) {
      VEMESH_ASSIGN_OR_RETURN(loss_shard, mesh->get_group("DP_SHARD"));
    }
    if (plan.dp_replicate > 0) {
      VEMESH_ASSIGN_OR_RETURN(loss_replicate, mesh->get_group("DP_REPLICATE"));
    }
    if (absl::Status s = fsdp->SetOptimizer(plan.optimizer); !s.ok()) return s;
  } else if (plan.options.zero) {
    absl::StatusOr<std::unique_ptr<DistributedOptimizer>> z =
        DistributedOptimizer::Create(
            {.optimizer = plan.optimizer,
             .stage = plan.options.zero_stage == 1
                          ? vemesh::strategies::ZeroStage::kOne
                          : vemesh::strategies::ZeroStage::kTwo,
             .gradient_type = gradient_type},
            params);
    if (!z.ok()) return z.status();
    zero = *std::move(z);
  } else {
    absl::StatusOr<Optimizer> o = Optimizer::Create(plan.optimizer, params);
    if (!o.ok()) return o.status();
    local_opt.emplace(*std::move(o));
  }
  absl::Status named = absl::OkStatus();
  if (fsdp) named = state.AddFsdp(*fsdp, (*stage)->layer_parameters());
  if (named.ok() && zero) named = state.AddDistributedOptimizer(*zero, params);
  if (named.ok() && local_opt) named = state.AddOptimizer(*local_opt);
  if (named.ok()) named = state.AddOptimizer(*expert_opt);
  if (!named.ok()) return named;
  if (resumed) {
    // Every optimizer stepped once per training step: that is their step
    // count (AdamW's bias correction, SGD momentum's first step).
    const int64_t t = resumed->step;
    if (local_opt) local_opt->set_step_count(t);
    if (zero) zero->shard_optimizer().set_step_count(t);
    if (fsdp) {
      for (size_t u = 0; u < fsdp->num_units(); ++u) {
        if (fsdp->optimizer(u) != nullptr)
          fsdp->optimizer(u)->set_step_count(t);
      }
    }
    expert_opt->set_step_count(t);
    // Only optimizers with state have any to load (the same on every rank:
    // Load is collective).
    if (plan.optimizer.kind == vemesh::strategies::OptimizerKind::kAdamW ||
        plan.optimizer.momentum > 0) {
      vemesh::checkpoint::StateDict dict;
      if (absl::Status s = state.get_state_dict(
              &dict, vemesh::strategies::StateDictParts::kOptimizer);
          !s.ok()) {
        return s;
      }
      // From the one checkpoint the parameters came from (not the newest
      // directory of step t, which may be another job's): its directory,
      // its manifest's bytes and job, checked.
      vemesh::checkpoint::LoadOptions same;
      same.same_checkpoint_as = &*resumed;
      absl::StatusOr<vemesh::checkpoint::LoadResult> loaded =
          vemesh::checkpoint::Load(dict, plan.options.resume, *world, same);
      if (!loaded.ok()) {
        return absl::Status(
            loaded.status().code(),
            absl::StrCat("--resume=", plan.options.resume,
                         ": optimizer state: ", loaded.status().message()));
      }
      // The loaded step counts (t, saved with the state).
      if (absl::Status s = state.set_state_dict(); !s.ok()) return s;
    }
  }
  std::unique_ptr<vemesh::checkpoint::AsyncSaver> saver;
  // The job these checkpoints belong to: --job, else the resumed
  // checkpoint's (a restart continues its job), else a fresh name.
  vemesh::checkpoint::SaveOptions save_options;
  save_options.keep_last = plan.options.checkpoint_keep;
  save_options.job = plan.options.checkpoint_job;
  if (save_options.job.empty() && resumed) save_options.job = resumed->job;
  if (save_options.job.empty()) save_options.job = fresh_job;
  save_options.mesh = plan.options.mesh;
  if (plan.options.checkpoint_every > 0) {
    // One directory, one job: refused now, not at the first save.
    if (absl::Status s = vemesh::checkpoint::AgreeStatus(
            *world, vemesh::checkpoint::CheckCanWrite(
                        plan.options.checkpoint_dir, save_options.job));
        !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("--checkpoint_dir: ", s.message()));
    }
  }
  if (print && plan.options.checkpoint_every > 0) {
    std::printf("train_nd: checkpoints of job '%s' into %s\n",
                save_options.job.c_str(), plan.options.checkpoint_dir.c_str());
    std::fflush(stdout);
  }
  if (plan.options.checkpoint_every > 0 && plan.options.checkpoint_async) {
    absl::StatusOr<std::unique_ptr<vemesh::checkpoint::AsyncSaver>> made =
        vemesh::checkpoint::AsyncSaver::Create(*world);
    if (!made.ok()) return made.status();
    saver = *std::move(made);
  }
  if (print) {
    // What this rank keeps across steps; the experts are neither
    // replicated nor sharded by DP, and count alike in both.
    const TrainingStateBytes e = vemesh::strategies::ReplicatedStateBytes(
        plan.optimizer, expert_elements);
    const TrainingStateBytes replicated =
        vemesh::strategies::ReplicatedStateBytes(plan.optimizer, elements);
    const size_t kept = fsdp   ? fsdp->MemoryUsage().state()
                        : zero ? zero->memory().total()
                               : replicated.total();
    std::printf(
        "memory: %zu bytes of parameters+gradients+optimizer state per rank "
        "(replicated: %zu)\n",
        kept + e.total(), replicated.total() + e.total());
    std::fflush(stdout);
  }
  // The backward pass announces each finished gradient: its DP bucket
  // starts reducing while the earlier layers compute.
  if (plan.options.overlap && !zero && !fsdp) {
    (*stage)->set_gradient_ready(
        [&dp](const Parameter* p) { return dp.MarkGradientReady(p); });
  }

  PipelineOptions pipeline{plan.schedule, plan.options.micro_batches};
  pipeline.overlap_sends = plan.options.overlap;
  std::vector<double>& losses = result.losses;
  for (int step = static_cast<int>(result.first_step);
       step < plan.options.steps; ++step) {
    const absl::Time start = absl::Now();
    for (Parameter* p : params) p->ZeroGrad();
    for (Parameter* p : experts) p->ZeroGrad();
    (*stage)->SetBatch(
        MakeBatch(plan.options.seed, step, plan.shape, plan.options.batch));
    if (fsdp) {
      // Every unit gathered for the whole step (the pipeline interleaves
      // micro-batches, so no unit can be freed between them), backward
      // order; the pipeline's micro-batches then accumulate into the
      // gathered gradients.
      for (size_t u = fsdp->num_units(); u-- > 0;) {
        if (absl::Status s = fsdp->PreBackward(u); !s.ok()) return s;
      }
    } else if (!zero) {
      absl::Status prepared = dp.PrepareGradientSync(params);
      if (!prepared.ok()) return prepared;
    }
    absl::StatusOr<vemesh::strategies::PipelineStats> ran =
        RunPipeline(**stage, pipeline);
    if (!ran.ok()) return ran.status();
    if (fsdp) {
      for (size_t u = fsdp->num_units(); u-- > 0;) {
        if (absl::Status s = fsdp->PostBackward(u); !s.ok()) return s;
      }
      if (absl::Status s = fsdp->FinishBackward(); !s.ok()) return s;
      if (absl::Status s = fsdp->OptimizerStep(); !s.ok()) return s;
      fsdp->ZeroGrad();
    } else if (zero) {
      absl::StatusOr<vemesh::strategies::ZeroStepStats> z = zero->Step();
      if (!z.ok()) return z.status();
    } else {
      absl::StatusOr<vemesh::strategies::BucketStats> avg =
          dp.FinishGradientSync();
      if (!avg.ok()) return avg.status();
      if (absl::Status s = local_opt->Step(); !s.ok()) return s;
    }
    if (absl::Status s = expert_opt->Step(); !s.ok()) return s;
    const double squared_error = (*stage)->TakeSquaredError();
    absl::StatusOr<double> loss =
        fsdp ? GlobalLoss(plan, squared_error, loss_shard, loss_replicate)
             : GlobalLoss(plan, squared_error);
    if (!loss.ok()) return loss.status();
    losses.push_back(*loss);
    if (print) {
      std::printf("step %3d/%d  loss %.12f  time %7.2f ms\n", step + 1,
                  plan.options.steps, *loss,
                  absl::ToDoubleMilliseconds(absl::Now() - start));
      std::fflush(stdout);
    }
    const int done = step + 1;
    if (plan.options.checkpoint_every > 0 &&
        done % plan.options.checkpoint_every == 0) {
      const absl::Time save_start = absl::Now();
      vemesh::checkpoint::StateDict dict;
      if (absl::Status s = state.get_state_dict(&dict); !s.ok()) return s;
      vemesh::strategies::SetTrainingMetadata(CheckpointIdentity(plan), done,
                                              &dict);
      absl::Status s =
          saver != nullptr
              ? saver->Start(dict, done, plan.options.checkpoint_dir,
                             save_options)
              : vemesh::checkpoint::Save(dict, done,
                                         plan.options.checkpoint_dir, *world,
                                         save_options);
      if (!s.ok()) {
        return absl::Status(
            s.code(),
            absl::StrCat("checkpoint at step ", done, " into ",
                         plan.options.checkpoint_dir, ": ", s.message()));
      }
      if (print) {
        std::printf(
            "checkpoint: step %d %s in %.2f ms\n", done,
            saver != nullptr ? "copied, writing in the background" : "saved",
            absl::ToDoubleMilliseconds(absl::Now() - save_start));
        std::fflush(stdout);
      }
    }
  }
  if (saver != nullptr) {
    if (absl::Status s = saver->Wait(); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("checkpoint into ",
                                                 plan.options.checkpoint_dir,
                                                 ": ", s.message()));
    }
  }
  return result;
}

// One line on where the ranks ran and which groups cross hosts; the JSON
// to `path` when one is given.
absl::Status ReportPlacement(const std::string& path) {
  absl::StatusOr<vemesh::Placement> p = VESCALE_DEVICE_MESH.get_placement();
  if (!p.ok()) return p.status();
  std::string crossing;
  for (const vemesh::DimPlacement& d : p->dims) {
    absl::StrAppend(&crossing, " ", d.name, "=", d.crossing_groups, "/",
                    d.group_count);
  }
  std::printf("train_nd: placement: %zu host%s; groups crossing hosts:%s\n",
              p->hosts.size(), p->hosts.size() == 1 ? "" : "s",
              crossing.c_str());
  std::fflush(stdout);
  if (path.empty()) return absl::OkStatus();
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--placement_out '", path, "': cannot open it for writing"));
  }
  const std::string json = p->ToJson() + "\n";
  const bool written =
      std::fwrite(json.data(), 1, json.size(), f) == json.size();
  if (std::fclose(f) != 0 || !written) {
    return absl::DataLossError(
        absl::StrCat("--placement_out '", path, "': the write failed"));
  }
  return absl::OkStatus();
}

int Fail(int rank, absl::string_view what, const absl::Status& status,
         int code) {
  std::fprintf(stderr, "[rank %d] train_nd: %s: %s\n", rank,
               std::string(what).c_str(),
               std::string(status.message()).c_str());
  return code;
}

int Run() {
  // The job as the launcher started it: mpirun, srun or torchrun.
  auto boot = vemesh::LaunchBootstrap(absl::Now() + absl::Seconds(60));
  if (!boot.ok()) return Fail(-1, "launch", boot.status(), 1);
  const int world_rank = (*boot)->rank();
  const int world_size = (*boot)->size();

  // Pure validation: every rank reaches the same verdict alone.
  absl::StatusOr<TrainPlan> plan = PlanTraining(OptionsFromFlags(), world_size);
  if (!plan.ok()) return Fail(world_rank, "error", plan.status(), 2);
  if (!plan->options.elastic.empty()) {
    ElasticSettings e;
    vemesh::ElasticOptions& o = e.options;
    o.store = plan->options.elastic;
    o.replica = absl::GetFlag(FLAGS_replica);
    o.min_replicas = absl::GetFlag(FLAGS_min_replicas);
    o.heartbeat_ttl = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_ms));
    o.op_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_op_timeout_ms));
    // The bound of one recovery, retries included.
    o.recovery_timeout =
        absl::Milliseconds(absl::GetFlag(FLAGS_recovery_timeout_ms));
    o.form_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_form_timeout_ms));
    o.job = absl::GetFlag(FLAGS_job);
    o.fingerprint_every = absl::GetFlag(FLAGS_fingerprint_every);
    // Leases alone detect a lost replica: bench/elastic_kill.py's baseline.
    o.data_plane_detection = !absl::GetFlag(FLAGS_lease_detection);
    o.agree_every_step = absl::GetFlag(FLAGS_agree_every_step);
    e.fault = absl::GetFlag(FLAGS_fault);
    e.pace = absl::Milliseconds(absl::GetFlag(FLAGS_pace_ms));
    return RunElastic(*plan, e, world_rank);
  }

  vemesh::InitOptions init;
  if (!plan->options.replicate_backend.empty()) {
    init.mesh.backend_override = {
        {plan->replicate_dim(), plan->options.replicate_backend}};
  }
  absl::StatusOr<vemesh::DeviceMesh> mesh =
      VESCALE_DEVICE_MESH.init_device_mesh("cpu", plan->mesh.shape,
                                           plan->mesh.names, init);
  if (!mesh.ok()) return Fail(world_rank, "init_device_mesh", mesh.status(), 1);
  const bool print = world_rank == 0;
  if (print) {
    std::printf("train_nd: %s\n", mesh->ToString().c_str());
    const MlpShape& s = plan->shape;
    std::printf(
        "train_nd: mesh %s on %d ranks (PP=%d DP=%d TP=%d), MLP %lld-%lldx%d-"
        "%lld, batch %lld in %d micro-batches per replica, %s schedule, %d "
        "steps, %d experts, overlap %s, %s DP gradients, %s%s%s\n",
        vemesh::FormatMeshSpec(plan->mesh).c_str(), world_size, plan->pp,
        plan->dp, plan->tp, static_cast<long long>(s.input_dim),
        static_cast<long long>(s.hidden), s.layers,
        static_cast<long long>(s.output_dim),
        static_cast<long long>(plan->options.batch),
        plan->options.micro_batches,
        std::string(vemesh::strategies::PipelineScheduleName(plan->schedule))
            .c_str(),
        plan->options.steps, plan->options.experts,
        plan->options.overlap ? "on" : "off",
        plan->options.grad_bf16 ? "bf16" : "double",
        std::string(vemesh::strategies::OptimizerKindName(plan->optimizer.kind))
            .c_str(),
        plan->options.zero
            ? absl::StrCat(" under ZeRO-", plan->options.zero_stage).c_str()
            : "",
        plan->fsdp()
            ? absl::StrCat(
                  " under FSDP (DP_REPLICATE=", std::max(plan->dp_replicate, 1),
                  " x DP_SHARD=", std::max(plan->dp_shard, 1), ")")
                  .c_str()
            : "");
    std::fflush(stdout);
    if (absl::Status placed =
            ReportPlacement(absl::GetFlag(FLAGS_placement_out));
        !placed.ok()) {
      return Fail(world_rank, "placement", placed, 1);
    }
  }

  std::shared_ptr<vemesh::Communicator> world;
  if (!plan->options.checkpoint_dir.empty() || !plan->options.resume.empty()) {
    absl::StatusOr<std::shared_ptr<vemesh::Communicator>> w = WorldGroup(*mesh);
    if (!w.ok()) return Fail(world_rank, "checkpoint", w.status(), 1);
    world = *std::move(w);
  }
  // A fresh run's job name (used when --job is not given and no resume
  // names one): rank 0's, the same on every rank.
  std::string fresh_job;
  if (world != nullptr && plan->options.checkpoint_job.empty()) {
    char name[256] = {};
    if (world->rank() == 0) {
      char host[64] = {};
      ::gethostname(host, sizeof(host) - 1);
      std::snprintf(name, sizeof(name), "train_nd-%s-%d-%lld", host,
                    static_cast<int>(::getpid()),
                    static_cast<long long>(absl::ToUnixMillis(absl::Now())));
    }
    if (absl::Status s =
            world->broadcast(name, sizeof(name), vemesh::DataType::kUInt8, 0);
        !s.ok()) {
      return Fail(world_rank, "checkpoint", s, 1);
    }
    fresh_job = name;
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<TrainResult> trained =
      Train(*plan, print, world.get(), fresh_job);
  if (!trained.ok()) return Fail(world_rank, "training", trained.status(), 1);
  const std::vector<double>* losses = &trained->losses;
  const int first = static_cast<int>(trained->first_step);
  const double train_ms = absl::ToDoubleMilliseconds(absl::Now() - start);

  absl::StatusOr<std::vector<double>> serial_or = SerialLosses(*plan);
  if (!serial_or.ok()) return Fail(world_rank, "serial", serial_or.status(), 1);
  const std::vector<double>& serial = *serial_or;
  double worst = 0;
  int worst_step = 0;
  // A resumed run's steps against the serial run of the whole training.
  for (size_t i = 0; i < losses->size(); ++i) {
    const double want = serial[first + i];
    const double rel =
        std::abs((*losses)[i] - want) / std::max(std::abs(want), 1e-300);
    if (!(rel <= worst)) {  // also catches NaN
      worst = rel;
      worst_step = first + static_cast<int>(i) + 1;
    }
  }
  const bool pass = worst < plan->options.tolerance;
  if (print) {
    const std::string over =
        first == 0
            ? absl::StrCat(plan->options.steps, " steps")
            : absl::StrCat("steps ", first + 1, "..", plan->options.steps,
                           " (resumed at step ", first, "; serial trained all ",
                           plan->options.steps, " from the start)");
    std::printf(
        "%s: loss curve vs serial reference over %s: max relative "
        "difference %.3g (step %d) %s %.0e; training took %.1f ms\n",
        pass ? "PASS" : "FAIL", over.c_str(), worst, worst_step,
        pass ? "<" : ">=", plan->options.tolerance, train_ms);
    if (!pass && worst_step > 0) {
      std::printf("  step %d: distributed %.15g, serial %.15g\n", worst_step,
                  (*losses)[worst_step - 1 - first], serial[worst_step - 1]);
    }
    std::fflush(stdout);
  }
  VESCALE_DEVICE_MESH.reset();
  return pass ? 0 : 1;
}

}  // namespace
}  // namespace train_nd

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "N-D parallel (PP x DP x TP) MLP training, checked against a serial "
      "run.\n  mpirun -n 8 train_nd --mesh PP=2,DP=2,TP=2\n"
      "  torchrun --no_python --standalone --redirects 1 --tee 1 "
      "--nproc_per_node=8 train_nd --mesh PP=2,DP=2,TP=2");
  // Unknown flags and unparsable values stop here, on every rank, before
  // MPI starts.
  absl::ParseCommandLine(argc, argv);
  // MPI only when an MPI launcher started the job; torchrun / env:// jobs
  // run on Gloo and never start MPI (vemesh/bootstrap/launch_session.h).
  vemesh::LaunchSession launch(&argc, &argv);
  if (!launch.status().ok()) {
    std::fprintf(stderr, "train_nd: %s\n",
                 std::string(launch.status().message()).c_str());
    return launch.launch().reason.empty() ? 2 : 1;
  }
  return train_nd::Run();
}
