// How the NCCL backend creates a mesh's per-dimension communicators, seen
// through the NCCL seam (vemesh/comm/nccl/internal/nccl_api.h) with no GPU: a
// fake NCCL and CUDA stand behind it and record every call. The ranks are
// threads of this process; their host twins are real Gloo communicators meeting
// in a MemoryStore, so the host side of each split really happens.
//
// What a user of a "cuda" mesh relies on and can check here:
//   * one ncclGroupStart/ncclGroupEnd per mesh, with the three dimensions'
//     ncclCommSplit calls inside it (NCCL builds them concurrently) and no
//     wait between them;
//   * each split's color and key are the dimension's group and index, its
//     communicator is named after the dimension, non-blocking, and shares
//     resources only when MeshOptions::nccl.split_share says so;
//   * a split that fails, fails late or never finishes leaves no NCCL
//     communicator behind and says which dimension it was.

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/comm/nccl/nccl_communicator.h"

#ifdef VEMESH_HAVE_NCCL
#include "fake_nccl.h"
#include "store_world_bootstrap.h"
#include "vemesh/bootstrap/store_bootstrap.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/mesh/device_mesh.h"
#include "vemesh/rendezvous/memory_store.h"
#endif

namespace vemesh {
namespace {

#ifndef VEMESH_HAVE_NCCL

TEST(NcclSplit, NeedsTheNcclBackend) {
  GTEST_SKIP() << "vemesh was built without NCCL: the seam is not compiled";
}

#else  // VEMESH_HAVE_NCCL

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(30);

// The fake NCCL and CUDA behind the seam: tests/comm/fake_nccl.h.
using ::vemesh::testing::Call;
using ::vemesh::testing::FakeComm;
using ::vemesh::testing::FakeNccl;

std::vector<int> GlobalRanks(int n) {
  std::vector<int> r(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) r[i] = i;
  return r;
}

// Runs `body(rank)` on `n` threads and joins them.
void OnThreads(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (std::thread& t : threads) t.join();
}

// An NCCL world of `n` thread-ranks over Gloo twins, as a mesh makes it.
std::shared_ptr<NcclCommunicator> NcclWorld(std::shared_ptr<MemoryStore> store,
                                            int rank, int n,
                                            const NcclOptions& options = {}) {
  auto twin = GlooCommunicator::Create(store, "world", rank, n, GlobalRanks(n),
                                       kTimeout);
  EXPECT_TRUE(twin.ok()) << twin.status();
  if (!twin.ok()) return nullptr;
  auto nccl = NcclCommunicator::Create(*std::move(twin), rank, options);
  EXPECT_TRUE(nccl.ok()) << nccl.status();
  return nccl.ok() ? *std::move(nccl) : nullptr;
}

const std::vector<std::string> kNames = {"PP", "DP", "TP"};

// The three dimensions' requests of a one-rank (1, 1, 1) mesh.
std::vector<SplitRequest> OneRankRequests() {
  return {{0, 0, "PP"}, {0, 0, "DP"}, {0, 0, "TP"}};
}

// -- A (2, 2, 2) cuda mesh on eight thread-ranks
// -------------------------------

struct MeshRun {
  std::vector<std::thread::id> threads;
  std::vector<std::vector<SplitRequest> > expected;  // per rank, per dim
};

// Creates a cuda mesh (2, 2, 2) on eight thread-ranks over a connected host
// world, checks it and keeps what each rank should have asked NCCL for.
MeshRun CreateMesh(const MeshOptions& base) {
  constexpr int kRanks = 8;
  auto layout = MeshLayout::Create({2, 2, 2}, kNames);
  EXPECT_TRUE(layout.ok());
  MeshRun run;
  run.threads.resize(kRanks);
  run.expected.resize(kRanks);
  auto store = std::make_shared<MemoryStore>();
  OnThreads(kRanks, [&](int r) {
    run.threads[r] = std::this_thread::get_id();
    for (const std::string& name : kNames) {
      auto pos = layout->group_position({name}, r);
      ASSERT_TRUE(pos.ok());
      run.expected[r].push_back(
          {static_cast<int>(pos->group), static_cast<int>(pos->index), name});
    }
    MeshOptions options = base;
    options.timeout = kTimeout;
    // A connected host world (as MPI's): the world NCCL communicator and
    // ncclCommSplit path. An unconnected one (torchrun) takes the store
    // path instead: nccl_torchrun_mesh_test.cc.
    options.bootstrap = std::make_shared<vemesh::testing::StoreWorldBootstrap>(
        store, r, kRanks, /*connected_world=*/true);
    auto mesh = DeviceMesh::Create(DeviceType::kCuda, *layout, options);
    ASSERT_TRUE(mesh.ok()) << "rank " << r << ": " << mesh.status();
    // What the user gets: the TP group is an NCCL communicator of the two
    // ranks that differ in TP only.
    auto tp = mesh->get_group("TP");
    ASSERT_TRUE(tp.ok()) << tp.status();
    EXPECT_EQ((*tp)->backend(), "nccl");
    EXPECT_THAT((*tp)->ranks(), ElementsAre(r & ~1, r | 1));
  });
  return run;
}

TEST(NcclSplitMesh, ThreeDimensionsAreOneGroupOfThreeNamedSplits) {
  FakeNccl fake;
  MeshOptions options;
  options.nccl.group_splits = true;
  const MeshRun run = CreateMesh(options);
  for (int r = 0; r < 8; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const std::thread::id t = run.threads[r];
    // The world, then one group around the three dimensions' splits.
    EXPECT_EQ(fake.Count(t, "ncclCommInitRankConfig"), 1);
    EXPECT_EQ(fake.Count(t, "ncclGroupStart"), 1);
    EXPECT_EQ(fake.Count(t, "ncclGroupEnd"), 1);
    EXPECT_EQ(fake.Count(t, "ncclCommSplit"), 3);
    // Inside the group: the splits and nothing else (no wait between them).
    std::vector<std::string> in_group;
    for (const Call& c : fake.CallsOf(t)) {
      if (c.in_group) in_group.push_back(c.fn);
    }
    EXPECT_THAT(in_group,
                ElementsAre("ncclCommSplit", "ncclCommSplit", "ncclCommSplit"));
    // Each split: the dimension's color and key, named after it,
    // non-blocking, no resource sharing unless asked.
    const std::vector<FakeComm> splits = fake.SplitsOf(t);
    ASSERT_EQ(splits.size(), 3u);
    for (size_t d = 0; d < 3; ++d) {
      SCOPED_TRACE(kNames[d]);
      EXPECT_EQ(splits[d].name, kNames[d]);
      EXPECT_EQ(splits[d].color, run.expected[r][d].color);
      EXPECT_EQ(splits[d].key, run.expected[r][d].key);
      EXPECT_EQ(splits[d].blocking, 0);
      EXPECT_EQ(splits[d].split_share, 0);
    }
  }
  // The meshes are gone: every NCCL communicator was freed once, and every
  // stream and buffer.
  EXPECT_EQ(fake.LiveComms(), 0);
  EXPECT_EQ(fake.ReleasedTwice(), 0);
  EXPECT_EQ(fake.LiveAllocations(), 0);
}

// -- Which device each rank binds (vemesh/comm/nccl/cuda_device.h) ----------

// The CUDA device each thread-rank's NCCL world was made on, after a (2, 2,
// 2) cuda mesh of eight ranks on one host; each rank's status in `out`.
std::vector<int> WorldDevices(FakeNccl& fake, const MeshOptions& base,
                              std::vector<absl::Status>* out) {
  constexpr int kRanks = 8;
  auto layout = MeshLayout::Create({2, 2, 2}, kNames);
  EXPECT_TRUE(layout.ok());
  std::vector<std::thread::id> threads(kRanks);
  out->assign(kRanks, absl::OkStatus());
  auto store = std::make_shared<MemoryStore>();
  OnThreads(kRanks, [&](int r) {
    threads[r] = std::this_thread::get_id();
    MeshOptions options = base;
    options.timeout = kTimeout;
    options.bootstrap =
        std::make_shared<StoreBootstrap>(store, r, kRanks, "job");
    (*out)[r] =
        DeviceMesh::Create(DeviceType::kCuda, *layout, options).status();
  });
  std::vector<int> devices;
  for (int r = 0; r < kRanks; ++r) {
    int device = -1;
    for (const Call& c : fake.CallsOf(threads[r])) {
      if (c.fn == "ncclCommInitRankConfig") device = fake.Comm(c.comm).device;
    }
    devices.push_back(device);
  }
  return devices;
}

// Restores CUDA_VISIBLE_DEVICES at the end of a test.
class VisibleDevices {
 public:
  explicit VisibleDevices(const char* value) {
    if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) saved_ = v;
    if (value != nullptr) {
      setenv("CUDA_VISIBLE_DEVICES", value, 1);
    } else {
      unsetenv("CUDA_VISIBLE_DEVICES");
    }
  }
  ~VisibleDevices() {
    if (saved_.has_value()) {
      setenv("CUDA_VISIBLE_DEVICES", saved_->c_str(), 1);
    } else {
      unsetenv("CUDA_VISIBLE_DEVICES");
    }
  }

