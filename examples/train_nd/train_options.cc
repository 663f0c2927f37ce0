#include "train_options.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace train_nd {
namespace {

absl::Status InRange(absl::string_view flag, int64_t value, int64_t min,
                     int64_t max) {
  if (value >= min && value <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--", flag, "=", value, ": expected an integer from ", min, " to ", max));
}

absl::Status Positive(absl::string_view flag, double value) {
  if (std::isfinite(value) && value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, "=", value, ": expected a finite number > 0"));
}

// --lr: 0 stands for the optimizer's default.
absl::Status NonNegative(absl::string_view flag, double value) {
  if (std::isfinite(value) && value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--", flag, "=", value,
      ": expected a finite number > 0 (or 0: the optimizer's default)"));
}

// The checkpoint flags go together: a directory needs a period and the
// period a directory; an elastic job resumes from its --checkpoint_dir.
absl::Status CheckCheckpointFlags(const TrainOptions& o) {
  if (!o.checkpoint_dir.empty() && o.checkpoint_every == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--checkpoint_dir=", o.checkpoint_dir,
        " without --checkpoint_every: expected --checkpoint_every K >= 1 "
        "(save after every K steps)"));
  }
  if (o.checkpoint_dir.empty() && o.checkpoint_every > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint_every=", o.checkpoint_every,
                     " without --checkpoint_dir: expected a directory to save "
                     "into"));
  }
  if (o.checkpoint_dir.empty() && !o.checkpoint_async) {
    return absl::InvalidArgumentError(
        "--checkpoint_async=false without --checkpoint_dir: there is no save "
        "to make blocking");
  }
  if (!o.resume.empty() && !o.elastic.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--resume=", o.resume,
        " with --elastic: an elastic job resumes from its --checkpoint_dir "
        "when no replica holds the state; expected --checkpoint_dir instead"));
  }
  return absl::OkStatus();
}

}  // namespace

double DefaultLearningRate(vemesh::strategies::OptimizerKind kind) {
  return kind == vemesh::strategies::OptimizerKind::kAdamW ? 1e-3 : 0.5;
}

