// The elastic mesh on 'cuda' (docs/ELASTIC.md, "The GPU path") through the
// NCCL seam with a fake NCCL and CUDA (tests/comm/fake_nccl.h): no GPU
// needed. Three replicas of two thread-ranks each (DP x TP = 3 x 2, every
// replica its own "launch" whose TP group is a normal cuda mesh group, the
// control plane a MemoryStore they share); each epoch's DP group is an NCCL
// communicator made over that epoch's Gloo group as its twin.
//   * all_reduce over the DP group sums right on every rank;
//   * a replica leaves: the survivors' NCCL operation fails within
//     op_timeout (never a hang), they recover into the next epoch, and every
//     old epoch's NCCL communicator was released with ncclCommAbort inside
//     ncclGroupStart/ncclGroupEnd, never ncclCommDestroy, none twice;
//   * the replica comes back: a new epoch, a new NCCL communicator, sums
//     right over all three.
// And 'meta' is still refused, naming the devices that work.

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "vemesh/elastic/elastic_mesh.h"

#ifdef VEMESH_HAVE_NCCL
#include "tests/comm/fake_nccl.h"
#include "vemesh/bootstrap/store_bootstrap.h"
#include "vemesh/rendezvous/memory_store.h"
#endif

namespace vemesh {
namespace {

// Devices other than cpu and cuda are still refused, saying which work.
TEST(ElasticDevices, MetaIsRefusedNamingCpuAndCuda) {
  auto layout = MeshLayout::Create({2, 2}, {"DP", "TP"});
  ASSERT_TRUE(layout.ok()) << layout.status();
  ElasticOptions o;
  o.store = "redis://127.0.0.1:1";
  o.replica = 0;
  auto el = ElasticMesh::Create(DeviceType::kMeta, *layout, MeshOptions{}, o);
  ASSERT_FALSE(el.ok());
  EXPECT_EQ(el.status().code(), absl::StatusCode::kUnimplemented)
      << el.status();
  EXPECT_THAT(std::string(el.status().message()),
              ::testing::AllOf(::testing::HasSubstr("'meta'"),
                               ::testing::HasSubstr("'cpu'"),
                               ::testing::HasSubstr("'cuda'")));
}

#ifndef VEMESH_HAVE_NCCL

TEST(NcclElastic, NeedsTheNcclBackend) {
  GTEST_SKIP() << "vemesh was built without NCCL: the seam is not compiled";
}

#else  // VEMESH_HAVE_NCCL

using ::testing::ElementsAre;
using ::vemesh::testing::Call;
using ::vemesh::testing::FakeNccl;

constexpr int kShard = 2;  // ranks per replica (TP)
constexpr int kWidth = 4;  // floats per all_reduce
constexpr absl::Duration kOpTimeout = absl::Seconds(2);

// What replica k's rank of TP coordinate `shard` contributes at `step`:
// small integers, exact in float.
float Value(int replica, int shard, int i, int64_t step) {
  return static_cast<float>((replica + 1) * 16 + shard * 4 + i + step % 3);
}

// What one rank did.
struct Outcome {
  std::thread::id thread;
  size_t first_call = 0;  // the fake's call count as the thread began
  absl::Status status;
  int64_t step = -1;
  int bad_sums = 0;
  // The DP sizes of the steps whose sums were right, consecutive ones once.
  std::vector<int> sizes;
  // The first failed DP operation, and how long it took to fail.
  absl::Status first_failure;
  absl::Duration failed_after;
};

struct Rank {
  FakeNccl* fake = nullptr;
  ElasticMesh* el = nullptr;
  int replica = 0;
  int shard = 0;
  Outcome* out = nullptr;

