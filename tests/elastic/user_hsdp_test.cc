// Issue 47's user test: a program that is not train_nd, written only from
// the public headers and docs/USER_GUIDE.md §5a. Its own two-layer MLP
// (strategies::Linear, tanh) is wrapped ONCE by FullyShardedDataParallel
// (HYBRID_SHARD: shard over DP_SHARD, replicate over DP_REPLICATE) with
// AdamW, its state named ONCE (TrainingState), then the guide's loop:
// strategies::RunElasticLoop, which registers the state with the elastic
// mesh and undoes a step that did not commit. Mesh DP_REPLICATE x
// DP_SHARD = 3 x 2, DP_REPLICATE elastic: three replicas of two ranks
// each, one thread per rank, each replica its own "launch" over a
// MemoryStore of its own, the control plane a MemoryStore they share (or a
// real redis-server on loopback).
//
// What a user checks: every replica ends at the last step with the
// parameters AND AdamW moments of the same model trained by a plain serial
// loop (torch.optim-shaped Optimizer over the whole batch), bit-identical
// across replicas, through a killed and relaunched replica (which receives
// parameters and optimizer state) and a Redis restart; a replica whose
// shard is perturbed is named by the fingerprint check on every rank.

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "redis_server.h"  // tests/common: a redis-server of the test's own
#include "vemesh/base/status_macros.h"
#include "vemesh/bootstrap/store_bootstrap.h"
#include "vemesh/checkpoint/checkpoint.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/elastic/elastic_mesh.h"
#include "vemesh/rendezvous/memory_store.h"
#include "vemesh/strategies/elastic_loop.h"
#include "vemesh/strategies/fully_sharded_data_parallel.h"
#include "vemesh/strategies/linear.h"
#include "vemesh/strategies/optimizer.h"
#include "vemesh/strategies/parameter_placement.h"
#include "vemesh/strategies/periodic_checkpoint.h"
#include "vemesh/strategies/state_dict.h"

namespace vemesh {
namespace {

using strategies::FullyShardedDataParallel;
using strategies::Linear;
using strategies::Matrix;
using strategies::OptimizerOptions;
using strategies::Parameter;
using ::testing::HasSubstr;

// ===========================================================================
// User code: the model, its data, one training step, the guide's loop.
// ===========================================================================

constexpr int kIn = 4, kHidden = 8, kOut = 3;
constexpr int kBatch = 12;  // global rows per step; divides by 4 and 6 ranks
constexpr double kLr = 1e-2;

Matrix Init(int rows, int cols, double seed) {
  Matrix m(rows, cols);
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j)
      m(i, j) = 0.4 * std::sin(seed + 0.7 * i + 0.45 * j);
  }
  return m;
}

// Rows [begin, begin + count) of step `step`'s global batch: inputs, targets.
std::pair<Matrix, Matrix> Batch(int64_t step, int begin, int count) {
  Matrix x(count, kIn), t(count, kOut);
  for (int r = 0; r < count; ++r) {
    const double row = static_cast<double>(step * kBatch + begin + r);
    for (int j = 0; j < kIn; ++j) x(r, j) = std::sin(0.37 * row + 0.91 * j);
    for (int k = 0; k < kOut; ++k) t(r, k) = std::cos(0.23 * row - 0.5 * k);
  }
  return {x, t};
}

struct Mlp {
  Linear fc0{"fc0", Init(kIn, kHidden, 1.0), Init(1, kHidden, 2.0)};
  Linear fc1{"fc1", Init(kHidden, kOut, 3.0), Init(1, kOut, 4.0)};
  std::vector<std::vector<Parameter*>> units() {
    return {fc0.parameters(), fc1.parameters()};
  }
};

