// The training loop of vemesh/elastic/elastic_mesh.h, run as written on an
// HSDP-shaped mesh: DP_REPLICATE x DP_SHARD = 3 x 2, DP_REPLICATE the
// elastic dimension (three replicas of two ranks each, one thread per rank,
// every replica its own "launch" over a MemoryStore of its own, the control
// plane a MemoryStore they share). The library carries the registered state:
// a replica killed and relaunched mid-run receives it from the replica of
// the same shard coordinate and every rank ends with the serial run's
// parameters; a replica whose state is corrupted is named by the fingerprint
// check on every rank (DataLoss), never trained on.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/bootstrap/store_bootstrap.h"
#include "vemesh/elastic/elastic_mesh.h"
#include "vemesh/rendezvous/memory_store.h"

namespace vemesh {
namespace {

using ::testing::HasSubstr;

constexpr int kShard = 2;  // ranks per replica
constexpr int kWidth = 4;  // floats per rank
constexpr int64_t kSteps = 60;

// The gradient every replica computes at `step` for element i of shard s:
// small multiples of 1/8, so that sums and means are exact in float.
float Grad(int64_t step, int shard, int i) {
  return static_cast<float>((step % 5) + shard + i) * 0.125f;
}

float Serial(int shard, int i, int64_t steps) {
  float w = 1.0f;
  for (int64_t s = 0; s < steps; ++s) w -= Grad(s, shard, i);
  return w;
}

// Set on a training thread while it is inside end_step.
thread_local bool t_in_end_step = false;

// The control plane's MemoryStore, counting the calls made from inside
// end_step (the heartbeat threads' own calls are not counted).
class EndStepCountingStore final : public Store {
 public:
  int64_t calls() const { return calls_.load(); }
  absl::Status set(absl::string_view key, absl::string_view value) override {
    Count();
    return inner_.set(key, value);
  }
  absl::StatusOr<std::string> get(absl::string_view key) override {
    Count();
    return inner_.get(key);
  }
  absl::Status wait(absl::Span<const std::string> keys,
                    absl::Time deadline) override {
    Count();
    return inner_.wait(keys, deadline);
  }
  absl::StatusOr<int64_t> add(absl::string_view key, int64_t delta) override {
    Count();
    return inner_.add(key, delta);
  }
  absl::StatusOr<std::string> compare_set(absl::string_view key,
                                          absl::string_view expected,
                                          absl::string_view desired) override {
    Count();
    return inner_.compare_set(key, expected, desired);
  }
  absl::StatusOr<bool> remove(absl::string_view key) override {
    Count();
    return inner_.remove(key);
  }
  absl::Status set_lease(absl::string_view key, absl::string_view value,
                         absl::Duration ttl) override {
    Count();
    {
      // The longest gap between two renewals of one lease.
      std::lock_guard<std::mutex> lock(mu_);
      const absl::Time now = absl::Now();
      auto [at, fresh] = renewed_.try_emplace(std::string(key), now);
      if (!fresh) {
        longest_gap_ = std::max(longest_gap_, now - at->second);
        at->second = now;
      }
    }
    return inner_.set_lease(key, value, ttl);
  }
  absl::Duration longest_renewal_gap() {
    std::lock_guard<std::mutex> lock(mu_);
    return longest_gap_;
  }
  absl::StatusOr<std::vector<std::string>> wait_get(
      absl::Span<const std::string> keys, absl::Time deadline) override {
    Count();
    return inner_.wait_get(keys, deadline);
  }

 private:
  void Count() {
    if (t_in_end_step) calls_.fetch_add(1);
  }
  MemoryStore inner_;
  std::atomic<int64_t> calls_{0};
  std::mutex mu_;
  std::map<std::string, absl::Time> renewed_;  // under mu_
  absl::Duration longest_gap_;                 // under mu_
};

// One rank's model: its shard of the parameters.
struct Model {
  int shard = 0;
  std::vector<float> w = std::vector<float>(kWidth, 1.0f);
  std::vector<float> start;  // the start of the step
  ElasticMesh* el = nullptr;