  absl::Status Step(int64_t step) {
    auto dp = el->mesh().get_group("DP");
    if (!dp.ok()) return dp.status();
    auto* x = static_cast<float*>(fake->DeviceAlloc(kWidth * sizeof(float)));
    for (int i = 0; i < kWidth; ++i) x[i] = Value(replica, shard, i, step);
    const absl::Time start = absl::Now();
    absl::Status s =
        (*dp)->all_reduce(x, x, kWidth, DataType::kFloat32, ReduceOp::kSum);
    std::vector<float> got(x, x + kWidth);
    fake->DeviceFree(x);
    if (!s.ok()) {
      if (out->first_failure.ok()) {
        out->first_failure = s;
        out->failed_after = absl::Now() - start;
      }
      return s;
    }
    bool right = true;
    for (int i = 0; i < kWidth; ++i) {
      float want = 0;
      for (int m : el->last_recovery().replicas) {
        want += Value(m, shard, i, step);
      }
      right = right && got[i] == want;
    }
    const int n = static_cast<int>((*dp)->size());
    if (!right) {
      ++out->bad_sums;
    } else if (out->sizes.empty() || out->sizes.back() != n) {
      out->sizes.push_back(n);
    }
    absl::SleepFor(absl::Milliseconds(10));
    return absl::OkStatus();
  }
};

// The loop of vemesh/elastic/elastic_mesh.h; `quit(step)`: this rank's
// replica leaves before `step` (as if killed).
absl::Status Loop(Rank& rank, int64_t steps,
                  const std::function<bool(int64_t)>& quit,
                  std::atomic<int64_t>* progress) {
  ElasticMesh& el = *rank.el;
  int64_t step = el.last_recovery().resume_step;
  absl::Status s = el.register_state_dict_fn(
      "step",
      [&step]() -> absl::StatusOr<std::string> {
        return std::string(reinterpret_cast<const char*>(&step), sizeof(step));
      },
      [&step](absl::string_view b) {
        if (b.size() != sizeof(step)) return absl::InvalidArgumentError("step");
        std::memcpy(&step, b.data(), sizeof(step));
        return absl::OkStatus();
      });
  if (!s.ok()) return s;
  s = el.sync_state();
  while (step < steps) {
    if (quit && quit(step)) return absl::CancelledError("quit");
    if (s.ok()) s = rank.Step(step);
    absl::StatusOr<StepVerdict> v = el.end_step(s);
    if (!v.ok()) return v.status();
    if (v->committed) ++step;
    if (progress != nullptr) progress->store(step);
    s = absl::OkStatus();
    if (v->recover) {
      absl::StatusOr<Recovery> r = el.recover(step);
      if (!r.ok()) return r.status();
      if (r->evicted) return absl::FailedPreconditionError("evicted");
    }
  }
  rank.out->step = step;
  return absl::OkStatus();
}

class NcclElastic : public ::testing::Test {
 protected:
  FakeNccl fake_;
  std::shared_ptr<MemoryStore> control_ = std::make_shared<MemoryStore>();

  // Launches replica `k` (two threads) of a job that starts with `starting`
  // replicas; each writes its outcome to outcomes[shard].
  std::vector<std::thread> Launch(int k, int starting, int64_t steps,
                                  std::function<bool(int64_t)> quit,
                                  std::vector<Outcome>& outcomes,
                                  std::atomic<int64_t>* progress = nullptr) {
    auto launch_store = std::make_shared<MemoryStore>();
    std::vector<std::thread> threads;
    for (int r = 0; r < kShard; ++r) {
      threads.emplace_back([this, k, r, starting, steps, quit, launch_store,
                            progress, &outcomes] {
        Outcome& out = outcomes[r];
        out.thread = std::this_thread::get_id();
        out.first_call = fake_.CallCount();
        MeshOptions inner;  // cuda: NCCL groups over a Gloo world
        inner.timeout = absl::Seconds(20);
        inner.bootstrap = std::make_shared<StoreBootstrap>(
            launch_store, r, kShard, absl::StrCat("launch", k));
        ElasticOptions o;
        o.control_store = control_;
        o.replica = k;
        o.replica_dim = "DP";
        o.job = "nccl_elastic";
        o.heartbeat_ttl = absl::Milliseconds(300);
        o.op_timeout = kOpTimeout;
        o.recovery_timeout = absl::Seconds(30);
        o.form_timeout = absl::Seconds(10);
        auto layout = MeshLayout::Create({starting, kShard}, {"DP", "TP"});
        if (!layout.ok()) {
          out.status = layout.status();
          return;
        }
        auto el = ElasticMesh::Create(DeviceType::kCuda, *layout, inner, o);
        if (!el.ok()) {
          out.status = el.status();
          return;
        }
        Rank rank{&fake_, el->get(), k, r, &out};
        out.status = Loop(rank, steps, quit, r == 0 ? progress : nullptr);
      });
    }
    return threads;
  }

  // The NCCL communicators of the elastic DP groups made on `thread`: every
  // ncclCommInitRankConfig but the first (the launch's own world).
  std::vector<int> DpComms(const Outcome& o) {
    std::vector<int> ids;
    for (const Call& c : fake_.CallsOf(o.thread, o.first_call)) {
      if (c.fn == "ncclCommInitRankConfig") ids.push_back(c.comm);
    }
    if (!ids.empty()) ids.erase(ids.begin());
    return ids;
  }

