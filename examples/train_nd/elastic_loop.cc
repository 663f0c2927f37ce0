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
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "checkpoint_state.h"
#include "parallel_mlp_stage.h"
#include "synthetic_data.h"
#include "train_step.h"
#include "vemesh/checkpoint/checkpoint.h"
#include "vemesh/comm/mpi/mpi_communicator.h"
#include "vemesh/registry/ve_device_mesh.h"
#include "vemesh/strategies/data_parallel.h"
#include "vemesh/strategies/distributed_optimizer.h"
#include "vemesh/strategies/elastic_state.h"
#include "vemesh/strategies/fully_sharded_data_parallel.h"
#include "vemesh/strategies/optimizer.h"
#include "vemesh/strategies/periodic_checkpoint.h"
#include "vemesh/strategies/pipeline_runner.h"
#include "vemesh/strategies/state_dict.h"
#include "vemesh/strategies/state_snapshot.h"

namespace train_nd {
namespace {

using vemesh::strategies::DataParallel;
using vemesh::strategies::DistributedOptimizer;
using vemesh::strategies::FullyShardedDataParallel;
using vemesh::strategies::Parameter;
using vemesh::strategies::RegisterElasticState;

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

void PrintMembership(bool leader, const vemesh::Recovery& r, int replica,
                     absl::string_view why) {
  if (!leader) return;
  std::printf(
      "membership: epoch %lld, DP=%d [%s] (replica %d is DP rank %d; "
      "%s; resume at step %lld%s) agreed in %.1f ms, built in %.1f ms, "
      "state %.1f ms, at %lld ms\n",
      static_cast<long long>(r.epoch), r.dp_size,
      absl::StrJoin(r.replicas, ", ").c_str(), replica, r.dp_rank,
      std::string(why).c_str(), static_cast<long long>(r.resume_step),
      r.state_carried ? ", state sent to the new replicas" : "",
      absl::ToDoubleMilliseconds(r.agree_time),
      absl::ToDoubleMilliseconds(r.build_time),
      absl::ToDoubleMilliseconds(r.state_time),
      static_cast<long long>(absl::ToUnixMillis(absl::Now())));
  std::fflush(stdout);
}

// What one replica trains with, built once on the elastic mesh's groups,
// which are the same objects in every epoch (reconfigured with each
// membership): FSDP (HYBRID_SHARD over DP_REPLICATE x DP_SHARD), ZeRO over
// DP_SHARD with DP_REPLICATE averaged (--zero), or DataParallel and an
// optimizer over DP. `state` names it for the library, which carries it to
// joiners and fingerprints it; `before` undoes a step that did not commit.
struct Replica {
  std::unique_ptr<ParallelMlpStage> stage;
  std::optional<FullyShardedDataParallel> fsdp;
  std::unique_ptr<DistributedOptimizer> zero;
  std::optional<vemesh::strategies::Optimizer> opt;
  std::optional<DataParallel> dp;
  // HSDP's groups: the loss sums over both.
  std::shared_ptr<vemesh::Communicator> shard, replicate;
  vemesh::strategies::TrainingState state;
  vemesh::strategies::StateSnapshot before;
};

absl::StatusOr<std::unique_ptr<Replica>> BuildReplica(const TrainPlan& plan) {
  auto r = std::make_unique<Replica>();
  auto stage = ParallelMlpStage::Create(plan);
  if (!stage.ok()) return stage.status();
  r->stage = *std::move(stage);
  std::vector<Parameter*> params = r->stage->parameters();
  absl::StatusOr<vemesh::DeviceMesh> mesh = VESCALE_DEVICE_MESH.get();
  if (!mesh.ok()) return mesh.status();
  if (plan.fsdp()) {
    auto shard = mesh->get_group("DP_SHARD");
    auto replicate = mesh->get_group("DP_REPLICATE");
    if (!shard.ok()) return shard.status();
    if (!replicate.ok()) return replicate.status();
    r->shard = *shard;
    r->replicate = *replicate;
  }
  absl::Status s = absl::OkStatus();
  if (plan.fsdp() && plan.options.zero) {
    auto z = DistributedOptimizer::Create(
        {.optimizer = plan.optimizer,
         .stage = plan.options.zero_stage == 1
                      ? vemesh::strategies::ZeroStage::kOne
                      : vemesh::strategies::ZeroStage::kTwo,
         .shard_group = r->shard,
         .replicate_group = r->replicate},
        params);
    if (!z.ok()) return z.status();
    r->zero = *std::move(z);
  } else if (plan.fsdp()) {
    // One unit per layer of this stage, over this stage's DP dimensions.
    auto dp_mesh =
        mesh->slice(std::vector<std::string>{"DP_REPLICATE", "DP_SHARD"});
    if (!dp_mesh.ok()) return dp_mesh.status();
    std::vector<vemesh::strategies::FsdpUnit> units;
    int l = r->stage->first_layer();
    for (std::vector<Parameter*>& ps : r->stage->layer_parameters()) {
      units.push_back({absl::StrCat("layer", l++), std::move(ps)});
    }
    auto f = FullyShardedDataParallel::Create(
        *dp_mesh, std::move(units),
        {.sharding_strategy =
             vemesh::strategies::ShardingStrategy::kHybridShard,
         .shard_dims = {"DP_SHARD"},
         .replicate_dims = {"DP_REPLICATE"}});
    if (!f.ok()) return f.status();
    r->fsdp.emplace(*std::move(f));
    s = r->fsdp->SetOptimizer(plan.optimizer);
  } else {
    auto o = vemesh::strategies::Optimizer::Create(plan.optimizer, params);
    if (!o.ok()) return o.status();
    r->opt.emplace(*std::move(o));
    // No overlap: every DP operation comes after the replica's own.
    r->dp.emplace(vemesh::strategies::DataParallelOptions{
        .bucket_elements = static_cast<size_t>(plan.options.bucket_elements),
        .overlap = false});
  }
  if (!s.ok()) return s;
  s = NameTrainingState(plan,
                        {.stage = r->stage.get(),
                         .local_optimizer = r->opt ? &*r->opt : nullptr,
                         .zero = r->zero.get(),
                         .fsdp = r->fsdp ? &*r->fsdp : nullptr},
                        &r->state);
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
  if (r.fsdp) r.fsdp->ZeroGrad();
  if (r.zero) r.zero->ZeroGrad();
  if (r.opt) r.opt->ZeroGrad();
  (void)stage.TakeSquaredError();  // a failed step may have left it
  stage.SetBatch(
      MakeBatch(plan.options.seed, step, plan.shape, plan.options.batch));
  inject("tp");
  // FSDP: every unit gathered for the whole step (the pipeline
  // interleaves micro-batches), as the static loop does.
  for (size_t u = r.fsdp ? r.fsdp->num_units() : 0; u-- > 0;) {
    if (absl::Status s = r.fsdp->PreBackward(u); !s.ok()) return s;
  }
  auto ran = vemesh::strategies::RunPipeline(
      stage, {plan.schedule, plan.options.micro_batches});
  if (!ran.ok()) return ran.status();
  for (size_t u = r.fsdp ? r.fsdp->num_units() : 0; u-- > 0;) {
    if (absl::Status s = r.fsdp->PostBackward(u); !s.ok()) return s;
  }
  auto sse = PipelineSquaredError(stage.TakeSquaredError());
  if (!sse.ok()) return sse.status();
  if (r.shard != nullptr && r.shard->size() > 1) {
    if (absl::Status s = r.shard->all_reduce(absl::MakeSpan(&*sse, 1),
                                             vemesh::ReduceOp::kSum);
        !s.ok()) {
      return s;
    }
  }
  inject("dp");
  inject("stop");
  absl::Status s = absl::OkStatus();
  if (r.fsdp) {
    s = r.fsdp->FinishBackward();
    if (s.ok()) s = r.fsdp->OptimizerStep();
  } else if (r.zero) {
    s = r.zero->Step().status();
  } else {
    s = r.dp->AverageGradients(stage.parameters()).status();
    if (s.ok()) s = r.opt->Step();
  }
  if (!s.ok()) return s;
  if (r.replicate == nullptr) return DataParallelLoss(plan, *sse);
  if (r.replicate->size() > 1) {
    s = r.replicate->all_reduce(absl::MakeSpan(&*sse, 1),
                                vemesh::ReduceOp::kSum);
    if (!s.ok()) return s;
  }
  return *sse / static_cast<double>(plan.options.batch * plan.shape.output_dim);
}

// FNV-1a of every entry of `state` (parameters or shards, optimizer state,
// step counts): equal on two replicas iff their states are (up to
// collisions).
int64_t Digest(vemesh::strategies::TrainingState& state) {
  uint64_t h = 1469598103934665603ull;
  auto entries = state.elastic_state();
  if (!entries.ok()) return 0;
  for (const auto& e : *entries) {
    std::string copy;
    absl::Span<const char> b;
    if (e.bytes) {
      b = e.bytes();
    } else if (auto got = e.state_dict(); got.ok()) {
      copy = *std::move(got);
      b = copy;
    }
    for (char c : b) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  }
  return static_cast<int64_t>(h >> 1);
}

int Fail(int replica, int rank, absl::string_view what,
         const absl::Status& status) {
  std::fprintf(stderr, "[replica %d rank %d] train_nd: %s: %s\n", replica, rank,
               std::string(what).c_str(), status.ToString().c_str());
  return 1;
}

// Checkpoints of an elastic job (vemesh/strategies/periodic_checkpoint.h):
// every replica holds the whole model over its own ranks, so the replica at
// DP rank 0 saves alone, over its launch (MPI's world: the replica's ranks),
// after every checkpoint_every-th committed step, in the background. A fresh
// job (its members started together at step 0: the first start, or a
// restart after every replica was lost) whose --checkpoint_dir holds a
// checkpoint loads it on every replica and resumes at its step.
class ElasticCheckpoints {
 public:
  absl::Status Init(const TrainPlan& plan, const std::string& elastic_job) {
    elastic_job_ = elastic_job;
    if (plan.options.checkpoint_dir.empty()) return absl::OkStatus();
    absl::StatusOr<std::shared_ptr<vemesh::MpiCommunicator>> w =
        vemesh::MpiCommunicator::World();
    if (!w.ok()) {
      return absl::Status(
          w.status().code(),
          absl::StrCat("--checkpoint_dir with --elastic needs each replica "
                       "launched by mpirun: ",
                       w.status().message()));
    }
    world_ = *std::move(w);
    auto ckpt = vemesh::strategies::PeriodicCheckpoint::Create(
        world_, {.dir = plan.options.checkpoint_dir,
                 .every = plan.options.checkpoint_every,
                 .keep_last = plan.options.checkpoint_keep,
                 .identity = {{"model", ModelFingerprint(plan)}}});
    if (!ckpt.ok()) return ckpt.status();
    ckpt_ = *std::move(ckpt);
    return absl::OkStatus();
  }
  // The step to start at: 0, or the loaded checkpoint's.
  absl::StatusOr<int64_t> MaybeLoad(const TrainPlan& plan,
                                    vemesh::strategies::TrainingState& state,
                                    bool print) {
    if (ckpt_ == nullptr) return 0;
    absl::StatusOr<int64_t> step = ckpt_->Restore(state);
    if (!step.ok() || *step == 0) return step;
    const vemesh::checkpoint::LoadResult& loaded = *ckpt_->restored();
    if (absl::Status s =
            CheckResumable(plan, loaded.path, loaded.step, loaded.metadata);
        !s.ok()) {
      return s;
    }
    if (print) {
      std::printf("train_nd: resumed at step %lld from %s\n",
                  static_cast<long long>(loaded.step), loaded.path.c_str());
      std::fflush(stdout);
    }
    return loaded.step;
  }
  // After committed step `step` (1-based count of steps done); `done`: the
  // last one (the save in flight is committed).
  absl::Status MaybeSave(vemesh::strategies::TrainingState& state, int64_t step,
                         bool done, bool print) {
    if (ckpt_ == nullptr) return absl::OkStatus();
    absl::StatusOr<int64_t> dp_rank =
        VESCALE_DEVICE_MESH.get_data_parallel_rank();
    if (!dp_rank.ok()) return dp_rank.status();
    absl::StatusOr<std::optional<int64_t>> saved =
        done ? ckpt_->Finish() : ckpt_->AfterStep(state, step, *dp_rank == 0);
    // Done: its communicator freed with it (the job's count is checked).
    if (done) ckpt_.reset();
    if (!saved.ok()) return saved.status();
    if (print && saved->has_value()) {
      std::printf("checkpoint: step %lld saved\n",
                  static_cast<long long>(**saved));
      std::fflush(stdout);
    }
    return absl::OkStatus();
  }