 private:
  std::optional<std::string> saved_;
};

TEST(NcclDeviceChoice, EachRankTakesItsHostLocalRanksDevice) {
  FakeNccl fake;
  VisibleDevices unset(nullptr);
  std::vector<absl::Status> status;
  const std::vector<int> devices = WorldDevices(fake, {}, &status);
  for (int r = 0; r < 8; ++r) ASSERT_TRUE(status[r].ok()) << status[r];
  EXPECT_THAT(devices, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
}

TEST(NcclDeviceChoice, OneDevicePerTaskIsDeviceZeroOnEveryRank) {
  FakeNccl fake;
  fake.visible_devices = 1;  // srun --gpus-per-task=1
  VisibleDevices one("2");
  std::vector<absl::Status> status;
  const std::vector<int> devices = WorldDevices(fake, {}, &status);
  for (int r = 0; r < 8; ++r) ASSERT_TRUE(status[r].ok()) << status[r];
  EXPECT_THAT(devices, ElementsAre(0, 0, 0, 0, 0, 0, 0, 0));
}

TEST(NcclDeviceChoice, CudaColonNIsDeviceN) {
  FakeNccl fake;
  VisibleDevices unset(nullptr);
  MeshOptions options;
  options.cuda_device = 5;  // what init_device_mesh("cuda:5", ...) sets
  std::vector<absl::Status> status;
  const std::vector<int> devices = WorldDevices(fake, options, &status);
  for (int r = 0; r < 8; ++r) ASSERT_TRUE(status[r].ok()) << status[r];
  EXPECT_THAT(devices, ElementsAre(5, 5, 5, 5, 5, 5, 5, 5));
}

TEST(NcclDeviceChoice, MoreRanksThanDevicesFailsEveryRankNamingBoth) {
  FakeNccl fake;
  fake.visible_devices = 4;
  VisibleDevices four("0,1,2,3");
  std::vector<absl::Status> status;
  WorldDevices(fake, {}, &status);
  for (int r = 0; r < 8; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    ASSERT_EQ(status[r].code(), absl::StatusCode::kFailedPrecondition)
        << status[r];
    const std::string text(status[r].message());
    EXPECT_THAT(text, HasSubstr("rank(s) 4, 5, 6, 7 could not prepare"));
    if (r >= 4) {
      EXPECT_THAT(text,
                  HasSubstr(absl::StrCat("host-local rank ", r, " (of 8")));
      EXPECT_THAT(text, HasSubstr("sees only 4 device(s)"));
      EXPECT_THAT(text, HasSubstr("CUDA_VISIBLE_DEVICES='0,1,2,3'"));
    }
  }
  EXPECT_EQ(fake.LiveComms(), 0);
}

TEST(NcclDeviceChoice, CudaColonNPastTheDevicesIsInvalidArgument) {
  FakeNccl fake;
  fake.visible_devices = 2;
  VisibleDevices unset(nullptr);
  MeshOptions options;
  options.cuda_device = 2;
  std::vector<absl::Status> status;
  WorldDevices(fake, options, &status);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument)
        << status[r];
    EXPECT_THAT(std::string(status[r].message()),
                HasSubstr("'cuda:2' does not exist: this process sees 2"));
  }
}