absl::StatusOr<TrainPlan> PlanTraining(const TrainOptions& o,
                                       int64_t world_size) {
  for (absl::Status s :
       {InRange("layers", o.layers, 1, kMaxLayers),
        InRange("hidden", o.hidden, 1, kMaxFeatures),
        InRange("input_dim", o.input_dim, 1, kMaxFeatures),
        InRange("output_dim", o.output_dim, 1, kMaxFeatures),
        InRange("batch", o.batch, 1, kMaxBatch),
        InRange("micro_batches", o.micro_batches, 1, kMaxMicroBatches),
        InRange("steps", o.steps, 1, kMaxSteps),
        InRange("bucket_elements", o.bucket_elements, 1, kMaxBucketElements),
        InRange("experts", o.experts, 0, kMaxExperts),
        InRange("checkpoint_every", o.checkpoint_every, 0, kMaxSteps),
        InRange("checkpoint_keep", o.checkpoint_keep, 1, 1000),
        NonNegative("lr", o.lr), Positive("tolerance", o.tolerance)}) {
    if (!s.ok()) return s;
  }
  // Each flag is bounded, so these products stay far below 2^63.
  const MlpShape shape{o.input_dim, o.hidden, o.output_dim, o.layers};
  int64_t weights = 0;
  int64_t features = shape.in_features(0);
  for (int l = 0; l < o.layers; ++l) {
    weights += (shape.in_features(l) + 1) * shape.out_features(l);
    features += shape.out_features(l);
  }
  const std::string sizes = absl::StrCat(
      "--layers=", o.layers, " --hidden=", o.hidden,
      " --input_dim=", o.input_dim, " --output_dim=", o.output_dim);
  if (weights > kMaxModelElements) {
    return absl::InvalidArgumentError(
        absl::StrCat(sizes, ": the model has ", weights,
                     " weights and biases; expected at "
                     "most ",
                     kMaxModelElements,
                     " (every rank holds the whole serial "
                     "reference model)"));
  }
  if (o.batch * features > kMaxActivationElements) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--batch=", o.batch, " with ", sizes, ": one batch's activations are ",
        o.batch, " rows x ", features, " features = ", o.batch * features,
        " values; expected at most ", kMaxActivationElements));
  }
  if (absl::Status s = CheckCheckpointFlags(o); !s.ok()) return s;
  TrainPlan plan;
  plan.options = o;

  absl::StatusOr<vemesh::strategies::OptimizerKind> kind =
      vemesh::strategies::ParseOptimizerKind(o.optimizer);
  if (!kind.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--optimizer: ", kind.status().message()));
  }
  if (o.lr == 0) plan.options.lr = DefaultLearningRate(*kind);
  const double lr = plan.options.lr;
  if (o.momentum != 0 && *kind != vemesh::strategies::OptimizerKind::kSgd) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--momentum=", o.momentum, " with --optimizer=", o.optimizer,
        ": expected --optimizer=sgd (AdamW's betas "
        "are its own)"));
  }
  if (!std::isfinite(o.momentum) || o.momentum < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--momentum=", o.momentum, ": expected a finite value >= 0"));
  }
  plan.optimizer =
      *kind == vemesh::strategies::OptimizerKind::kAdamW
          ? vemesh::strategies::OptimizerOptions::AdamW(lr)
          : vemesh::strategies::OptimizerOptions::Sgd(lr, o.momentum);
  if (absl::Status s =
          vemesh::strategies::ValidateOptimizerOptions(plan.optimizer);
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--optimizer=", o.optimizer, ": ", s.message()));
  }
  if (o.zero_stage != 1 && o.zero_stage != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--zero_stage=", o.zero_stage, ": expected 1 or 2"));
  }
  absl::StatusOr<vemesh::strategies::PipelineSchedule> schedule =
      vemesh::strategies::ParsePipelineSchedule(o.schedule);
  if (!schedule.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--schedule: ", schedule.status().message()));
  }
  plan.schedule = *schedule;

  absl::StatusOr<vemesh::MeshSpec> mesh = vemesh::ParseMeshSpec(o.mesh);
  if (!mesh.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--mesh: ", mesh.status().message()));
  }
  plan.mesh = *mesh;
  int64_t product = 1;
  for (size_t i = 0; i < mesh->names.size(); ++i) {
    const std::string& name = mesh->names[i];
    const int64_t size = mesh->shape[i];
    int* role = name == "PP"             ? &plan.pp
                : name == "DP"           ? &plan.dp
                : name == "TP"           ? &plan.tp
                : name == "DP_REPLICATE" ? &plan.dp_replicate
                : name == "DP_SHARD"     ? &plan.dp_shard
                                         : nullptr;
    if (role == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--mesh=", o.mesh, ": dimension '", name,
                       "' is not a role this example trains with: expected "
                       "PP, DP, TP, DP_REPLICATE or DP_SHARD"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (mesh->names[j] == name) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--mesh=", o.mesh, ": dimension '", name, "' appears twice"));
      }
    }
    // An elastic launch holds one replica: the elastic dimension (DP, or
    // DP_REPLICATE under FSDP) counts replicas, not this launch's ranks.
    const bool elastic_dim =
        !o.elastic.empty() && (name == "DP" || name == "DP_REPLICATE");
    if (size > world_size && !elastic_dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("--mesh=", o.mesh, ": ", name, "=", size,
                       " is larger than the job's ", world_size, " ranks"));
    }
    *role = static_cast<int>(size);
    product *= size;
  }
  if (plan.fsdp()) {
    const char* why =
        std::count(mesh->names.begin(), mesh->names.end(), "DP") > 0
            ? "DP as well: DP is their flattening, expected one or the other"
        : !o.elastic.empty() && (plan.dp_replicate == 0 || plan.dp_shard == 0)
            ? "--elastic with only one of them: an elastic HSDP job grows and "
              "shrinks DP_REPLICATE and shards over DP_SHARD, expected both "
              "(or DP alone)"
        // Elastic: --zero is ZeRO over DP_SHARD instead of FSDP.
        : o.zero && o.elastic.empty()
            ? "--zero: FSDP shards the optimizer already"
            : nullptr;
    if (why != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--mesh=", o.mesh, " has DP_REPLICATE or DP_SHARD and ", why));
    }
    plan.dp = std::max(plan.dp_replicate, 1) * std::max(plan.dp_shard, 1);
  }
  // ZeRO's state sharded over the elastic dimension would differ from
  // replica to replica, which no joiner can receive.
  if (!o.elastic.empty() && o.zero && !plan.fsdp()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--elastic with --zero and --mesh=", o.mesh,
        ": ZeRO would shard the optimizer state over DP, which the elastic "
        "job resizes; expected DP_REPLICATE and DP_SHARD (ZeRO over "
        "DP_SHARD inside each replica), e.g. --mesh "
        "PP=1,DP_REPLICATE=3,DP_SHARD=2,TP=1"));
  }
  // An elastic launch holds one replica: every dimension but DP.
  if (!o.elastic.empty()) {
    product /= plan.fsdp() ? plan.dp_replicate : plan.dp;
  }
  if (product != world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--mesh=", o.mesh, " has ", product, " ranks but the job has ",
        world_size, ": launch with mpirun -n ", product,
        " or change the mesh"));
  }

  plan.shape = MlpShape{o.input_dim, o.hidden, o.output_dim, o.layers};
  plan.shape.experts = o.experts;
  if (o.experts > 0) {
    if (o.layers < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--experts=", o.experts, " with --layers=", o.layers,
          ": the MoE block follows layer 1, expected --layers >= 2"));
    }
    if (!o.elastic.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--experts=", o.experts,
          " with --elastic: expert parallelism spans "
          "DP, which an elastic job resizes; expected --experts=0"));
    }
    const int stage = plan.dp * plan.tp;
    if (o.expert_parallel < 0 || o.expert_parallel > stage ||
        (o.expert_parallel > 0 && stage % o.expert_parallel != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--expert_parallel=", o.expert_parallel, " with ",
          plan.fsdp() ? "DP_REPLICATE x DP_SHARD x TP = " : "DP x TP = ", stage,
          ": expected 0 or a divisor of ", stage));
    }
    if (o.expert_parallel > 0 && o.expert_parallel < stage &&
        (!o.checkpoint_dir.empty() || !o.resume.empty())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--expert_parallel=", o.expert_parallel,
          " with checkpoints: each expert then has ", stage / o.expert_parallel,
          " replicas (EDP), and a checkpoint names one owner per expert; "
          "expected --expert_parallel=0 (or ",
          stage, ") with checkpoints"));
    }
    if (o.expert_parallel > 0 && o.experts % o.expert_parallel != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--experts=", o.experts,
          " is not divisible by --expert_parallel=", o.expert_parallel,
          ": the experts are spread evenly over the "
          "expert-parallel group"));
    }
    if (o.expert_parallel == 0 && o.experts % stage != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--experts=", o.experts, " is not divisible by ",
          plan.fsdp() ? "DP_REPLICATE x DP_SHARD x TP = " : "DP x TP = ",
          plan.dp * plan.tp,
          ": the experts are spread evenly over the "
          "expert-parallel group (DP x TP of each stage)"));
    }
  }
  if (plan.pp > o.layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("--mesh=", o.mesh, " has PP=", plan.pp,
                     " pipeline stages but --layers=", o.layers,
                     ": every stage needs at least one layer"));
  }
  for (int l = 0; l < o.layers; ++l) {
    const int64_t split = plan.shape.split_features(l);
    if (split % plan.tp != 0) {
      const bool column = MlpShape::column_parallel(l);
      const bool is_output = column && l + 1 == o.layers;
      const char* flag = l == 0 && !column ? "input_dim"
                         : is_output       ? "output_dim"
                                           : "hidden";
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, "=", split, " is not divisible by TP=", plan.tp,
          ": layer ", l, " (", column ? "column" : "row",
          "-parallel) splits its ", split, column ? " output" : " input",
          " features across TP"));
    }
  }
  if (!o.replicate_backend.empty()) {
    if (o.replicate_backend != "gloo" && o.replicate_backend != "mpi") {
      return absl::InvalidArgumentError(
          absl::StrCat("--replicate_backend=", o.replicate_backend,
                       ": expected gloo or mpi (or empty: the launch's)"));
    }
    if (!o.elastic.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--replicate_backend=", o.replicate_backend,
          " with --elastic: an elastic job's replicate dimension always "
          "runs on Gloo through the control plane"));
    }
    if (plan.replicate_dim().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--replicate_backend=", o.replicate_backend, " with --mesh=", o.mesh,
          ": the mesh has no replicate dimension (DP or DP_REPLICATE)"));
    }
  }
  return Replan(plan, plan.dp);
}