 private:
  // The launch's world, held for the job (as the count at start saw it).
  std::shared_ptr<vemesh::Communicator> world_;
  std::unique_ptr<vemesh::strategies::PeriodicCheckpoint> ckpt_;
  std::string elastic_job_;
};

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
  if (plan0.fsdp() && !plan0.options.checkpoint_dir.empty()) {
    return Fail(replica, launch_rank, "error",
                absl::InvalidArgumentError(
                    "--checkpoint_dir with --elastic and DP_REPLICATE/"
                    "DP_SHARD: an elastic HSDP job keeps no checkpoints yet"));
  }
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
  PrintMembership(leader, rec, replica, "start");
  auto plan = EpochPlan(plan0, rec.dp_size);
  if (!plan.ok()) return Fail(replica, launch_rank, "error", plan.status());
  // Built once: the mesh's groups follow every later membership.
  auto built = BuildReplica(*plan);
  if (!built.ok()) return Fail(replica, launch_rank, "model", built.status());
  Replica& rep = **built;
  const auto inject = [f = *fault, launch_rank](const char* where, int at) {
    Inject(f, launch_rank, where, at);
  };
  // Its communicator (the replica's launch) counts in the baseline below.
  ElasticCheckpoints checkpoints;
  if (absl::Status s = checkpoints.Init(*plan, settings.job); !s.ok()) {
    return Fail(replica, launch_rank, "checkpoint", s);
  }
  const int64_t communicators_at_start = vemesh::LiveCommunicatorCount();