  absl::Status TrainStep(int64_t step) {
    start = w;
    auto dp = el->mesh().get_group("DP_REPLICATE");
    if (!dp.ok()) return dp.status();
    std::vector<float> g(kWidth);
    for (int i = 0; i < kWidth; ++i) g[i] = Grad(step, shard, i);
    absl::Status s = (*dp)->all_reduce(g.data(), g.data(), kWidth,
                                       DataType::kFloat32, ReduceOp::kSum);
    if (!s.ok()) return s;
    const float n = static_cast<float>((*dp)->size());
    for (int i = 0; i < kWidth; ++i) w[i] -= g[i] / n;
    absl::SleepFor(absl::Milliseconds(15));
    return absl::OkStatus();
  }
  void RestoreStartOfStep() {
    if (!start.empty()) w = start;
  }
  ReplicaState::StateDictFn SaveModel() {
    return [this]() -> absl::StatusOr<std::string> {
      return std::string(reinterpret_cast<const char*>(w.data()),
                         w.size() * sizeof(float));
    };
  }
  ReplicaState::LoadStateDictFn LoadModel() {
    return [this](absl::string_view b) {
      if (b.size() != w.size() * sizeof(float)) {
        return absl::InvalidArgumentError("model: wrong size");
      }
      std::memcpy(w.data(), b.data(), b.size());
      return absl::OkStatus();
    };
  }
};

ReplicaState::StateDictFn SaveStep(int64_t* step) {
  return [step]() -> absl::StatusOr<std::string> {
    return std::string(reinterpret_cast<const char*>(step), sizeof(*step));
  };
}
ReplicaState::LoadStateDictFn LoadStep(int64_t* step) {
  return [step](absl::string_view b) {
    if (b.size() != sizeof(*step)) return absl::InvalidArgumentError("step");
    std::memcpy(step, b.data(), sizeof(*step));
    return absl::OkStatus();
  };
}

// What one rank did.
struct Outcome {
  absl::Status status;
  int64_t step = -1;
  std::vector<float> w;
  int dp_size = 0;
  bool evicted = false;
  int recoveries = 0;
  absl::Status last_step_status;  // the last recovery record's
  int64_t dp_agreements = -1;     // ElasticMesh::dp_agreements at the end
};

// `quit(step)`: this rank's replica leaves (as if killed) before `step`.
// `after_commit(step, model)`: a test hook after each committed step.
// `bug(step, shard)`: a status the caller's step returns after training
// (a caller's bug), or OK.
struct Hooks {
  std::function<bool(int64_t)> quit;
  std::function<void(int64_t, Model&)> after_commit;
  std::function<absl::Status(int64_t, int)> bug;
};

// The header's loop, from `ElasticMesh& el` on, verbatim but for the hooks
// and the model being this file's.
absl::Status Loop(ElasticMesh& el, Model& model, int64_t steps,
                  const Hooks& hooks, Outcome& out) {
  int64_t step = el.last_recovery().resume_step;
  absl::Status reg =
      el.register_state_dict_fn("step", SaveStep(&step), LoadStep(&step));
  if (reg.ok()) {
    reg = el.register_state_dict_fn("model", model.SaveModel(),
                                    model.LoadModel());
  }
  if (!reg.ok()) return reg;
  absl::Status s = el.sync_state();  // a joiner receives the state here
  while (step < steps) {
    if (hooks.quit && hooks.quit(step)) return absl::CancelledError("quit");
    if (s.ok()) s = model.TrainStep(step);  // DP ops may fail
    if (s.ok() && hooks.bug) s = hooks.bug(step, model.shard);
    t_in_end_step = true;
    absl::StatusOr<StepVerdict> v = el.end_step(s);  // collective
    t_in_end_step = false;
    if (!v.ok()) return v.status();  // store lost, states differ
    if (v->committed) {
      ++step;
      if (hooks.after_commit) hooks.after_commit(step, model);
    } else {
      model.RestoreStartOfStep();
    }
    s = absl::OkStatus();
    if (v->recover) {
      absl::StatusOr<Recovery> r = el.recover(step);  // carries the state
      if (!r.ok()) return r.status();
      ++out.recoveries;
      out.last_step_status = r->step_status;
      if (r->evicted) {
        out.evicted = true;
        return absl::OkStatus();
      }
    }
  }
  out.step = step;
  return absl::OkStatus();
}

class DocLoop : public ::testing::Test {
 protected:
  std::shared_ptr<EndStepCountingStore> control_ =
      std::make_shared<EndStepCountingStore>();
  absl::Duration heartbeat_ttl_ = absl::Milliseconds(300);

