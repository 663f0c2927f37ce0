// A cuda mesh under torchrun (env://, issue 32 item 3), through the NCCL seam
// with a fake NCCL and CUDA (tests/comm/fake_nccl.h): the host world is a
// lazy Gloo world over a store, and the mesh must hold no world-sized
// state. The ranks are threads of this process meeting in a MemoryStore.
//
// What a user of such a mesh relies on and can check here:
//   * each dimension group's NCCL communicator is made from a unique id its
//     root posted to the store: 3 ncclCommInitRankConfig per rank of a
//     (2, 2, 2) mesh, no world NCCL communicator, no ncclCommSplit;
//   * the world's Gloo pairs are never connected: the process holds the
//     groups' sockets only;
//   * collectives on each dimension's group give the group's sums;
//   * the world NCCL communicator is made on the first use that needs it
//     (a flatten), not before;
//   * a rank that cannot prepare its GPU fails every rank at once with the
//     same FailedPrecondition naming it, and leaves nothing behind.

#include <cstdlib>
#include <functional>
#include <memory>
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
#include "open_sockets.h"
#include "store_world_bootstrap.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/mesh/device_mesh.h"
#include "vemesh/rendezvous/memory_store.h"
#endif

namespace vemesh {
namespace {

#ifndef VEMESH_HAVE_NCCL

TEST(NcclTorchrunMesh, NeedsTheNcclBackend) {
  GTEST_SKIP() << "vemesh was built without NCCL: the seam is not compiled";
}

#else  // VEMESH_HAVE_NCCL

using ::testing::HasSubstr;
using ::vemesh::testing::FakeNccl;
using ::vemesh::testing::StoreWorldBootstrap;

constexpr int kRanks = 8;
constexpr absl::Duration kTimeout = absl::Seconds(30);
const std::vector<std::string> kNames = {"PP", "DP", "TP"};

int Sockets() { return static_cast<int>(OpenSocketInodes().size()); }

void OnThreads(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (std::thread& t : threads) t.join();
}

// Eight thread-ranks, each with a (2, 2, 2) cuda mesh (or its error) over a
// lazy Gloo world; the meshes live until the MeshRun goes.
struct MeshRun {
  std::vector<std::thread::id> threads{kRanks};
  std::vector<absl::Status> status{kRanks};
  std::vector<std::optional<DeviceMesh> > meshes{kRanks};
  std::vector<std::shared_ptr<StoreWorldBootstrap> > boots{kRanks};
  absl::Duration took;
};

void CreateMeshes(MeshRun& run) {
  auto layout = MeshLayout::Create({2, 2, 2}, kNames);
  ASSERT_TRUE(layout.ok()) << layout.status();
  auto store = std::make_shared<MemoryStore>();
  const absl::Time start = absl::Now();
  OnThreads(kRanks, [&](int r) {
    run.threads[r] = std::this_thread::get_id();
    run.boots[r] = std::make_shared<StoreWorldBootstrap>(store, r, kRanks);
    MeshOptions options;
    options.timeout = kTimeout;
    options.bootstrap = run.boots[r];
    auto mesh = DeviceMesh::Create(DeviceType::kCuda, *layout, options);
    run.status[r] = mesh.status();
    if (mesh.ok()) run.meshes[r].emplace(*std::move(mesh));
  });
  run.took = absl::Now() - start;
}

// Whether rank r is its group's rank 0 along dimension `name` (it then
// makes and posts the group's unique id).
bool Roots(int r, const std::string& name) {
  auto layout = MeshLayout::Create({2, 2, 2}, kNames);
  auto pos = layout->group_position({name}, r);
  return pos.ok() && pos->index == 0;
}

TEST(NcclTorchrunMesh, EachGroupTakesItsIdFromTheStoreAndNoWorldIsMade) {
  FakeNccl fake;
  const int before = Sockets();
  MeshRun run;
  CreateMeshes(run);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(run.status[r].ok()) << "rank " << r << ": " << run.status[r];
  }
  // Each rank: its three groups' sockets (one peer each), never the
  // world's seven.
  EXPECT_EQ(Sockets() - before, kRanks * 3);
  for (int r = 0; r < kRanks; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const std::thread::id t = run.threads[r];
    int roots = 0;
    for (const std::string& name : kNames) roots += Roots(r, name) ? 1 : 0;
    EXPECT_EQ(fake.Count(t, "ncclGetUniqueId"), roots);
    EXPECT_EQ(fake.Count(t, "ncclCommInitRankConfig"), 3);
    EXPECT_EQ(fake.Count(t, "ncclCommSplit"), 0);
    EXPECT_FALSE(run.boots[r]->gloo_world()->connected());
    EXPECT_EQ(run.meshes[r]->backend("TP").value_or(""), "nccl");
  }