  std::map<int64_t, double> losses;
  int64_t step = rec.resume_step;
  if (step == 0 && !rec.receives_state) {
    absl::StatusOr<int64_t> loaded =
        checkpoints.MaybeLoad(*plan, rep.state, leader);
    if (!loaded.ok()) {
      return Fail(replica, launch_rank, "checkpoint", loaded.status());
    }
    step = *loaded;
  }
  // The library carries the parameters and the optimizer state (live
  // buffers, no copy) to a joiner (here, in sync_state, or in a later
  // recover) and to a replica one step ahead of the others, and compares
  // their fingerprints after every change.
  if (absl::Status s = RegisterElasticState(*elastic, rep.state); !s.ok()) {
    return Fail(replica, launch_rank, "elastic", s);
  }
  // Done as the first thing of the first round, so that a failure while
  // sending is a failed step.
  absl::Status synced = elastic->sync_state();
  if (absl::IsDataLoss(synced)) {
    return Fail(replica, launch_rank, "elastic", synced);
  }
  bool send_state = !synced.ok();
  int recoveries = 0;
  // The parameters against every other replica's: compared in the round
  // after the last step, while the replicas are still in step, as that
  // round's work, so that a replica lost then is a failed round like any
  // (the survivors recover and compare again), not a verdict. (Each rank's
  // state against the same coordinate of every replica.)
  const std::string replica_dim = plan0.fsdp() ? "DP_REPLICATE" : "DP";
  bool identical_across = false;
  const auto compare_across = [&]() -> absl::StatusOr<bool> {
    const int64_t mine = Digest(rep.state);
    int64_t digest[2] = {mine, -mine};
    absl::StatusOr<vemesh::DeviceMesh> mesh = VESCALE_DEVICE_MESH.get();
    if (!mesh.ok()) return mesh.status();
    auto group = mesh->get_group(replica_dim);
    if (!group.ok()) return group.status();
    if (absl::Status s = (*group)->all_reduce(absl::MakeSpan(digest),
                                              vemesh::ReduceOp::kMax);
        !s.ok()) {
      return s;
    }
    return digest[0] == -digest[1];
  };
  // The last recovery's record, printed once its first step commits.
  std::optional<vemesh::Recovery> record;
  // The round after the last step trains nothing: its end_step makes sure
  // every replica committed that step too (one that failed it sends all
  // into recovery, and the last step is trained again).
  for (int round = 0;; ++round) {
    if (round > 4 * plan0.options.steps + 1000) {
      return Fail(replica, launch_rank, "training",
                  absl::InternalError("too many rounds without progress"));
    }
    const absl::Time step_start = absl::Now();
    const bool finishing = step >= plan0.options.steps && !send_state;
    absl::StatusOr<double> loss = absl::UnknownError("not run");
    if (send_state) loss = synced;  // the state did not arrive: recover
    // Whether this round changed the state (only then is there an undo: the
    // snapshot of an earlier, committed step must never be put back).
    bool stepped = false;
    if (finishing) {
      absl::StatusOr<bool> same = compare_across();
      if (same.ok()) {
        identical_across = *same;
        loss = 0.0;
      } else {
        loss = same.status();
      }
    } else if (!send_state) {
      // What the step changes, to undo it if it does not commit.
      if (absl::Status saved = rep.before.Save(rep.state); !saved.ok()) {
        loss = saved;
      } else {
        stepped = true;
        loss = Step(*plan, rep, static_cast<int>(step), [&](const char* where) {
          inject(where, static_cast<int>(step));
        });
      }
      absl::SleepFor(settings.pace - (absl::Now() - step_start));
    }
    if (!loss.ok() && leader) {
      std::printf("step %lld failed at %lld ms: %s\n",
                  static_cast<long long>(step + 1),
                  static_cast<long long>(absl::ToUnixMillis(absl::Now())),
                  loss.status().ToString().c_str());
    }
    auto verdict = elastic->end_step(loss.status());
    if (!verdict.ok()) {
      return Fail(replica, launch_rank, "elastic", verdict.status());
    }
    if (verdict->committed && record.has_value() && !send_state) {
      if (leader) {
        std::printf(
            "recovery: detect %.1f ms, agree %.1f ms, rebuild %.1f ms, state "
            "%.1f ms; first good step %lld at=%lld\n",
            absl::ToDoubleMilliseconds(record->detect_time),
            absl::ToDoubleMilliseconds(record->agree_time),
            absl::ToDoubleMilliseconds(record->build_time),
            absl::ToDoubleMilliseconds(record->state_time),
            static_cast<long long>(step + (finishing ? 0 : 1)),
            static_cast<long long>(absl::ToUnixMillis(absl::Now())));
        std::fflush(stdout);
      }
      record.reset();
    }
    if (verdict->committed && finishing) {
      if (!verdict->recover) {
        // The last save in flight, committed (its files and `latest`).
        if (absl::Status s =
                checkpoints.MaybeSave(rep.state, step, /*done=*/true, leader);
            !s.ok() && leader) {
          std::printf("checkpoint: last save failed: %s\n",
                      s.ToString().c_str());
        }
        break;
      }
    } else if (verdict->committed) {
      losses[step] = *loss;
      ++step;
      if (fault->where == "corrupt" && fault->step == step &&
          fault->rank == launch_rank) {
        std::fprintf(stderr,
                     "train_nd: fault: corrupt after step %lld on launch "
                     "rank %d\n",
                     static_cast<long long>(step), launch_rank);
        // The first value of the first registered buffer (a parameter).
        auto entries = rep.state.elastic_state();
        if (entries.ok() && !entries->empty() && (*entries)[0].bytes &&
            (*entries)[0].bytes().size() >= sizeof(double)) {
          reinterpret_cast<double*>((*entries)[0].bytes().data())[0] += 1.0;
        }
      }
      // A failed save leaves the previous checkpoint; training goes on.
      if (absl::Status s =
              checkpoints.MaybeSave(rep.state, step, /*done=*/false, leader);
          !s.ok() && leader) {
        std::printf("checkpoint: step %lld not saved: %s\n",
                    static_cast<long long>(step), s.ToString().c_str());
      }
      if (leader) {
        std::printf("step %lld/%d loss %.12f time %.2f ms DP=%d at %lld ms\n",
                    static_cast<long long>(step), plan0.options.steps, *loss,
                    absl::ToDoubleMilliseconds(absl::Now() - step_start),
                    plan->dp,
                    static_cast<long long>(absl::ToUnixMillis(absl::Now())));
      }
    } else if (stepped) {
      if (absl::Status s = rep.before.Restore(rep.state); !s.ok()) {
        return Fail(replica, launch_rank, "undo", s);
      }
    }
    if (!verdict->recover) continue;
    if (fault->where == "recovery" && step >= fault->step) {
      Inject(*fault, launch_rank, "recovery", -1);
    }
    auto r = elastic->recover(step);
    if (!r.ok()) return Fail(replica, launch_rank, "recover", r.status());
    if (r->evicted) {
      if (leader) {
        std::printf("membership: epoch %lld, DP=%d [%s]: replica %d evicted\n",
                    static_cast<long long>(r->epoch), r->dp_size,
                    absl::StrJoin(r->replicas, ", ").c_str(), replica);
        std::fflush(stdout);
      }
      VESCALE_DEVICE_MESH.reset();
      return 3;
    }
    ++recoveries;
    // The library loaded the members' state where this replica lacked it
    // or was one step ahead: resume where they are.
    record = *r;
    step = r->resume_step;
    losses.erase(losses.lower_bound(step), losses.end());
    send_state = false;
    PrintMembership(leader, *r, replica,
                    verdict->committed ? "membership changed"
                                       : "recovered from a failed step");
    plan = EpochPlan(plan0, r->dp_size);
    if (!plan.ok()) return Fail(replica, launch_rank, "error", plan.status());
    // The data slice follows the new DP size; the modules need nothing.
    if (absl::Status s = rep.stage->Rebind(*plan); !s.ok()) {
      return Fail(replica, launch_rank, "rebind", s);
    }
  }

  // Verdicts: the curve this replica trained against the serial one, the
  // parameters against every other replica's (compared in the last round,
  // combined here over the replica's own dimensions), the communicators
  // against the count after start.
  bool identical = identical_across;
  absl::StatusOr<vemesh::DeviceMesh> end_mesh = VESCALE_DEVICE_MESH.get();
  if (end_mesh.ok()) {
    int64_t same = identical ? 1 : 0;
    for (const std::string& d : end_mesh->mesh_dim_names()) {
      auto g = end_mesh->get_group(d);
      if (d == replica_dim || !g.ok() || (*g)->size() == 1) continue;
      if (!(*g)->all_reduce(absl::MakeSpan(&same, 1), vemesh::ReduceOp::kMin)
               .ok()) {
        same = 0;
      }
    }
    identical = same == 1;
  } else {
    identical = false;
  }
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