// One step of the serial model (the reference) or of a rank's HSDP module
// (`fsdp` set): loss = mean over the global batch of |y - t|^2 / 2, each
// rank taking its slice of the rows.
absl::Status Step(Mlp& m, FullyShardedDataParallel* fsdp, int64_t step) {
  using F = FullyShardedDataParallel;
  const int rows = kBatch / (fsdp ? fsdp->dp_size() : 1);
  auto [x, t] = Batch(step, (fsdp ? fsdp->dp_rank() : 0) * rows, rows);
  // FSDP's hooks around each unit (none for the serial model).
  auto hook = [fsdp](absl::Status (F::*h)(size_t), size_t u) {
    return fsdp ? (fsdp->*h)(u) : absl::OkStatus();
  };
  if (fsdp) fsdp->ZeroGrad();
  VEMESH_RETURN_IF_ERROR(hook(&F::PreForward, 0));
  const Matrix a = m.fc0.Forward(x).array().tanh().matrix();
  VEMESH_RETURN_IF_ERROR(hook(&F::PostForward, 0));
  VEMESH_RETURN_IF_ERROR(hook(&F::PreForward, 1));
  const Matrix y = m.fc1.Forward(a);
  VEMESH_RETURN_IF_ERROR(hook(&F::PostForward, 1));
  VEMESH_RETURN_IF_ERROR(hook(&F::PreBackward, 1));
  const Matrix da = m.fc1.Backward(a, (y - t) / static_cast<double>(rows));
  VEMESH_RETURN_IF_ERROR(hook(&F::PostBackward, 1));
  VEMESH_RETURN_IF_ERROR(hook(&F::PreBackward, 0));
  m.fc0.Backward(x, (da.array() * (1.0 - a.array().square())).matrix());
  VEMESH_RETURN_IF_ERROR(hook(&F::PostBackward, 0));
  if (!fsdp) return absl::OkStatus();
  VEMESH_RETURN_IF_ERROR(fsdp->FinishBackward());  // DP_REPLICATE may fail
  return fsdp->OptimizerStep();
}

// What one rank holds at the end, for the test to compare.
struct Outcome {
  absl::Status status;
  int64_t step = -1;      // at the end (-1: the loop did not finish)
  int64_t committed = 0;  // the last step committed
  int dp_size = 0;
  bool evicted = false;
  bool received_state = false;  // joined and was sent the state
  int recoveries = 0;
  absl::Status last_step_status;  // the last recovery record's
  int undone = 0;           // steps not committed whose updates were restored
  bool identical = false;   // the loop's end-of-job comparison of replicas
  absl::Status comparison;  // ... and whether it could be made
  int64_t start_step = -1;  // where the loop began (a checkpoint's step)
  std::map<int64_t, double> losses;  // the loop's, of the steps trained
  int64_t communicators_at_start = -1, communicators_at_end = -2;
  int shard_rank = 0;
  std::vector<std::vector<double>> shard, exp_avg, exp_avg_sq;  // per unit
  std::vector<int64_t> step_counts;
};

// Test hooks, outside what a user writes: leave (as if killed) before a
// step, fail a step after its update, act after a committed step, or pace
// the steps.
struct Hooks {
  std::function<bool(int64_t)> quit;
  std::function<absl::Status(int64_t, int)> fail_after;
  std::function<void(int64_t, FullyShardedDataParallel&)> after_commit;
  std::function<void(int64_t, ElasticMesh&)> mesh_after_commit;
  // Periodic checkpoints into this directory ("": none), every 20 steps,
  // over the replica's own ranks (a group the loop makes); the job's length
  // (0: kSteps).
  std::string checkpoint_dir;
  int64_t steps = 0;
  absl::Duration pace = absl::Milliseconds(15);
  std::atomic<int64_t>* progress = nullptr;
};

absl::Status Train(ElasticMesh& el, int64_t steps, const Hooks& hooks,
                   Outcome& out);

// ===========================================================================
// User code: the rank's program from the elastic mesh on.
// ===========================================================================

