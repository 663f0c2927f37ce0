#include "elastic_loop.h"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "checkpoint_state.h"
#include "parallel_mlp_stage.h"
#include "synthetic_data.h"
#include "train_step.h"
#include "vemesh/comm/mpi/mpi_communicator.h"
#include "vemesh/registry/ve_device_mesh.h"
#include "vemesh/strategies/data_parallel_trainer.h"
#include "vemesh/strategies/elastic_loop.h"
#include "vemesh/strategies/periodic_checkpoint.h"
#include "vemesh/strategies/pipeline_runner.h"
#include "vemesh/strategies/state_dict.h"

namespace train_nd {
namespace {

using vemesh::strategies::Parameter;

struct Fault {
  int step = -1;
  std::string where;  // "" = none
  int rank = 0;
};

absl::StatusOr<Fault> ParseFault(const std::string& text) {
  Fault f;
  if (text.empty()) return f;
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  const bool known =
      parts.size() >= 2 && (parts[1] == "dp" || parts[1] == "tp" ||
                            parts[1] == "stop" || parts[1] == "establish" ||
                            parts[1] == "recovery" || parts[1] == "corrupt");
  if (parts.size() < 2 || parts.size() > 3 || !known ||
      !absl::SimpleAtoi(parts[0], &f.step) ||
      (parts.size() == 3 && !absl::SimpleAtoi(parts[2], &f.rank))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--fault=", text,
        ": expected STEP:WHERE[:RANK] with WHERE one of dp, tp, stop, "
        "establish, recovery, corrupt"));
  }
  f.where = parts[1];
  return f;
}

// Ends this process the way a crash or a hang would, for the fault tests.
void Inject(const Fault& f, int launch_rank, const char* where, int step) {
  if (f.where != where || f.rank != launch_rank) return;
  if (step >= 0 && step != f.step) return;
  std::fprintf(stderr,
               "train_nd: fault: %s at step %d on launch rank %d at %lld ms\n",
               where, step, launch_rank,
               static_cast<long long>(absl::ToUnixMillis(absl::Now())));
  std::fflush(stderr);
  raise(f.where == "stop" ? SIGSTOP : SIGKILL);
}

// What one replica trains with, built once on the elastic mesh's groups
// (the same objects in every epoch): the stage and the library's
// DataParallelTrainer (HSDP, ZeRO over DP_SHARD, or DDP over DP). `state`
// names both for the library, which carries it to joiners and fingerprints
// it (the library loop snapshots it for an undo).
struct Replica {
  std::unique_ptr<ParallelMlpStage> stage;
  std::unique_ptr<vemesh::strategies::DataParallelTrainer> trainer;
  vemesh::strategies::TrainingState state;
};

absl::StatusOr<std::unique_ptr<Replica>> BuildReplica(const TrainPlan& plan) {
  using vemesh::strategies::DataParallelMode;
  auto r = std::make_unique<Replica>();
  auto stage = ParallelMlpStage::Create(plan);
  if (!stage.ok()) return stage.status();
  r->stage = *std::move(stage);
  absl::StatusOr<vemesh::DeviceMesh> mesh = VESCALE_DEVICE_MESH.get();
  if (!mesh.ok()) return mesh.status();
  std::vector<vemesh::strategies::FsdpUnit> units;
  int l = r->stage->first_layer();
  for (std::vector<Parameter*>& ps : r->stage->layer_parameters()) {
    units.push_back({absl::StrCat("layer", l++), std::move(ps)});
  }
  // The model named before HSDP frees the parameters, then how it trains.
  absl::Status s =
      NameTrainingState(plan, {.stage = r->stage.get()}, &r->state);
  if (!s.ok()) return s;
  auto trainer = vemesh::strategies::DataParallelTrainer::Create(
      *mesh, std::move(units),
      {.mode = !plan.fsdp()        ? DataParallelMode::kDdp
               : plan.options.zero ? DataParallelMode::kZero
                                   : DataParallelMode::kHsdp,
       .optimizer = plan.optimizer,
       .zero_stage = plan.options.zero_stage == 1
                         ? vemesh::strategies::ZeroStage::kOne
                         : vemesh::strategies::ZeroStage::kTwo,
       .bucket_elements = static_cast<size_t>(plan.options.bucket_elements)});
  if (!trainer.ok()) return trainer.status();
  r->trainer = *std::move(trainer);
  s = r->trainer->AddTo(r->state);
  if (!s.ok()) return s;
  return r;
}