TEST(NcclSplitMesh, SplitShareReachesEverySplit) {
  FakeNccl fake;
  MeshOptions options;
  options.nccl.split_share = true;
  const MeshRun run = CreateMesh(options);
  for (int r = 0; r < 8; ++r) {
    for (const FakeComm& c : fake.SplitsOf(run.threads[r])) {
      EXPECT_EQ(c.split_share, 1) << "rank " << r << " " << c.name;
    }
    // One at a time: NCCL 2.28.9 builds grouped children on concurrent
    // threads, which race on the shared parent's stream.
    EXPECT_EQ(fake.Count(run.threads[r], "ncclGroupStart"), 0);
    EXPECT_EQ(fake.Count(run.threads[r], "ncclCommSplit"), 3);
  }
  EXPECT_EQ(fake.LiveComms(), 0);
}

TEST(NcclSplitMesh, OneByOneByDefault) {
  FakeNccl fake;
  const MeshRun run = CreateMesh({});
  for (int r = 0; r < 8; ++r) {
    const std::thread::id t = run.threads[r];
    EXPECT_EQ(fake.Count(t, "ncclGroupStart"), 0);
    EXPECT_EQ(fake.Count(t, "ncclCommSplit"), 3);
    // Each split is waited for before the next is issued.
    std::vector<std::string> order;
    for (const Call& c : fake.CallsOf(t)) {
      if (c.fn == "ncclCommSplit" ||
          (c.fn == "ncclCommGetAsyncError" && !order.empty() &&
           order.back() == "ncclCommSplit")) {
        order.push_back(c.fn);
      }
    }
    EXPECT_THAT(order, ElementsAre("ncclCommSplit", "ncclCommGetAsyncError",
                                   "ncclCommSplit", "ncclCommGetAsyncError",
                                   "ncclCommSplit", "ncclCommGetAsyncError"));
  }
}