absl::Status Train(ElasticMesh& el, int64_t steps, const Hooks& hooks,
                   Outcome& out) {
  Mlp model;
  strategies::TrainingState state;
  for (auto* layer : {&model.fc0, &model.fc1}) {
    for (Parameter* p : layer->parameters()) {
      absl::Status s =
          state.AddParameter(p, strategies::WholePlacement(
                                    p->name, p->value.rows(), p->value.cols()));
      if (!s.ok()) return s;
    }
  }
  // Once, on the elastic mesh's long-lived groups: it follows the membership.
  absl::StatusOr<FullyShardedDataParallel> made =
      FullyShardedDataParallel::Create(
          el.mesh(),
          {{"fc0", model.fc0.parameters()}, {"fc1", model.fc1.parameters()}},
          {.sharding_strategy = strategies::ShardingStrategy::kHybridShard,
           .shard_dims = {"DP_SHARD"},
           .replicate_dims = {"DP_REPLICATE"}});
  if (!made.ok()) return made.status();
  FullyShardedDataParallel& fsdp = *made;
  absl::Status s = fsdp.SetOptimizer(OptimizerOptions::AdamW(kLr));
  if (s.ok()) s = state.AddFsdp(fsdp, model.units());
  if (!s.ok()) return s;
  out.received_state = el.last_recovery().receives_state;
  // USER_GUIDE §5a from here: the library's loop (registers the state,
  // undoes a step that does not commit, recovers, prints).
  strategies::ElasticLoopHooks loop;
  loop.step = [&](int64_t step) -> absl::StatusOr<double> {
    if (hooks.quit && hooks.quit(step)) return absl::CancelledError("quit");
    VEMESH_RETURN_IF_ERROR(Step(model, &fsdp, step));
    if (hooks.fail_after) {
      VEMESH_RETURN_IF_ERROR(hooks.fail_after(step, fsdp.shard_rank()));
    }
    return 0.0;
  };
  loop.on_commit = [&](int64_t step, double) {
    out.committed = step;
    if (hooks.progress) *hooks.progress = step;
    if (hooks.after_commit) hooks.after_commit(step, fsdp);
    if (hooks.mesh_after_commit) hooks.mesh_after_commit(step, el);
  };
  loop.on_recovery = [&](const Recovery& r) {
    std::fprintf(stderr, "replica %d: %s\n", el.replica(),
                 FormatRecovery(r).c_str());
    out.last_step_status = r.step_status;
    return absl::OkStatus();
  };
  strategies::ElasticLoopOptions options{
      .steps = steps, .pace = hooks.pace, .compare_replicas = true};
  if (!hooks.checkpoint_dir.empty()) {
    // Saved by the replica at DP rank 0 over its own ranks; a fresh job
    // resumes from the latest.
    options.periodic_checkpoint = strategies::PeriodicCheckpointOptions{
        .dir = hooks.checkpoint_dir,
        .every = 20,
        .identity = {{"model", "user_hsdp mlp"}}};
  }
  absl::StatusOr<strategies::ElasticLoopResult> done =
      strategies::RunElasticLoop(el, state, options, loop);
  if (!done.ok()) return done.status();  // store lost, states differ, a bug
  out.recoveries = done->recoveries;
  out.undone = static_cast<int>(done->undone);
  out.identical = done->identical;
  out.comparison = done->comparison;
  out.start_step = done->start_step;
  out.losses = done->losses;
  out.communicators_at_start = done->communicators_at_start;
  out.communicators_at_end = done->communicators_at_end;
  if (done->evicted) {
    out.evicted = true;
    return absl::OkStatus();
  }
  const int64_t step = done->steps;
  // What the test compares (not user code): this rank's shards and moments.
  out.step = step;
  out.dp_size = el.last_recovery().dp_size;
  out.shard_rank = fsdp.shard_rank();
  for (size_t u = 0; u < fsdp.num_units(); ++u) {
    absl::Span<const double> sh = fsdp.local_shard(u);
    out.shard.emplace_back(sh.begin(), sh.end());
    for (auto& [name, buf] : fsdp.optimizer(u)->mutable_state()) {
      (name == "exp_avg" ? out.exp_avg : out.exp_avg_sq)
          .emplace_back(buf.begin(), buf.end());
    }
    out.step_counts.push_back(fsdp.optimizer(u)->step_count());
  }
  return absl::OkStatus();
}

// ===========================================================================
// The test harness.
// ===========================================================================

constexpr int kShard = 2;  // ranks per replica
constexpr int64_t kSteps = 60;

// The serial run: each unit's parameters, exp_avg and exp_avg_sq, flattened
// in the unit's order (as FSDP lays a unit out before sharding it).
struct Reference {
  std::vector<std::vector<double>> values, exp_avg, exp_avg_sq;
};

// Every rank of the three replicas ended well at the last step; then
// `check(replica, outcome)`, traced with the rank's place.
void ForEachFinished(const std::vector<std::vector<Outcome>>& outcomes,
                     const std::function<void(int, const Outcome&)>& check) {
  for (int k = 0; k < static_cast<int>(outcomes.size()); ++k) {
    for (size_t r = 0; r < outcomes[k].size(); ++r) {
      const Outcome& o = outcomes[k][r];
      SCOPED_TRACE(absl::StrCat("replica ", k, " rank ", r));
      if (!o.status.ok()) {
        ADD_FAILURE() << o.status;
        continue;
      }
      EXPECT_EQ(o.step, kSteps);
      check(k, o);
    }
  }
}