std::string TrainPlan::replicate_dim() const {
  if (fsdp()) return dp_replicate > 0 ? "DP_REPLICATE" : "";
  for (const std::string& name : mesh.names) {
    if (name == "DP") return name;
  }
  return "";
}

absl::StatusOr<TrainPlan> Replan(const TrainPlan& plan, int dp) {
  const TrainOptions& o = plan.options;
  if (dp < 1 || o.batch % (int64_t{dp} * o.micro_batches) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--batch=", o.batch, " is not divisible by DP x --micro_batches = ", dp,
        " x ", o.micro_batches, " = ", int64_t{dp} * o.micro_batches,
        ": every micro-batch of every replica must have the same rows"));
  }
  TrainPlan next = plan;
  next.dp = dp;
  next.rows_per_replica = o.batch / dp;
  next.rows_per_micro_batch = next.rows_per_replica / o.micro_batches;
  return next;
}

absl::StatusOr<TrainPlan> ReplanReplicas(const TrainPlan& plan, int replicas) {
  if (!plan.fsdp()) return Replan(plan, replicas);
  TrainPlan p = plan;
  p.dp_replicate = replicas;
  return Replan(p, replicas * std::max(plan.dp_shard, 1));
}

vemesh::strategies::DataParallelTrainerOptions TrainerOptions(
    const TrainPlan& plan) {
  using vemesh::strategies::DataParallelMode;
  return {.mode = !plan.fsdp()        ? DataParallelMode::kDdp
                  : plan.options.zero ? DataParallelMode::kZero
                                      : DataParallelMode::kHsdp,
          .optimizer = plan.optimizer,
          .zero_stage = plan.options.zero_stage == 1
                            ? vemesh::strategies::ZeroStage::kOne
                            : vemesh::strategies::ZeroStage::kTwo,
          .bucket_elements = static_cast<size_t>(plan.options.bucket_elements)};
}

}  // namespace train_nd