// -- split_many on one rank: versions, errors, deadline, abort
// -----------------

TEST(NcclSplitMany, NcclOlderThan227SplitsOneAtATime) {
  FakeNccl fake;
  fake.version = NCCL_VERSION(2, 26, 6);
  auto store = std::make_shared<MemoryStore>();
  auto world = NcclWorld(store, 0, 1);
  ASSERT_NE(world, nullptr);
  auto groups = world->split_many(OneRankRequests());
  ASSERT_TRUE(groups.ok()) << groups.status();
  const std::thread::id me = std::this_thread::get_id();
  EXPECT_EQ(fake.Count(me, "ncclGroupStart"), 0);
  EXPECT_EQ(fake.Count(me, "ncclCommSplit"), 3);
  ASSERT_EQ(groups->size(), 3u);
  for (const auto& g : *groups) ASSERT_NE(g, nullptr);
}

TEST(NcclSplitMany, NegativeColorTakesPartAndGetsNoGroup) {
  FakeNccl fake;
  auto store = std::make_shared<MemoryStore>();
  auto world = NcclWorld(store, 0, 1);
  ASSERT_NE(world, nullptr);
  const std::vector<SplitRequest> requests = {{0, 0, "PP"}, {-1, 0, "DP"}};
  auto groups = world->split_many(requests);
  ASSERT_TRUE(groups.ok()) << groups.status();
  ASSERT_EQ(groups->size(), 2u);
  EXPECT_NE((*groups)[0], nullptr);
  EXPECT_EQ((*groups)[1], nullptr);
  // Both went to NCCL (the split is collective over the parent).
  EXPECT_EQ(fake.Count(std::this_thread::get_id(), "ncclCommSplit"), 2);
  // And split_many waited for the parent's split work to end: NCCL writes
  // the negative color's null into split_many's frame when it does.
  EXPECT_EQ(fake.ParentsStillSplitting(), 0);
}

// split(-1) alone has no child to poll: the wait is on the parent only (on
// an H200 with NCCL 2.28.9, returning at once let NCCL's late write of the
// null land in freed memory).
TEST(NcclSplitMany, ANegativeColorAloneWaitsForTheParent) {
  FakeNccl fake;
  fake.polls_until_ready = 5;
  for (bool grouped : {true, false}) {
    SCOPED_TRACE(grouped ? "grouped" : "one at a time");
    auto store = std::make_shared<MemoryStore>();
    auto world = NcclWorld(store, 0, 1, {.group_splits = grouped});
    ASSERT_NE(world, nullptr);
    auto none = world->split(-1, 0);
    ASSERT_TRUE(none.ok()) << none.status();
    EXPECT_EQ(*none, nullptr);
    EXPECT_EQ(fake.ParentsStillSplitting(), 0);
  }
}