Reference Serial(int64_t steps) {
  Mlp m;
  std::vector<Parameter*> params = {&m.fc0.weight(), &m.fc0.bias(),
                                    &m.fc1.weight(), &m.fc1.bias()};
  auto opt =
      strategies::Optimizer::Create(OptimizerOptions::AdamW(kLr), params);
  EXPECT_TRUE(opt.ok()) << opt.status();
  for (int64_t s = 0; s < steps; ++s) {
    EXPECT_TRUE(Step(m, nullptr, s).ok());
    EXPECT_TRUE(opt->Step().ok());
    opt->ZeroGrad();
  }
  Reference r;
  for (size_t u = 0; u < 2; ++u) {
    r.values.emplace_back();
    r.exp_avg.emplace_back();
    r.exp_avg_sq.emplace_back();
    for (size_t k = 2 * u; k < 2 * u + 2; ++k) {
      const Matrix& v = params[k]->value;
      r.values[u].insert(r.values[u].end(), v.data(), v.data() + v.size());
      for (auto& [name, buf] : opt->flat(k).mutable_state()) {
        auto& to = name == "exp_avg" ? r.exp_avg[u] : r.exp_avg_sq[u];
        to.insert(to.end(), buf.begin(), buf.end());
      }
    }
  }
  return r;
}

// The elements [begin, begin + n) of shard rank `rank` of a unit of
// `numel` elements split over kShard ranks (FSDP's even split, padded).
std::vector<double> ShardOf(const std::vector<double>& unit, int rank) {
  const size_t len = (unit.size() + kShard - 1) / kShard;
  const size_t begin = std::min(unit.size(), len * rank);
  const size_t end = std::min(unit.size(), begin + len);
  return {unit.begin() + begin, unit.begin() + end};
}

void ExpectNear(const std::vector<double>& got, const std::vector<double>& want,
                const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-9 * (1.0 + std::fabs(want[i])))
        << what << " element " << i;
  }
}

class UserHsdp : public ::testing::Test {
 protected:
  std::shared_ptr<MemoryStore> control_ = std::make_shared<MemoryStore>();
  std::string redis_;  // "redis://127.0.0.1:PORT" to use Redis instead

  // Launches replica `k` (two threads); each writes outcomes[shard rank].
  std::vector<std::thread> Launch(int k, const Hooks& hooks,
                                  std::vector<Outcome>& outcomes,
                                  int fingerprint_every = 0) {
    auto launch_store = std::make_shared<MemoryStore>();
    std::vector<std::thread> threads;
    for (int r = 0; r < kShard; ++r) {
      threads.emplace_back(
          [this, k, r, hooks, launch_store, &outcomes, fingerprint_every] {
            Outcome& out = outcomes[r];
            MeshOptions inner;
            inner.backend = "gloo";
            inner.timeout = absl::Seconds(20);
            inner.bootstrap = std::make_shared<StoreBootstrap>(
                launch_store, r, kShard, absl::StrCat("launch", k));
            ElasticOptions o;
            if (redis_.empty()) {
              o.control_store = control_;
              o.heartbeat_ttl = absl::Milliseconds(300);
            } else {
              o.store = redis_;
            }
            o.replica = k;
            o.replica_dim = "DP_REPLICATE";
            o.job = "user_hsdp";
            o.op_timeout = absl::Seconds(5);
            o.recovery_timeout = absl::Seconds(30);
            o.form_timeout = absl::Seconds(10);
            o.fingerprint_every = fingerprint_every;
            auto layout =
                MeshLayout::Create({3, kShard}, {"DP_REPLICATE", "DP_SHARD"});
            if (!layout.ok()) {
              out.status = layout.status();
              return;
            }
            auto el = ElasticMesh::Create(DeviceType::kCpu, *layout, inner, o);
            if (!el.ok()) {
              out.status = el.status();
              return;
            }
            out.status =
                Train(**el, hooks.steps > 0 ? hooks.steps : kSteps, hooks, out);
          });
    }
    return threads;
  }

  // Three replicas started at once: replica `odd` with `odd_hooks`, the
  // others with `hooks`; every rank's thread, to join.
  std::vector<std::thread> LaunchThree(
      const Hooks& hooks, int odd, const Hooks& odd_hooks,
      std::vector<std::vector<Outcome>>& outcomes, int fingerprint_every = 0) {
    std::vector<std::thread> all;
    for (int k = 0; k < 3; ++k) {
      for (std::thread& t : Launch(k, k == odd ? odd_hooks : hooks, outcomes[k],
                                   fingerprint_every)) {
        all.push_back(std::move(t));
      }
    }
    return all;
  }