// One step on the current epoch's mesh: the loss, or the first error.
// Every operation on the replica's own groups (PP, TP, DP_SHARD) comes
// before the first over the elastic dimension: a DP failure then leaves no
// replica-internal collective unmatched on the way to end_step
// (docs/ELASTIC.md).
absl::StatusOr<double> Step(const TrainPlan& plan, Replica& r, int step,
                            const std::function<void(const char*)>& inject) {
  ParallelMlpStage& stage = *r.stage;
  vemesh::strategies::DataParallelTrainer& trainer = *r.trainer;
  (void)stage.TakeSquaredError();  // a failed step may have left it
  stage.SetBatch(
      MakeBatch(plan.options.seed, step, plan.shape, plan.options.batch));
  inject("tp");
  if (absl::Status s = trainer.BeginStep(); !s.ok()) return s;
  auto ran = vemesh::strategies::RunPipeline(
      stage, {plan.schedule, plan.options.micro_batches});
  if (!ran.ok()) return ran.status();
  if (absl::Status s = trainer.AfterBackward(); !s.ok()) return s;
  auto sse = PipelineSquaredError(stage.TakeSquaredError());
  if (!sse.ok()) return sse.status();
  const auto& shard = trainer.shard_group();
  const auto& replicate = trainer.replicate_group();
  if (shard != nullptr && shard->size() > 1) {
    absl::Status s =
        shard->all_reduce(absl::MakeSpan(&*sse, 1), vemesh::ReduceOp::kSum);
    if (!s.ok()) return s;
  }
  inject("dp");
  inject("stop");
  if (absl::Status s = trainer.Step(); !s.ok()) return s;
  if (replicate == nullptr) return DataParallelLoss(plan, *sse);
  if (replicate->size() > 1) {
    absl::Status s =
        replicate->all_reduce(absl::MakeSpan(&*sse, 1), vemesh::ReduceOp::kSum);
    if (!s.ok()) return s;
  }
  return *sse / static_cast<double>(plan.options.batch * plan.shape.output_dim);
}

int Fail(int replica, int rank, absl::string_view what,
         const absl::Status& status) {
  std::fprintf(stderr, "[replica %d rank %d] train_nd: %s: %s\n", replica, rank,
               std::string(what).c_str(), status.ToString().c_str());
  return 1;
}

// The plan for an epoch of `replicas` replicas: DP is their number, or
// under HSDP DP_REPLICATE is, and DP their product with DP_SHARD.
absl::StatusOr<TrainPlan> EpochPlan(const TrainPlan& plan0, int replicas) {
  if (!plan0.fsdp()) return Replan(plan0, replicas);
  TrainPlan p = plan0;
  p.dp_replicate = replicas;
  return Replan(p, replicas * std::max(plan0.dp_shard, 1));
}

}  // namespace