  // Each dimension's group sums over its members only.
  fake.record_calls = false;
  OnThreads(kRanks, [&](int r) {
    for (const std::string& name : kNames) {
      auto group = run.meshes[r]->get_group(name);
      ASSERT_TRUE(group.ok()) << group.status();
      EXPECT_EQ((*group)->backend(), "nccl");
      auto* x = static_cast<double*>(fake.DeviceAlloc(sizeof(double)));
      *x = r + 1;
      EXPECT_TRUE((*group)
                      ->all_reduce(x, x, 1, DataType::kFloat64, ReduceOp::kSum)
                      .ok());
      double want = 0;
      for (int m : (*group)->ranks()) want += m + 1;
      EXPECT_EQ(*x, want) << "rank " << r << " " << name;
      fake.DeviceFree(x);
    }
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_FALSE(run.boots[r]->gloo_world()->connected());
  }
  run.meshes.assign(kRanks, std::nullopt);
  EXPECT_EQ(fake.LiveComms(), 0);
  EXPECT_EQ(fake.ReleasedTwice(), 0);
  EXPECT_EQ(fake.LiveAllocations(), 0);
}

TEST(NcclTorchrunMesh, TheWorldNcclCommunicatorIsMadeOnFirstUse) {
  FakeNccl fake;
  MeshRun run;
  CreateMeshes(run);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(run.status[r].ok()) << "rank " << r << ": " << run.status[r];
  }
  const std::vector<std::string> dims = {"DP", "TP"};
  OnThreads(kRanks, [&](int r) {
    // A joined thread's id may come back: count this thread's new calls.
    const std::thread::id me = std::this_thread::get_id();
    const int inits = fake.Count(me, "ncclCommInitRankConfig");
    const int splits = fake.Count(me, "ncclCommSplit");
    auto flat = run.meshes[r]->flatten(dims, "DPTP");
    ASSERT_TRUE(flat.ok()) << "rank " << r << ": " << flat.status();
    EXPECT_EQ((*flat)->size(), 4);
    EXPECT_EQ((*flat)->backend(), "nccl");
    // The world (its id over the host world, which connects now), then
    // the flattened group split from it.
    EXPECT_EQ(fake.Count(me, "ncclCommInitRankConfig") - inits, 1);
    EXPECT_EQ(fake.Count(me, "ncclCommSplit") - splits, 1);
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(run.boots[r]->gloo_world()->connected());
  }
  run.meshes.assign(kRanks, std::nullopt);
  EXPECT_EQ(fake.LiveComms(), 0);
  EXPECT_EQ(fake.LiveAllocations(), 0);
}

TEST(NcclTorchrunMesh, ARankWithoutItsGpuFailsEveryRankNamingIt) {
  FakeNccl fake;
  fake.visible_devices = 7;  // host-local rank 7 has no device
  const char* saved = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string saved_value = saved != nullptr ? saved : "";
  unsetenv("CUDA_VISIBLE_DEVICES");
  MeshRun run;
  CreateMeshes(run);
  if (saved != nullptr) setenv("CUDA_VISIBLE_DEVICES", saved_value.c_str(), 1);
  // At once, not at the timeout.
  EXPECT_LT(run.took, kTimeout / 3);
  for (int r = 0; r < kRanks; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    ASSERT_EQ(run.status[r].code(), absl::StatusCode::kFailedPrecondition)
        << run.status[r];
    const std::string text(run.status[r].message());
    EXPECT_THAT(text, HasSubstr("rank(s) 7 could not prepare their GPU"));
    if (r == 7) {
      EXPECT_THAT(text, HasSubstr("sees only 7 device(s)"));
    }
    EXPECT_EQ(fake.Count(run.threads[r], "ncclCommInitRankConfig"), 0);
    EXPECT_FALSE(run.boots[r]->gloo_world()->connected());
  }
  EXPECT_EQ(fake.LiveComms(), 0);
  EXPECT_EQ(fake.LiveAllocations(), 0);
}

// The store agreement alone: a rank that never posts ends the others' wait
// at the timeout, naming what is missing; bad arguments are refused first.
TEST(NcclStoreGroups, ARankThatNeverPostsEndsTheWaitAtTheTimeout) {
  FakeNccl fake;
  auto store = std::make_shared<MemoryStore>();
  for (int rank : {0, 1}) {  // the judge, then a rank waiting for it
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    const absl::Time start = absl::Now();
    auto groups = CreateNcclGroupsOverStore(store, absl::StrCat("alone", rank),
                                            rank, 3, {}, CudaDeviceRequest{},
                                            absl::Milliseconds(300));
    EXPECT_EQ(groups.status().code(), absl::StatusCode::kDeadlineExceeded)
        << groups.status();
    EXPECT_THAT(std::string(groups.status().message()),
                HasSubstr(rank == 0 ? "alone0/ok/1" : "alone1/verdict"));
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  }
  auto bad = CreateNcclGroupsOverStore(store, "bad", 3, 3, {},
                                       CudaDeviceRequest{}, absl::Seconds(1));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("rank 3 of 3"));
  EXPECT_EQ(fake.LiveComms(), 0);
  EXPECT_EQ(fake.LiveAllocations(), 0);
}

#endif  // VEMESH_HAVE_NCCL

}  // namespace
}  // namespace vemesh