  // Every listed launch ended at the last step, DP=3, with the serial
  // run's parameters and moments, bit-identical across replicas.
  void ExpectTrainedAsSerial(const std::vector<std::vector<Outcome>>& outcomes,
                             const std::vector<int>& launches) {
    const Reference ref = Serial(kSteps);
    for (int k : launches) {
      for (int r = 0; r < kShard; ++r) {
        const Outcome& o = outcomes[k][r];
        SCOPED_TRACE(absl::StrCat("launch ", k, " rank ", r));
        ASSERT_TRUE(o.status.ok()) << o.status;
        EXPECT_FALSE(o.evicted);
        EXPECT_EQ(o.step, kSteps);
        EXPECT_EQ(o.dp_size, 3);
        // The loop's own end-of-job check agrees with the comparison below.
        EXPECT_TRUE(o.identical);
        ASSERT_EQ(o.shard.size(), 2u);
        ASSERT_EQ(o.exp_avg.size(), 2u);
        ASSERT_EQ(o.exp_avg_sq.size(), 2u);
        for (size_t u = 0; u < 2; ++u) {
          ExpectNear(o.shard[u], ShardOf(ref.values[u], o.shard_rank), "w");
          ExpectNear(o.exp_avg[u], ShardOf(ref.exp_avg[u], o.shard_rank),
                     "exp_avg");
          ExpectNear(o.exp_avg_sq[u], ShardOf(ref.exp_avg_sq[u], o.shard_rank),
                     "exp_avg_sq");
          EXPECT_EQ(o.step_counts[u], kSteps);
          // Every replica holds the same bits as the first.
          const Outcome& first = outcomes[launches[0]][r];
          EXPECT_EQ(o.shard[u], first.shard[u]);
          EXPECT_EQ(o.exp_avg[u], first.exp_avg[u]);
          EXPECT_EQ(o.exp_avg_sq[u], first.exp_avg_sq[u]);
        }
      }
    }
  }
};

TEST_F(UserHsdp, KilledReplicaRelaunchedReceivesParametersAndAdamW) {
  const absl::Time begin = absl::Now();
  std::vector<std::vector<Outcome>> outcomes(
      4, std::vector<Outcome>(kShard));  // [3]: replica 2's relaunch
  std::atomic<bool> killed{false};
  Hooks plain;
  Hooks dies;
  dies.quit = [&](int64_t step) {
    if (step < 8) return false;
    killed = true;
    return true;
  };
  std::vector<std::thread> all = LaunchThree(plain, 2, dies, outcomes);
  while (!killed) absl::SleepFor(absl::Milliseconds(5));
  all[4].join();  // the dead launch's threads are gone before its relaunch
  all[5].join();
  absl::SleepFor(absl::Milliseconds(200));
  std::vector<std::thread> again = Launch(2, plain, outcomes[3]);
  for (size_t i = 0; i < all.size(); ++i) {
    if (i != 4 && i != 5) all[i].join();
  }
  for (std::thread& t : again) t.join();

  for (int r = 0; r < kShard; ++r) {
    EXPECT_TRUE(absl::IsCancelled(outcomes[2][r].status))
        << outcomes[2][r].status;
    // The survivors went through the loss and the return; the relaunch
    // joined a running job and was sent parameters and optimizer state.
    EXPECT_GE(outcomes[0][r].recoveries, 2);
    EXPECT_TRUE(outcomes[3][r].received_state);
    for (const auto& m : outcomes[3][r].exp_avg_sq) {
      EXPECT_THAT(m, ::testing::Contains(::testing::Gt(0.0)));
    }
  }
  ExpectTrainedAsSerial(outcomes, {0, 1, 3});
  EXPECT_LT(absl::Now() - begin, absl::Seconds(60));
}