int RunElastic(const TrainPlan& plan0, const ElasticSettings& settings,
               int launch_rank) {
  const int replica = settings.replica;
  auto fault = ParseFault(settings.fault);
  if (!fault.ok()) return Fail(replica, launch_rank, "error", fault.status());
  const bool leader = launch_rank == 0;

  vemesh::InitOptions init;
  vemesh::ElasticOptions& el = init.elastic.emplace();
  el.store = settings.store;
  el.replica = replica;
  el.job = settings.job;
  el.min_replicas = settings.min_replicas;
  el.heartbeat_ttl = settings.heartbeat_ttl;
  el.op_timeout = settings.op_timeout;
  el.recovery_timeout = settings.recovery_timeout;
  el.fingerprint_every = settings.fingerprint_every;
  el.data_plane_detection = !settings.lease_detection;
  el.agree_every_step = settings.agree_every_step;
  // HSDP: the replicas are DP_REPLICATE's; DP_SHARD lives in each launch.
  if (plan0.fsdp()) el.replica_dim = "DP_REPLICATE";
  // What a joiner must share with the job (the mesh is added by vemesh):
  // a replica with another model, batch or optimizer is refused.
  const TrainOptions& o = plan0.options;
  el.descriptor =
      absl::StrCat("model=", o.layers, "x", o.hidden, ",in=", o.input_dim,
                   ",out=", o.output_dim, ";batch=", o.batch,
                   ";micro_batches=", o.micro_batches,
                   ";optimizer=", o.optimizer, ";lr=", o.lr, ";seed=", o.seed,
                   ";schedule=", o.schedule, ";steps=", o.steps);
  el.fault_hook = [f = *fault, launch_rank](const char* point) {
    Inject(f, launch_rank, point, -1);
  };
  // The epoch-1 mesh is not kept: the registry hands out each epoch's.
  if (absl::Status s =
          VESCALE_DEVICE_MESH
              .init_device_mesh("cpu", plan0.mesh.shape, plan0.mesh.names, init)
              .status();
      !s.ok()) {
    return Fail(replica, launch_rank, "init_device_mesh", s);
  }
  vemesh::ElasticMesh* elastic = VESCALE_DEVICE_MESH.elastic();
  vemesh::Recovery rec = elastic->last_recovery();
  auto plan = EpochPlan(plan0, rec.dp_size);
  if (!plan.ok()) return Fail(replica, launch_rank, "error", plan.status());
  // Built once: the mesh's groups follow every later membership.
  auto built = BuildReplica(*plan);
  if (!built.ok()) return Fail(replica, launch_rank, "model", built.status());
  Replica& rep = **built;
  // Checkpoints (--checkpoint_dir): over the replica's own ranks (its
  // launch's MPI world), counted in the baseline below.
  std::unique_ptr<vemesh::strategies::PeriodicCheckpoint> ckpt;
  std::shared_ptr<vemesh::Communicator> ckpt_world;  // held for the job
  if (!plan0.options.checkpoint_dir.empty()) {
    auto world = vemesh::MpiCommunicator::World();
    if (!world.ok()) {
      return Fail(replica, launch_rank, "checkpoint", world.status());
    }
    ckpt_world = *world;
    auto made = vemesh::strategies::PeriodicCheckpoint::Create(
        ckpt_world, {.dir = plan0.options.checkpoint_dir,
                     .every = plan0.options.checkpoint_every,
                     .keep_last = plan0.options.checkpoint_keep,
                     .identity = {{"model", ModelFingerprint(plan0)}}});
    if (!made.ok()) {
      return Fail(replica, launch_rank, "checkpoint", made.status());
    }
    ckpt = *std::move(made);
  }
  const int64_t communicators_at_start = vemesh::LiveCommunicatorCount();

  const std::string replica_dim = plan0.fsdp() ? "DP_REPLICATE" : "DP";
  std::map<int64_t, double> losses;
  vemesh::strategies::ElasticLoopHooks hooks;
  hooks.step = [&](int64_t step) {
    return Step(*plan, rep, static_cast<int>(step), [&](const char* where) {
      Inject(*fault, launch_rank, where, static_cast<int>(step));
    });
  };
  hooks.on_commit = [&](int64_t step, double loss) {
    losses[step - 1] = loss;
    if (fault->where != "corrupt" || fault->step != step ||
        fault->rank != launch_rank) {
      return;
    }
    std::fprintf(stderr,
                 "train_nd: fault: corrupt after step %lld on launch rank %d\n",
                 static_cast<long long>(step), launch_rank);
    // The first value of the first registered buffer (a parameter).
    auto entries = rep.state.elastic_state();
    if (entries.ok() && !entries->empty() && (*entries)[0].bytes &&
        (*entries)[0].bytes().size() >= sizeof(double)) {
      reinterpret_cast<double*>((*entries)[0].bytes().data())[0] += 1.0;
    }
  };
  hooks.before_recover = [&](int64_t step) {
    if (fault->where == "recovery" && step >= fault->step) {
      Inject(*fault, launch_rank, "recovery", -1);
    }
  };
  hooks.on_recovery = [&](const vemesh::Recovery& r) -> absl::Status {
    losses.erase(losses.lower_bound(r.resume_step), losses.end());
    plan = EpochPlan(plan0, r.dp_size);
    if (!plan.ok()) return plan.status();
    // The data slice follows the new DP size; the modules need nothing.
    return rep.stage->Rebind(*plan);
  };
  auto done =
      vemesh::strategies::RunElasticLoop(*elastic, rep.state,
                                         {.steps = plan0.options.steps,
                                          .log = leader ? stdout : nullptr,
                                          .pace = settings.pace,
                                          .checkpoint = ckpt.get(),
                                          .compare_replicas = true},
                                         hooks);
  // Its communicator freed (the job's count is checked below).
  ckpt.reset();
  if (!done.ok()) return Fail(replica, launch_rank, "elastic", done.status());
  if (done->evicted) {
    VESCALE_DEVICE_MESH.reset();
    return 3;
  }
  const int recoveries = done->recoveries;

  // Verdicts: the curve this replica trained against the serial one, the
  // state against every other replica's (the loop's end-of-job check), the
  // communicators against the count after start.
  const bool identical = done->identical;
  absl::StatusOr<std::vector<double>> serial_or = SerialLosses(plan0);
  if (!serial_or.ok()) {
    return Fail(replica, launch_rank, "serial", serial_or.status());
  }
  const std::vector<double>& serial = *serial_or;
  double worst = 0;
  int64_t worst_step = -1;
  for (const auto& [s, value] : losses) {
    const double rel =
        std::abs(value - serial[s]) / std::max(std::abs(serial[s]), 1e-300);
    if (!(rel <= worst)) {
      worst = rel;
      worst_step = s;
    }
  }
  const int64_t communicators = vemesh::LiveCommunicatorCount();
  const bool pass = worst < plan0.options.tolerance && !losses.empty() &&
                    identical && communicators == communicators_at_start;
  if (leader) {
    std::printf(
        "%s: replica %d: loss curve vs serial reference over steps %lld..%lld "
        "(%zu steps): max relative difference %.3g (step %lld) %s %.0e; "
        "parameters %s across %s=%d replicas; %d recoveries; communicators "
        "%lld (after start %lld)\n",
        pass ? "PASS" : "FAIL", replica,
        static_cast<long long>(losses.empty() ? 0 : losses.begin()->first + 1),
        static_cast<long long>(losses.empty() ? 0 : losses.rbegin()->first + 1),
        losses.size(), worst, static_cast<long long>(worst_step + 1),
        worst < plan0.options.tolerance ? "<" : ">=", plan0.options.tolerance,
        identical ? "identical" : "DIFFERENT", replica_dim.c_str(),
        plan0.fsdp() ? plan->dp_replicate : plan->dp, recoveries,
        static_cast<long long>(communicators),
        static_cast<long long>(communicators_at_start));
    std::fflush(stdout);
  }
  VESCALE_DEVICE_MESH.reset();
  return pass ? 0 : 1;
}

}  // namespace train_nd