  // Every DP communicator of `thread` was released once, with ncclCommAbort
  // inside an NCCL group, never with ncclCommDestroy.
  void ExpectAbortedInGroups(const Outcome& o, size_t at_least) {
    const std::vector<int> ids = DpComms(o);
    EXPECT_GE(ids.size(), at_least);
    const std::vector<Call> calls = fake_.CallsOf(o.thread, o.first_call);
    for (int id : ids) {
      SCOPED_TRACE(absl::StrCat("DP communicator ", id));
      EXPECT_EQ(fake_.Comm(id).aborted, 1);
      EXPECT_EQ(fake_.Comm(id).destroyed, 0);
      int aborts = 0;
      for (const Call& c : calls) {
        if (c.comm != id) continue;
        EXPECT_NE(c.fn, "ncclCommDestroy");
        if (c.fn == "ncclCommAbort") {
          ++aborts;
          EXPECT_TRUE(c.in_group) << "ncclCommAbort outside a group";
        }
      }
      EXPECT_EQ(aborts, 1);
    }
  }
};

TEST_F(NcclElastic, AllReduceOverTheDpGroupSumsRight) {
  constexpr int64_t kSteps = 8;
  std::vector<std::vector<Outcome> > outcomes(3, std::vector<Outcome>(kShard));
  std::vector<std::thread> all;
  for (int k = 0; k < 3; ++k) {
    for (std::thread& t : Launch(k, 3, kSteps, nullptr, outcomes[k])) {
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
      EXPECT_EQ(o.bad_sums, 0);
      EXPECT_THAT(o.sizes, ElementsAre(3));
      EXPECT_TRUE(o.first_failure.ok()) << o.first_failure;
      // One epoch, one DP communicator, aborted when the mesh went.
      EXPECT_EQ(DpComms(o).size(), 1u);
      ExpectAbortedInGroups(o, 1);
    }
  }
  EXPECT_EQ(fake_.ReleasedTwice(), 0);
  EXPECT_EQ(fake_.LiveComms(), 0);
}

TEST_F(NcclElastic, ReplicaLeavesThenRejoins) {
  constexpr int64_t kSteps = 60;
  // [3]: replica 2's relaunch.
  std::vector<std::vector<Outcome> > outcomes(4, std::vector<Outcome>(kShard));
  std::atomic<bool> left{false};
  std::atomic<int64_t> progress{0};
  std::function<bool(int64_t)> leaves = [&](int64_t step) {
    if (step < 5) return false;
    left = true;
    return true;
  };
  std::vector<std::thread> all;
  for (int k = 0; k < 3; ++k) {
    for (std::thread& t : Launch(k, 3, kSteps, k == 2 ? leaves : nullptr,
                                 outcomes[k], k == 0 ? &progress : nullptr)) {
      all.push_back(std::move(t));
    }
  }
  while (!left) absl::SleepFor(absl::Milliseconds(5));
  all[4].join();  // the leaving replica's threads are gone
  all[5].join();
  // Back once the survivors trained a few steps in their own epoch.
  while (progress.load() < 15) absl::SleepFor(absl::Milliseconds(5));
  std::vector<std::thread> again = Launch(2, 3, kSteps, nullptr, outcomes[3]);
  for (size_t i = 0; i < 4; ++i) all[i].join();
  for (std::thread& t : again) t.join();

  for (int k : {0, 1}) {
    for (int r = 0; r < kShard; ++r) {
      const Outcome& o = outcomes[k][r];
      SCOPED_TRACE(absl::StrCat("survivor replica ", k, " rank ", r));
      ASSERT_TRUE(o.status.ok()) << o.status;
      EXPECT_EQ(o.step, kSteps);
      EXPECT_EQ(o.bad_sums, 0);
      EXPECT_THAT(o.sizes, ElementsAre(3, 2, 3));
      // The NCCL operation failed (its peer gone), bounded by op_timeout.
      EXPECT_FALSE(o.first_failure.ok());
      EXPECT_TRUE(absl::IsDeadlineExceeded(o.first_failure) ||
                  absl::IsAborted(o.first_failure) ||
                  absl::IsUnavailable(o.first_failure))
          << o.first_failure;
      EXPECT_LT(o.failed_after, kOpTimeout + absl::Seconds(1));
      // Epochs 1 (3 replicas), 2 (two), 3 (three again): each one's NCCL
      // communicator aborted in a group when it ended (the last when the
      // mesh went), none destroyed.
      ExpectAbortedInGroups(o, 3);
    }
  }
  for (int r = 0; r < kShard; ++r) {
    SCOPED_TRACE(absl::StrCat("relaunched replica 2 rank ", r));
    const Outcome& o = outcomes[3][r];
    ASSERT_TRUE(o.status.ok()) << o.status;
    EXPECT_EQ(o.step, kSteps);
    EXPECT_EQ(o.bad_sums, 0);
    EXPECT_THAT(o.sizes, ElementsAre(3));
    ExpectAbortedInGroups(o, 1);
    EXPECT_TRUE(absl::IsCancelled(outcomes[2][r].status))
        << outcomes[2][r].status;
  }
  EXPECT_EQ(fake_.ReleasedTwice(), 0);
  EXPECT_EQ(fake_.LiveComms(), 0);
}

#endif  // VEMESH_HAVE_NCCL

}  // namespace
}  // namespace vemesh