// A step that fails on one rank after every rank applied its update (a
// check of the loss, say): end_step commits it nowhere, every rank restores
// the start of the step, the recovery retries it, and the job ends as the
// serial run.
TEST_F(UserHsdp, StepFailingAfterItsUpdateIsUndoneAndRedone) {
  const absl::Time begin = absl::Now();
  std::vector<std::vector<Outcome>> outcomes(3, std::vector<Outcome>(kShard));
  Hooks plain;
  Hooks once;
  auto failed = std::make_shared<std::atomic<bool>>(false);
  once.fail_after = [failed](int64_t step, int shard) {
    return step == 12 && shard == 1 && !failed->exchange(true)
               ? absl::InternalError("loss is not finite")
               : absl::OkStatus();
  };
  std::vector<std::thread> all = LaunchThree(plain, 1, once, outcomes);
  for (std::thread& t : all) t.join();
  for (int k = 0; k < 3; ++k) {
    for (int r = 0; r < kShard; ++r) {
      const Outcome& o = outcomes[k][r];
      SCOPED_TRACE(absl::StrCat("replica ", k, " rank ", r));
      EXPECT_EQ(o.undone, 1);
      EXPECT_EQ(o.recoveries, 1);
      EXPECT_FALSE(o.last_step_status.ok());
    }
  }
  EXPECT_TRUE(absl::IsInternal(outcomes[1][1].last_step_status))
      << outcomes[1][1].last_step_status;
  ExpectTrainedAsSerial(outcomes, {0, 1, 2});
  EXPECT_LT(absl::Now() - begin, absl::Seconds(60));
}

TEST_F(UserHsdp, PerturbedReplicaIsNamedOnEveryRank) {
  const absl::Time begin = absl::Now();
  std::vector<std::vector<Outcome>> outcomes(3, std::vector<Outcome>(kShard));
  Hooks plain;
  Hooks perturbed;
  perturbed.after_commit = [](int64_t step, FullyShardedDataParallel& f) {
    if (step == 5 && f.shard_rank() == 0) f.mutable_local_shard(0)[0] += 1e-3;
  };
  std::vector<std::thread> all = LaunchThree(plain, 1, perturbed, outcomes, 1);
  for (std::thread& t : all) t.join();
  for (int k = 0; k < 3; ++k) {
    for (int r = 0; r < kShard; ++r) {
      const Outcome& o = outcomes[k][r];
      SCOPED_TRACE(absl::StrCat("replica ", k, " rank ", r));
      EXPECT_TRUE(absl::IsDataLoss(o.status)) << o.status;
      // Shard 0's ranks compared the fingerprints; shard 1's are told.
      EXPECT_THAT(std::string(o.status.message()),
                  HasSubstr(r == 0 ? "replica 1 has "
                                   : "replica 1 differs from replica 0"));
      EXPECT_EQ(o.committed, 5);  // the next step's check stopped the job
      EXPECT_LT(o.step, 0);       // never reached the end
    }
  }
  EXPECT_LT(absl::Now() - begin, absl::Seconds(60));
}

// compare_replicas can fail: a replica whose state differs after the last
// step (no periodic fingerprint to catch it sooner) ends the loop with
// identical == false on every rank of every replica, each at the last step.
TEST_F(UserHsdp, ReplicaDifferingAtTheEndIsNotIdenticalOnEveryRank) {
  std::vector<std::vector<Outcome>> outcomes(3, std::vector<Outcome>(kShard));
  Hooks plain;
  Hooks perturbed;
  perturbed.after_commit = [](int64_t step, FullyShardedDataParallel& f) {
    if (step == kSteps && f.shard_rank() == 1) {
      f.mutable_local_shard(1)[0] += 1e-3;
    }
  };
  std::vector<std::thread> all = LaunchThree(plain, 2, perturbed, outcomes);
  for (std::thread& t : all) t.join();
  ForEachFinished(outcomes,
                  [](int, const Outcome& o) { EXPECT_FALSE(o.identical); });
}

// The end-of-job comparison's last all_reduce (over the replica's own
// DP_SHARD group) fails on one replica: that replica reports the failure as
// a status, not as "the states differ"; the other replicas, whose
// comparison went through, report identical states.
TEST_F(UserHsdp, FailedEndOfJobComparisonIsAStatusNotADifference) {
  std::vector<std::vector<Outcome>> outcomes(3, std::vector<Outcome>(kShard));
  Hooks plain;
  Hooks broken;
  broken.mesh_after_commit = [](int64_t step, ElasticMesh& el) {
    // After the last step: only the comparison uses DP_SHARD from here.
    if (step != kSteps) return;
    absl::StatusOr<std::shared_ptr<Communicator>> g =
        el.mesh().get_group("DP_SHARD");
    if (g.ok()) (*g)->abort("test: DP_SHARD lost after the last step");
  };
  std::vector<std::thread> all = LaunchThree(plain, 1, broken, outcomes);
  for (std::thread& t : all) t.join();
  ForEachFinished(outcomes, [](int k, const Outcome& o) {
    if (k == 1) {
      EXPECT_FALSE(o.identical);
      EXPECT_FALSE(o.comparison.ok());
      EXPECT_THAT(o.comparison.message(), HasSubstr("DP_SHARD lost"));
    } else {
      EXPECT_TRUE(o.identical);
      EXPECT_TRUE(o.comparison.ok()) << o.comparison;
    }
  });
}

