#include "elastic_loop.h"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
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
#include "elastic_hsdp.h"
#include "parallel_mlp_stage.h"
#include "synthetic_data.h"
#include "train_step.h"
#include "vemesh/checkpoint/checkpoint.h"
#include "vemesh/comm/mpi/mpi_communicator.h"
#include "vemesh/registry/ve_device_mesh.h"
#include "vemesh/strategies/data_parallel.h"
#include "vemesh/strategies/pipeline_runner.h"

namespace train_nd {
namespace {

using vemesh::strategies::DataParallel;
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

std::vector<Matrix> Save(const std::vector<Parameter*>& params) {
  std::vector<Matrix> out;
  out.reserve(params.size());
  for (const Parameter* p : params) out.push_back(p->value);
  return out;
}

// FNV-1a of every parameter's bytes: equal on two replicas iff their
// parameters are bit-identical (up to hash collisions).
int64_t Digest(const std::vector<Parameter*>& params) {
  uint64_t h = 1469598103934665603ull;
  for (const Parameter* p : params) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(p->value.data());
    const size_t n = static_cast<size_t>(p->value.size()) * sizeof(double);
    for (size_t i = 0; i < n; ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return static_cast<int64_t>(h >> 1);
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

// One step on the current epoch's mesh: the loss, or the first error.
absl::StatusOr<double> Step(const TrainPlan& plan, ParallelMlpStage& stage,
                            const std::vector<Parameter*>& params,
                            DataParallel& dp, int step, const Fault& fault,
                            int launch_rank) {
  for (Parameter* p : params) p->ZeroGrad();
  // A failed step may have left its loss sum behind.
  (void)stage.TakeSquaredError();
  stage.SetBatch(
      MakeBatch(plan.options.seed, step, plan.shape, plan.options.batch));
  Inject(fault, launch_rank, "tp", step);
  auto ran = vemesh::strategies::RunPipeline(
      stage, {plan.schedule, plan.options.micro_batches});
  if (!ran.ok()) return ran.status();
  // Every operation on the replica's own groups (PP, TP) comes before the
  // first DP one: a DP failure then leaves no replica-internal collective
  // unmatched on the way to end_step (docs/ELASTIC.md).
  auto sse = PipelineSquaredError(stage.TakeSquaredError());
  if (!sse.ok()) return sse.status();
  Inject(fault, launch_rank, "dp", step);
  Inject(fault, launch_rank, "stop", step);
  auto avg = dp.AverageGradients(params);
  if (!avg.ok()) return avg.status();
  auto loss = DataParallelLoss(plan, *sse);
  if (!loss.ok()) return loss.status();
  for (Parameter* p : params) p->SgdStep(plan.options.lr);
  return loss;
}

int Fail(int replica, int rank, absl::string_view what,
         const absl::Status& status) {
  std::fprintf(stderr, "[replica %d rank %d] train_nd: %s: %s\n", replica, rank,
               std::string(what).c_str(), status.ToString().c_str());
  return 1;
}

// Checkpoints of an elastic job. Every replica holds the whole model over
// its own ranks, so the replica at DP rank 0 saves alone, over its launch
// (MPI's world: the replica's ranks), after every checkpoint_every-th
// committed step, blocking. A fresh job (its members started together at
// step 0: the first start, or a restart after every replica was lost) whose
// --checkpoint_dir holds a checkpoint loads it on every replica instead of
// starting from the initial weights, and resumes at its step.
class ElasticCheckpoints {
 public:
  absl::Status Init(const TrainPlan& plan) {
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
    replica_world_ = *std::move(w);
    return absl::OkStatus();
  }
  // The step to start at: 0, or the loaded checkpoint's.
  absl::StatusOr<int64_t> MaybeLoad(const TrainPlan& plan,
                                    ParallelMlpStage& stage, bool print) {
    if (replica_world_ == nullptr) return 0;
    const std::string& dir = plan.options.checkpoint_dir;
    absl::StatusOr<std::optional<int64_t>> latest =
        vemesh::checkpoint::LatestStep(dir);
    // Every rank of the replica reads the directory alike; one verdict.
    int64_t found = latest.ok() && latest->has_value() ? 1 : 0;
    absl::Status agreed = replica_world_->all_reduce(absl::MakeSpan(&found, 1),
                                                     vemesh::ReduceOp::kMin);
    if (!agreed.ok()) return agreed;
    if (!latest.ok()) return latest.status();
    if (found == 0) return 0;
    vemesh::checkpoint::StateDict dict;
    if (absl::Status s = DescribeState(plan, {.stage = &stage},
                                       StateParts::kParameters, &dict);
        !s.ok()) {
      return s;
    }
    absl::StatusOr<vemesh::checkpoint::LoadResult> loaded =
        vemesh::checkpoint::Load(dict, dir, *replica_world_);
    if (!loaded.ok()) return loaded.status();
    if (absl::Status s =
            CheckResumable(plan, loaded->path, loaded->step, loaded->metadata);
        !s.ok()) {
      return s;
    }
    if (print) {
      std::printf("train_nd: resumed at step %lld from %s\n",
                  static_cast<long long>(loaded->step), loaded->path.c_str());
      std::fflush(stdout);
    }
    return loaded->step;
  }
  // After committed step `step` (1-based count of steps done).
  absl::Status MaybeSave(const TrainPlan& plan, ParallelMlpStage& stage,
                         int64_t step, bool print) {
    const int every = plan.options.checkpoint_every;
    if (replica_world_ == nullptr || every == 0 || step % every != 0) {
      return absl::OkStatus();
    }
    absl::StatusOr<int64_t> dp_rank =
        VESCALE_DEVICE_MESH.get_data_parallel_rank();
    if (!dp_rank.ok()) return dp_rank.status();
    if (*dp_rank != 0) return absl::OkStatus();
    const absl::Time start = absl::Now();
    vemesh::checkpoint::StateDict dict;
    if (absl::Status s =
            DescribeState(plan, {.stage = &stage}, StateParts::kAll, &dict);
        !s.ok()) {
      return s;
    }
    SetStateMetadata(plan, step, &dict);
    if (absl::Status s = vemesh::checkpoint::Save(
            dict, step, plan.options.checkpoint_dir, *replica_world_,
            {.keep_last = plan.options.checkpoint_keep});
        !s.ok()) {
      return s;
    }
    if (print) {
      std::printf("checkpoint: step %lld saved in %.2f ms\n",
                  static_cast<long long>(step),
                  absl::ToDoubleMilliseconds(absl::Now() - start));
      std::fflush(stdout);
    }
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<vemesh::Communicator> replica_world_;
};

// The whole replicated model as the registered state (DataParallel).
absl::Status RegisterParameters(vemesh::ElasticMesh& elastic,
                                ParallelMlpStage* model) {
  return elastic.register_state_dict_fn(
      "parameters",
      [model]() -> absl::StatusOr<std::string> {
        std::string bytes;
        for (const Parameter* p : model->parameters()) {
          bytes.append(reinterpret_cast<const char*>(p->value.data()),
                       static_cast<size_t>(p->value.size()) * sizeof(double));
        }
        return bytes;
      },
      [model](absl::string_view bytes) -> absl::Status {
        size_t total = 0;
        for (const Parameter* p : model->parameters()) {
          total += static_cast<size_t>(p->value.size()) * sizeof(double);
        }
        if (bytes.size() != total) {
          return absl::InvalidArgumentError(absl::StrCat(
              "parameters: ", bytes.size(), " bytes, expected ", total));
        }
        size_t at = 0;
        for (Parameter* p : model->parameters()) {
          const size_t n =
              static_cast<size_t>(p->value.size()) * sizeof(double);
          std::memcpy(p->value.data(), bytes.data() + at, n);
          at += n;
        }
        return absl::OkStatus();
      });
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
  auto stage = ParallelMlpStage::Create(*plan);
  if (!stage.ok()) return Fail(replica, launch_rank, "model", stage.status());
  std::vector<Parameter*> params = (*stage)->parameters();
  // HSDP: the layers live as shards from here on (params are freed).
  std::unique_ptr<ElasticHsdp> hsdp;
  if (plan0.fsdp()) {
    auto h = ElasticHsdp::Create(*plan, stage->get());
    if (!h.ok()) return Fail(replica, launch_rank, "fsdp", h.status());
    hsdp = *std::move(h);
  }
  const auto inject = [f = *fault, launch_rank](const char* where, int at) {
    Inject(f, launch_rank, where, at);
  };
  // The replica's state between steps, to roll a failed one back.
  const auto save = [&]() -> std::vector<std::vector<double>> {
    if (hsdp) return hsdp->SaveShards();
    std::vector<std::vector<double>> out;
    for (const Matrix& m : Save(params)) {
      out.emplace_back(m.data(), m.data() + m.size());
    }
    return out;
  };
  const auto restore = [&](const std::vector<std::vector<double>>& saved) {
    if (hsdp) return hsdp->RestoreShards(saved);
    for (size_t i = 0; i < params.size() && i < saved.size(); ++i) {
      std::copy(saved[i].begin(), saved[i].end(), params[i]->value.data());
    }
  };
  // No overlap: an elastic step puts every DP operation after the
  // replica's own (see Step), so there is no backward to overlap with.
  DataParallel dp(
      {.bucket_elements = static_cast<size_t>(plan0.options.bucket_elements),
       .overlap = false});
  // Its communicator (the replica's launch) counts in the baseline below.
  ElasticCheckpoints checkpoints;
  if (absl::Status s = checkpoints.Init(*plan); !s.ok()) {
    return Fail(replica, launch_rank, "checkpoint", s);
  }
  const int64_t communicators_at_start = vemesh::LiveCommunicatorCount();

  std::map<int64_t, double> losses;
  int64_t step = rec.resume_step;
  if (step == 0 && !rec.receives_state) {
    absl::StatusOr<int64_t> loaded =
        checkpoints.MaybeLoad(*plan, **stage, leader);
    if (!loaded.ok()) {
      return Fail(replica, launch_rank, "checkpoint", loaded.status());
    }
    step = *loaded;
  }
  // The library carries the parameters: to a joiner (here, in sync_state,
  // or in a later recover), and to a replica one step ahead of the others;
  // it compares their fingerprints after every change.
  ParallelMlpStage* model = stage->get();
  ElasticHsdp* shards = hsdp.get();
  // HSDP: each unit's shard as its live bytes (no copy of the shards).
  absl::Status registered = absl::OkStatus();
  if (shards != nullptr) {
    for (size_t u = 0; u < shards->num_units() && registered.ok(); ++u) {
      registered = elastic->register_state_bytes(
          absl::StrCat("parameter_shards/unit", u),
          [shards, u] { return shards->ShardBytes(u); });
    }
  } else {
    registered = RegisterParameters(*elastic, model);
  }
  if (!registered.ok()) {
    return Fail(replica, launch_rank, "elastic", registered);
  }
  // Done as the first thing of the first round, so that a failure while
  // sending is a failed step.
  absl::Status synced = elastic->sync_state();
  if (absl::IsDataLoss(synced)) {
    return Fail(replica, launch_rank, "elastic", synced);
  }
  bool send_state = !synced.ok();
  std::vector<std::vector<double>> before_step = save();
  std::vector<std::vector<double>> before_previous = before_step;
  int recoveries = 0;
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
    before_previous = std::move(before_step);
    before_step = save();
    if (finishing) {
      loss = 0.0;
    } else if (!send_state && hsdp) {
      loss = hsdp->Step(*plan, static_cast<int>(step), [&](const char* where) {
        inject(where, static_cast<int>(step));
      });
      absl::SleepFor(settings.pace - (absl::Now() - step_start));
    } else if (!send_state) {
      loss = Step(*plan, **stage, params, dp, static_cast<int>(step), *fault,
                  launch_rank);
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
      if (!verdict->recover) break;
    } else if (verdict->committed) {
      losses[step] = *loss;
      ++step;
      if (fault->where == "corrupt" && fault->step == step &&
          fault->rank == launch_rank && (hsdp || !params.empty())) {
        std::fprintf(stderr,
                     "train_nd: fault: corrupt after step %lld on launch "
                     "rank %d\n",
                     static_cast<long long>(step), launch_rank);
        if (hsdp) {
          hsdp->Corrupt(1.0);
        } else {
          params[0]->value(0, 0) += 1.0;
        }
      }
      // A failed save leaves the previous checkpoint; training goes on.
      if (absl::Status s = checkpoints.MaybeSave(*plan, **stage, step, leader);
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
    } else {
      restore(before_step);
      before_step = before_previous;
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
    before_step = save();
    send_state = false;
    PrintMembership(leader, *r, replica,
                    verdict->committed ? "membership changed"
                                       : "recovered from a failed step");
    plan = EpochPlan(plan0, r->dp_size);
    if (!plan.ok()) return Fail(replica, launch_rank, "error", plan.status());
    if (absl::Status s = (*stage)->Rebind(*plan); !s.ok()) {
      return Fail(replica, launch_rank, "rebind", s);
    }
    if (hsdp) {
      if (absl::Status s = hsdp->Rebuild(*plan); !s.ok()) {
        return Fail(replica, launch_rank, "fsdp", s);
      }
    }
  }

  // Verdicts: the curve this replica trained against the serial one, the
  // parameters against every other replica's, the communicators against
  // the count after start.
  // The parameters first, while the replicas are still in step: the serial
  // reference below takes each one a different time, which must not run a
  // DP operation past its timeout.
  // (HSDP: each rank's shards against the same shard of every replica.)
  const int64_t mine = hsdp ? hsdp->Digest() : Digest(params);
  int64_t digest[2] = {mine, -mine};
  auto dp_group = hsdp ? absl::StatusOr<std::shared_ptr<vemesh::Communicator>>(
                             hsdp->replicate())
                       : VESCALE_DEVICE_MESH.get_data_parallel_dim_groups();
  bool identical = false;
  if (dp_group.ok() &&
      (*dp_group)
          ->all_reduce(digest, digest, 2, vemesh::DataType::kInt64,
                       vemesh::ReduceOp::kMax)
          .ok()) {
    identical = digest[0] == -digest[1];
  }
  if (hsdp) {
    // Identical only if every shard is: one verdict for the replica.
    int64_t same = identical ? 1 : 0;
    identical =
        hsdp->shard()
            ->all_reduce(absl::MakeSpan(&same, 1), vemesh::ReduceOp::kMin)
            .ok() &&
        same == 1;
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
        identical ? "identical" : "DIFFERENT", hsdp ? "DP_REPLICATE" : "DP",
        hsdp ? plan->dp_replicate : plan->dp, recoveries,
        static_cast<long long>(communicators),
        static_cast<long long>(communicators_at_start));
    std::fflush(stdout);
  }
  VESCALE_DEVICE_MESH.reset();
  return pass ? 0 : 1;
}

}  // namespace train_nd