  // Launches replica `k` (two threads) and returns them; each writes its
  // outcome to outcomes[shard].
  std::vector<std::thread> Launch(int k, const Hooks& hooks,
                                  std::vector<Outcome>& outcomes,
                                  int fingerprint_every = 0,
                                  bool rides = false) {
    auto launch_store = std::make_shared<MemoryStore>();
    std::vector<std::thread> threads;
    for (int r = 0; r < kShard; ++r) {
      threads.emplace_back([this, k, r, hooks, launch_store, &outcomes,
                            fingerprint_every, rides] {
        Outcome& out = outcomes[r];
        MeshOptions inner;
        inner.backend = "gloo";
        inner.timeout = absl::Seconds(20);
        inner.bootstrap = std::make_shared<StoreBootstrap>(
            launch_store, r, kShard, absl::StrCat("launch", k));
        ElasticOptions o;
        o.control_store = control_;
        o.replica = k;
        o.replica_dim = "DP_REPLICATE";
        o.job = "doc_loop";
        o.heartbeat_ttl = heartbeat_ttl_;
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
        Model model;
        model.shard = r;
        model.el = el->get();
        (*el)->set_verdict_rides_on_step(rides);
        out.status = Loop(**el, model, kSteps, hooks, out);
        out.w = model.w;
        out.dp_size = (*el)->last_recovery().dp_size;
        out.dp_agreements = (*el)->dp_agreements();
      });
    }
    return threads;
  }
};

TEST_F(DocLoop, KilledReplicaRelaunchedReceivesTheState) {
  std::vector<std::vector<Outcome>> outcomes(
      4, std::vector<Outcome>(kShard));  // [3]: replica 2's relaunch
  std::atomic<bool> killed{false};
  Hooks plain;
  Hooks dies;
  dies.quit = [&](int64_t step) {
    if (step < 10) return false;
    killed = true;
    return true;
  };
  std::vector<std::thread> all;
  for (int k = 0; k < 3; ++k) {
    for (std::thread& t : Launch(k, k == 2 ? dies : plain, outcomes[k])) {
      all.push_back(std::move(t));
    }
  }
  while (!killed) absl::SleepFor(absl::Milliseconds(5));
  // The dead launch's threads are gone before its relaunch.
  all[4].join();
  all[5].join();
  absl::SleepFor(absl::Milliseconds(500));
  std::vector<std::thread> again = Launch(2, plain, outcomes[3]);
  for (size_t i = 0; i < all.size(); ++i) {
    if (i != 4 && i != 5) all[i].join();
  }
  for (std::thread& t : again) t.join();

  for (int k : {0, 1, 3}) {
    for (int r = 0; r < kShard; ++r) {
      const Outcome& o = outcomes[k][r];
      SCOPED_TRACE(absl::StrCat("launch ", k, " rank ", r));
      ASSERT_TRUE(o.status.ok()) << o.status;
      EXPECT_FALSE(o.evicted);
      EXPECT_EQ(o.step, kSteps);
      EXPECT_EQ(o.dp_size, 3);  // the relaunch came back in
      ASSERT_EQ(o.w.size(), static_cast<size_t>(kWidth));
      for (int i = 0; i < kWidth; ++i) {
        EXPECT_EQ(o.w[i], Serial(r, i, kSteps)) << "element " << i;
      }
    }
  }
  EXPECT_TRUE(absl::IsCancelled(outcomes[2][0].status));
}

TEST_F(DocLoop, CorruptedReplicaIsNamedOnEveryRank) {
  std::vector<std::vector<Outcome>> outcomes(3, std::vector<Outcome>(kShard));
  Hooks plain;
  Hooks corrupt;
  corrupt.after_commit = [](int64_t step, Model& m) {
    if (step == 5 && m.shard == 0) m.w[0] += 1.0f;
  };
  std::vector<std::thread> all;
  for (int k = 0; k < 3; ++k) {
    for (std::thread& t : Launch(k, k == 1 ? corrupt : plain, outcomes[k], 1)) {
      all.push_back(std::move(t));
    }
  }
  for (std::thread& t : all) t.join();
  for (int k = 0; k < 3; ++k) {
    for (int r = 0; r < kShard; ++r) {
      const Outcome& o = outcomes[k][r];
      SCOPED_TRACE(absl::StrCat("replica ", k, " rank ", r));
      EXPECT_TRUE(absl::IsDataLoss(o.status)) << o.status;
      if (r == 0) {
        EXPECT_THAT(std::string(o.status.message()),
                    HasSubstr("replica 1 has "));
        EXPECT_THAT(std::string(o.status.message()),
                    HasSubstr(", replica 0 has "));
      }
      EXPECT_LT(o.step, 0);  // never reached the end
    }
  }
}

// A caller's bug on one rank (a step that fails with InvalidArgument every
// time, no member lost) is retried max_step_retries times and then ends the
// job on every rank of every replica with the bug's code: no livelock of
// epochs (issue 47: 1,530 recoveries in 300 s before).
TEST_F(DocLoop, CallerBugEndsTheJobOnEveryRankWithItsStatus) {
  std::vector<std::vector<Outcome>> outcomes(3, std::vector<Outcome>(kShard));
  Hooks plain;
  Hooks buggy;
  buggy.bug = [](int64_t step, int shard) {
    return step >= 4 && shard == 1 ? absl::InvalidArgumentError(
                                         "activation shape 3x4, expected 4x4")
                                   : absl::OkStatus();
  };
  const absl::Time start = absl::Now();
  std::vector<std::thread> all;
  for (int k = 0; k < 3; ++k) {
    for (std::thread& t : Launch(k, k == 1 ? buggy : plain, outcomes[k])) {
      all.push_back(std::move(t));
    }
  }
  for (std::thread& t : all) t.join();
  const absl::Duration took = absl::Now() - start;
  for (int k = 0; k < 3; ++k) {
    for (int r = 0; r < kShard; ++r) {
      const Outcome& o = outcomes[k][r];
      SCOPED_TRACE(absl::StrCat("replica ", k, " rank ", r));
      EXPECT_TRUE(absl::IsInvalidArgument(o.status)) << o.status;
      EXPECT_THAT(std::string(o.status.message()),
                  HasSubstr("on replica 1, which is not a lost member"));
      EXPECT_LT(o.step, 0);  // never reached the end
      // Two retries (the default), each through one recovery whose record
      // carries the failing step's status.
      EXPECT_EQ(o.recoveries, 2);
      EXPECT_FALSE(o.last_step_status.ok());
      if (k == 1) {
        EXPECT_TRUE(absl::IsInvalidArgument(o.last_step_status))
            << o.last_step_status;
      }
    }
  }
  // The failing rank's own message comes with the verdict.
  EXPECT_THAT(std::string(outcomes[1][1].status.message()),
              HasSubstr("activation shape 3x4"));
  // Its bound: the recoveries of a live job, not recovery_timeout (30 s).
  EXPECT_LT(took, absl::Seconds(30));
}

// Issue 47 item 5, no per-step tax: with the verdict riding on the step
// (set_verdict_rides_on_step, as RunElasticLoop sets it), a step whose
// gradient all_reduce ran over DP_REPLICATE needs no agreement of its own
// over DP (only the one inside the replica), and end_step makes no store
// call on a steady job (the heartbeat thread's reading). Without it (the
// header's loop, which ends when its last step commits) every step adds
// one DP all_reduce; either way the job trains as the serial run.
TEST_F(DocLoop, SteadyStepsAgreeOnlyInsideTheReplicaAndReadNoStore) {
  // A lease renewed late (a loaded machine) is a failure path, on which
  // end_step reads the store: the steady case has a TTL no renewal misses.
  heartbeat_ttl_ = absl::Seconds(1);
  for (bool every : {false, true}) {
    SCOPED_TRACE(every ? "agreeing over DP every step" : "riding on the step");
    std::vector<std::vector<Outcome>> outcomes(3, std::vector<Outcome>(kShard));
    std::vector<std::thread> all;
    const int64_t calls_before = control_->calls();
    for (int k = 0; k < 3; ++k) {
      for (std::thread& t : Launch(k, Hooks{}, outcomes[k], 0, !every)) {
        all.push_back(std::move(t));
      }
    }
    for (std::thread& t : all) t.join();
    for (int k = 0; k < 3; ++k) {
      for (int r = 0; r < kShard; ++r) {
        const Outcome& o = outcomes[k][r];
        SCOPED_TRACE(absl::StrCat("replica ", k, " rank ", r));
        ASSERT_TRUE(o.status.ok()) << o.status;
        EXPECT_EQ(o.step, kSteps);
        EXPECT_EQ(o.recoveries, 0);
        EXPECT_EQ(o.dp_agreements, every ? kSteps : 0);
        for (int i = 0; i < kWidth; ++i) {
          EXPECT_EQ(o.w[i], Serial(r, i, kSteps)) << "element " << i;
        }
      }
    }
    // end_step reads the store only on a failure path (a lease renewed
    // late on a loaded machine) or at DP rank 0 while the heartbeat's
    // reading lists replicas waiting to join (seen at times as the job
    // forms): a few reads, never one per step (3 leaders x 60 steps).
    const int64_t calls = control_->calls() - calls_before;
    EXPECT_LT(calls, kSteps)
        << "longest lease renewal gap " << control_->longest_renewal_gap();
    std::fprintf(stderr, "store calls from end_step: %lld\n",
                 static_cast<long long>(calls));
    // The next round is a job of its own.
    control_ = std::make_shared<EndStepCountingStore>();
  }
}

// The bound is checked before anything connects: a negative one would
// otherwise end every epoch at once, a huge one is a livelock again.
TEST(DocLoopOptions, MaxStepRetriesOutOfRangeIsNamed) {
  for (int bad : {-1, 1001}) {
    ElasticOptions o;
    o.control_store = std::make_shared<MemoryStore>();
    o.replica = 0;
    o.replica_dim = "DP_REPLICATE";
    o.max_step_retries = bad;
    auto layout = MeshLayout::Create({3, kShard}, {"DP_REPLICATE", "DP_SHARD"});
    ASSERT_TRUE(layout.ok());
    auto el = ElasticMesh::Create(DeviceType::kCpu, *layout, MeshOptions{}, o);
    ASSERT_FALSE(el.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(el.status())) << el.status();
    EXPECT_THAT(std::string(el.status().message()),
                HasSubstr(absl::StrCat("max_step_retries is ", bad)));
  }
}

}  // namespace
}  // namespace vemesh