TEST(NcclSplitMany, ASplitNcclRefusesAbortsTheOthersAndNamesTheDimension) {
  FakeNccl fake;
  fake.fail_on_issue = "DP";
  auto store = std::make_shared<MemoryStore>();
  // Grouped: the failing call is inside the group (one at a time is the
  // default, where a failed issue simply ends the loop).
  auto world = NcclWorld(store, 0, 1, {.group_splits = true});
  ASSERT_NE(world, nullptr);
  auto groups = world->split_many(OneRankRequests());
  ASSERT_FALSE(groups.ok());
  EXPECT_EQ(groups.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(groups.status().message(), HasSubstr("'DP'"));
  const std::thread::id me = std::this_thread::get_id();
  // The group was closed, TP never issued, PP (already made) aborted.
  EXPECT_EQ(fake.Count(me, "ncclGroupStart"), 1);
  EXPECT_EQ(fake.Count(me, "ncclGroupEnd"), 1);
  EXPECT_EQ(fake.Count(me, "ncclCommSplit"), 2);
  const std::vector<FakeComm> made = fake.SplitsOf(me);
  ASSERT_EQ(made.size(), 1u);
  EXPECT_EQ(made[0].name, "PP");
  EXPECT_EQ(made[0].aborted, 1);
  // The parent is aborted too: the other ranks are in the same splits.
  EXPECT_TRUE(world->aborted());
  world.reset();
  EXPECT_EQ(fake.LiveComms(), 0);
  EXPECT_EQ(fake.ReleasedTwice(), 0);
  EXPECT_EQ(fake.LiveAllocations(), 0);
}

TEST(NcclSplitMany, ASplitThatFailsLaterAbortsEveryChild) {
  FakeNccl fake;
  fake.fail_async = "TP";
  auto store = std::make_shared<MemoryStore>();
  auto world = NcclWorld(store, 0, 1);
  ASSERT_NE(world, nullptr);
  auto groups = world->split_many(OneRankRequests());
  ASSERT_FALSE(groups.ok());
  // ncclRemoteError: a peer was lost.
  EXPECT_EQ(groups.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(groups.status().message(), HasSubstr("'TP'"));
  for (const FakeComm& c : fake.SplitsOf(std::this_thread::get_id())) {
    EXPECT_EQ(c.aborted, 1) << c.name;
    EXPECT_EQ(c.destroyed, 0) << c.name;
  }
  world.reset();
  EXPECT_EQ(fake.LiveComms(), 0);
  EXPECT_EQ(fake.LiveAllocations(), 0);
}

TEST(NcclSplitMany, ASplitThatNeverFinishesEndsAtTheDeadline) {
  FakeNccl fake;
  fake.never_ready = "DP";
  auto store = std::make_shared<MemoryStore>();
  auto world = NcclWorld(store, 0, 1);
  ASSERT_NE(world, nullptr);
  const absl::Time start = absl::Now();
  auto groups = world->split_many(OneRankRequests(),
                                  absl::Now() + absl::Milliseconds(200));
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(groups.ok());
  EXPECT_EQ(groups.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(groups.status().message(), HasSubstr("'DP'"));
  EXPECT_GE(took, absl::Milliseconds(200));
  EXPECT_LT(took, absl::Seconds(10));
  for (const FakeComm& c : fake.SplitsOf(std::this_thread::get_id())) {
    EXPECT_EQ(c.aborted, 1) << c.name;
  }
  EXPECT_TRUE(world->aborted());
  world.reset();
  EXPECT_EQ(fake.LiveComms(), 0);
  EXPECT_EQ(fake.LiveAllocations(), 0);
}

TEST(NcclSplitMany, TheCommunicatorTimeoutBoundsItToo) {
  FakeNccl fake;
  fake.never_ready = "PP";
  auto store = std::make_shared<MemoryStore>();
  auto world = NcclWorld(store, 0, 1);
  ASSERT_NE(world, nullptr);
  world->set_timeout(absl::Milliseconds(100));
  auto groups = world->split_many(OneRankRequests());  // no deadline given
  ASSERT_FALSE(groups.ok());
  EXPECT_EQ(groups.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(NcclSplitMany, AbortFromAnotherThreadEndsTheWait) {
  FakeNccl fake;
  fake.never_ready = "TP";
  auto store = std::make_shared<MemoryStore>();
  auto world = NcclWorld(store, 0, 1);
  ASSERT_NE(world, nullptr);
  std::thread aborter([world] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    world->abort("stopped by the test");
  });
  auto groups = world->split_many(OneRankRequests());
  aborter.join();
  ASSERT_FALSE(groups.ok());
  EXPECT_EQ(groups.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(groups.status().message(), HasSubstr("stopped by the test"));
  for (const FakeComm& c : fake.SplitsOf(std::this_thread::get_id())) {
    EXPECT_EQ(c.aborted, 1) << c.name;
  }
}

TEST(NcclSplitMany, ChildrenKeepTheOptionsForTheirOwnSplits) {
  FakeNccl fake;
  NcclOptions options;
  options.split_share = true;
  auto store = std::make_shared<MemoryStore>();
  auto world = NcclWorld(store, 0, 1, options);
  ASSERT_NE(world, nullptr);
  auto dp = world->split(0, 0);
  ASSERT_TRUE(dp.ok()) << dp.status();
  auto grandchild = (*dp)->split(0, 0);
  ASSERT_TRUE(grandchild.ok()) << grandchild.status();
  for (const FakeComm& c : fake.SplitsOf(std::this_thread::get_id())) {
    EXPECT_EQ(c.split_share, 1);
    EXPECT_EQ(c.name, "");  // a plain split has no name
  }
}

#endif  // VEMESH_HAVE_NCCL

}  // namespace
}  // namespace vemesh