// The loop's own periodic checkpoint (ElasticLoopOptions::
// periodic_checkpoint): a job of 40 steps saves at 20 and 40; a fresh job
// (every replica started anew) resumes at 40 and ends with the serial run's
// 60-step parameters and AdamW moments. Each loop returns the losses of the
// steps it trained.
TEST_F(UserHsdp, LoopCheckpointsAndAFreshJobResumesFromIt) {
  char path[] = "/tmp/vemesh_user_hsdp_ckpt_XXXXXX";
  ASSERT_NE(::mkdtemp(path), nullptr);
  Hooks first;
  first.checkpoint_dir = path;
  first.steps = 40;
  std::vector<std::vector<Outcome>> outcomes(3, std::vector<Outcome>(kShard));
  std::vector<std::thread> all = LaunchThree(first, -1, first, outcomes);
  for (std::thread& t : all) t.join();
  for (int k = 0; k < 3; ++k) {
    for (int r = 0; r < kShard; ++r) {
      const Outcome& o = outcomes[k][r];
      SCOPED_TRACE(absl::StrCat("first job: replica ", k, " rank ", r));
      ASSERT_TRUE(o.status.ok()) << o.status;
      EXPECT_EQ(o.step, 40);
      EXPECT_EQ(o.start_step, 0);
      ASSERT_EQ(o.losses.size(), 40u);
      EXPECT_EQ(o.losses.begin()->first, 0);
      // (LiveCommunicatorCount is the process's: the six ranks here are
      // threads of one process, so the counts are only reported.)
      EXPECT_GT(o.communicators_at_start, 0);
    }
  }
  control_ = std::make_shared<MemoryStore>();  // a new job, the same dir
  Hooks second;
  second.checkpoint_dir = path;
  std::vector<std::vector<Outcome>> resumed(3, std::vector<Outcome>(kShard));
  all = LaunchThree(second, -1, second, resumed);
  for (std::thread& t : all) t.join();
  for (int k = 0; k < 3; ++k) {
    for (int r = 0; r < kShard; ++r) {
      const Outcome& o = resumed[k][r];
      SCOPED_TRACE(absl::StrCat("second job: replica ", k, " rank ", r));
      ASSERT_TRUE(o.status.ok()) << o.status;
      EXPECT_EQ(o.start_step, 40);
      ASSERT_EQ(o.losses.size(), 20u);
      EXPECT_EQ(o.losses.begin()->first, 40);
      // (LiveCommunicatorCount is the process's: the six ranks here are
      // threads of one process, so the counts are only reported.)
      EXPECT_GT(o.communicators_at_start, 0);
    }
  }
  ExpectTrainedAsSerial(resumed, {0, 1, 2});
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

TEST_F(UserHsdp, RedisRestartedMidRunEveryReplicaFinishes) {
  absl::StatusOr<std::unique_ptr<testing::RedisServer>> redis =
      testing::RedisServer::Start();
  ASSERT_TRUE(redis.ok()) << redis.status();
  redis_ = absl::StrCat("redis://", (*redis)->address());
  const absl::Time begin = absl::Now();
  std::vector<std::vector<Outcome>> outcomes(3, std::vector<Outcome>(kShard));
  std::atomic<int64_t> progress{0};
  Hooks paced;
  paced.pace = absl::Milliseconds(25);
  paced.progress = &progress;
  std::vector<std::thread> all = LaunchThree(paced, -1, paced, outcomes);
  while (progress < 15) absl::SleepFor(absl::Milliseconds(5));
  // Killed by its PID and started again, empty, on the same port (from this
  // thread: the server dies with the thread that started it).
  ASSERT_TRUE((*redis)->Restart().ok());
  const int64_t restarted_at = progress;
  for (std::thread& t : all) t.join();
  EXPECT_LT(restarted_at, kSteps);  // the restart came mid-run
  // Within the lease TTL: the replicas wrote their record back and trained
  // on in the same epoch, no recovery.
  for (int k = 0; k < 3; ++k) {
    for (int r = 0; r < kShard; ++r) {
      EXPECT_EQ(outcomes[k][r].recoveries, 0)
          << "replica " << k << " rank " << r << ": "
          << outcomes[k][r].last_step_status;
    }
  }
  ExpectTrainedAsSerial(outcomes, {0, 1, 2});
  EXPECT_LT(absl::Now() - begin, absl::Seconds(60));
}

// The loop's checkpoint options, alone on one rank (one replica, one
// thread: the process's communicator count is this rank's): conflicting
// options are named; a checkpoint of the caller's that makes its saver
// during the loop is not a leak; without compare_replicas the comparison
// says it was not asked.
TEST(ElasticLoopOptions, CheckpointOptionsNamedAndCallersSaverNotALeak) {
  auto launch = std::make_shared<MemoryStore>();
  MeshOptions inner;
  inner.backend = "gloo";
  inner.timeout = absl::Seconds(20);
  inner.bootstrap = std::make_shared<StoreBootstrap>(launch, 0, 1, "launch");
  ElasticOptions o;
  o.control_store = std::make_shared<MemoryStore>();
  o.heartbeat_ttl = absl::Milliseconds(300);
  o.replica = 0;
  o.job = "loop_options";
  auto layout = MeshLayout::Create({1}, {"DP"});
  ASSERT_TRUE(layout.ok()) << layout.status();
  auto el = ElasticMesh::Create(DeviceType::kCpu, *layout, inner, o);
  ASSERT_TRUE(el.ok()) << el.status();
  auto world =
      GlooCommunicator::Create(launch, "world", 0, 1, {0}, absl::Seconds(20));
  ASSERT_TRUE(world.ok()) << world.status();
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/loop_options_", getpid());
  std::filesystem::remove_all(dir);
  const strategies::PeriodicCheckpointOptions every_step{.dir = dir,
                                                         .every = 1};
  auto mine = strategies::PeriodicCheckpoint::Create(*world, every_step);
  ASSERT_TRUE(mine.ok()) << mine.status();

  Parameter w("w", Init(2, 2, 1.0));
  strategies::TrainingState state;
  ASSERT_TRUE(
      state.AddParameter(&w, strategies::WholePlacement("w", 2, 2)).ok());
  strategies::ElasticLoopHooks hooks;
  hooks.step = [&](int64_t step) -> absl::StatusOr<double> {
    w.value(0, 0) += 1.0;
    return static_cast<double>(step);
  };

  strategies::ElasticLoopOptions both{.steps = 3};
  both.checkpoint = mine->get();
  both.periodic_checkpoint = every_step;
  both.checkpoint_world = *world;
  auto r = strategies::RunElasticLoop(**el, state, both, hooks);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_THAT(r.status().message(),
              HasSubstr("both checkpoint and periodic_checkpoint"));
  strategies::ElasticLoopOptions world_only{.steps = 3};
  world_only.checkpoint_world = *world;
  r = strategies::RunElasticLoop(**el, state, world_only, hooks);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_THAT(r.status().message(),
              HasSubstr("checkpoint_world is set without periodic_checkpoint"));
  // Options without a world: the loop saves over a group of the replica's
  // own ranks that it makes, and releases it with its checkpoint.
  const std::string own_dir = dir + "_own";
  std::filesystem::remove_all(own_dir);
  strategies::ElasticLoopOptions no_world{.steps = 3};
  no_world.periodic_checkpoint =
      strategies::PeriodicCheckpointOptions{.dir = own_dir, .every = 1};
  r = strategies::RunElasticLoop(**el, state, no_world, hooks);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->communicators_at_end, r->communicators_at_start);
  auto own_latest = checkpoint::LatestStep(own_dir);
  ASSERT_TRUE(own_latest.ok()) << own_latest.status();
  EXPECT_EQ(own_latest->value_or(0), 3);
  std::filesystem::remove_all(own_dir);

  // The caller's checkpoint saves every step: its saver (and its
  // communicator) is made inside the loop and stays the caller's.
  strategies::ElasticLoopOptions yours{.steps = 3};
  yours.checkpoint = mine->get();
  r = strategies::RunElasticLoop(**el, state, yours, hooks);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->steps, 3);
  EXPECT_EQ((*mine)->communicators(), 1);
  EXPECT_EQ(r->communicators_at_end, r->communicators_at_start);
  EXPECT_TRUE(absl::IsFailedPrecondition(r->comparison)) << r->comparison;
  EXPECT_THAT(r->comparison.message(), HasSubstr("compare_replicas"));
  auto latest = checkpoint::LatestStep(dir);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->value_or(0), 3);
  mine->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace vemesh
