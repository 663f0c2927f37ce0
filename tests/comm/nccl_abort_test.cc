// NCCL's abort and shrink rules (2.27+), seen through the NCCL seam with a
// fake NCCL and CUDA (tests/comm/fake_nccl.h): no GPU needed. Thread-ranks
// make cuda meshes over Gloo twins meeting in a MemoryStore.
//   * DeviceMesh::abort() releases all the mesh's communicators (dimensions
//     and flattenings) with ncclCommAbort inside one ncclGroupStart /
//     ncclGroupEnd, never one by one;
//   * after an abort every NCCL communicator of the mesh is released with
//     ncclCommAbort, never ncclCommDestroy (a healthy mesh is destroyed);
//   * shrink uses ncclCommShrink: NCCL_SHRINK_DEFAULT when nothing is in
//     flight, NCCL_SHRINK_ABORT when an operation is (and the parent is
//     then aborted); after abort() it rebuilds over the shrunk twins.

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/comm/nccl/nccl_communicator.h"

#ifdef VEMESH_HAVE_NCCL
#include "fake_nccl.h"
#include "vemesh/bootstrap/store_bootstrap.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/mesh/device_mesh.h"
#include "vemesh/rendezvous/memory_store.h"
#endif

namespace vemesh {
namespace {

#ifndef VEMESH_HAVE_NCCL

TEST(NcclAbort, NeedsTheNcclBackend) {
  GTEST_SKIP() << "vemesh was built without NCCL: the seam is not compiled";
}

#else  // VEMESH_HAVE_NCCL

using ::testing::ElementsAre;
using ::vemesh::testing::Call;
using ::vemesh::testing::FakeComm;
using ::vemesh::testing::FakeNccl;

constexpr absl::Duration kTimeout = absl::Seconds(30);

void OnThreads(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (std::thread& t : threads) t.join();
}

absl::StatusOr<DeviceMesh> CudaMesh(std::shared_ptr<MemoryStore> store,
                                    int rank, std::vector<int64_t> shape,
                                    std::vector<std::string> names) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  VEMESH_ASSIGN_OR_RETURN(MeshLayout layout, MeshLayout::Create(shape, names));
  MeshOptions options;
  options.timeout = kTimeout;
  options.bootstrap = std::make_shared<StoreBootstrap>(
      std::move(store), rank, static_cast<int>(n), "job");
  return DeviceMesh::Create(DeviceType::kCuda, layout, options);
}

// The calls made on this thread from index `from` on.
std::vector<Call> CallsFrom(FakeNccl& fake, size_t from) {
  std::vector<Call> all = fake.CallsOf(std::this_thread::get_id());
  return std::vector<Call>(all.begin() + std::min(from, all.size()), all.end());
}

// The sum over `group` of each member's global rank, on "device" memory.
absl::StatusOr<int64_t> SumOfRanks(FakeNccl& fake, Communicator& group) {
  auto* x = static_cast<int64_t*>(fake.DeviceAlloc(sizeof(int64_t)));
  *x = group.global_rank();
  absl::Status s = group.all_reduce(x, x, 1, DataType::kInt64, ReduceOp::kSum);
  const int64_t sum = *x;
  fake.DeviceFree(x);
  if (!s.ok()) return s;
  return sum;
}

TEST(NcclAbort, AMeshIsAbortedInOneGroupAndNeverDestroyed) {
  FakeNccl fake;
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::thread::id> threads(4);
  OnThreads(4, [&](int r) {
    threads[r] = std::this_thread::get_id();
    auto mesh = CudaMesh(store, r, {2, 2}, {"DP", "TP"});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    ASSERT_TRUE(mesh->flatten({"DP", "TP"}, "DPTP").ok());
    const size_t before = fake.CallsOf(threads[r]).size();
    ASSERT_TRUE(mesh->abort().ok());
    // DP, TP and DPTP: three aborts inside one group, nothing else in it.
    std::vector<std::string> fns;
    for (const Call& c : CallsFrom(fake, before)) {
      fns.push_back(c.in_group ? "  " + c.fn : c.fn);
    }
    EXPECT_THAT(
        fns, ElementsAre("ncclGroupStart", "  ncclCommAbort", "  ncclCommAbort",
                         "  ncclCommAbort", "ncclGroupEnd"));
    // Idempotent: a second abort calls nothing.
    const size_t after = fake.CallsOf(threads[r]).size();
    ASSERT_TRUE(mesh->abort().ok());
    EXPECT_EQ(fake.CallsOf(threads[r]).size(), after);
    // Every operation answers Aborted at once.
    auto tp = mesh->get_group("TP");
    absl::Status s = (*tp)->barrier();
    EXPECT_TRUE(absl::IsAborted(s)) << s;
  });
  // The meshes are gone: the world too was released by abort, none by
  // destroy, each once.
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(fake.Count(threads[r], "ncclCommDestroy"), 0) << r;
    EXPECT_EQ(fake.Count(threads[r], "ncclCommAbort"), 4) << r;
  }
  EXPECT_EQ(fake.LiveComms(), 0);
  EXPECT_EQ(fake.ReleasedTwice(), 0);
  EXPECT_EQ(fake.LiveAllocations(), 0);
}

TEST(NcclAbort, AHealthyMeshIsDestroyed) {
  // The control: without an abort the same mesh goes by ncclCommDestroy.
  FakeNccl fake;
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::thread::id> threads(2);
  OnThreads(2, [&](int r) {
    threads[r] = std::this_thread::get_id();
    auto mesh = CudaMesh(store, r, {2}, {"DP"});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
  });
  for (int r = 0; r < 2; ++r) {
    // The DP group only: under a store bootstrap (env://) no world NCCL
    // communicator is made until a use needs it (issue 32 item 3).
    EXPECT_EQ(fake.Count(threads[r], "ncclCommDestroy"), 1) << r;
    EXPECT_EQ(fake.Count(threads[r], "ncclCommAbort"), 0) << r;
  }
  EXPECT_EQ(fake.LiveComms(), 0);
}

TEST(NcclShrink, NothingInFlightIsShrinkDefaultAndTheParentIsAborted) {
  FakeNccl fake;
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::thread::id> threads(4);
  OnThreads(4, [&](int r) {
    threads[r] = std::this_thread::get_id();
    auto mesh = CudaMesh(store, r, {4}, {"DP"});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    if (r == 2) {
      ASSERT_TRUE(mesh->abort().ok());  // the leaving rank
      return;
    }
    auto smaller = mesh->shrink("DP", {2});
    ASSERT_TRUE(smaller.ok()) << smaller.status();
    auto dp = smaller->get_group("DP");
    EXPECT_EQ((*dp)->backend(), "nccl");
    EXPECT_THAT((*dp)->ranks(), ElementsAre(0, 1, 3));
    auto sum = SumOfRanks(fake, **dp);
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, 0 + 1 + 3);
    std::vector<FakeComm> shrunk;
    for (const Call& c : fake.CallsOf(threads[r])) {
      if (c.fn == "ncclCommShrink") shrunk.push_back(fake.Comm(c.comm));
    }
    ASSERT_EQ(shrunk.size(), 1u);
    EXPECT_EQ(shrunk[0].shrink_flags, NCCL_SHRINK_DEFAULT);
    EXPECT_EQ(shrunk[0].blocking, 0);
  });
  for (int r = 0; r < 4; ++r) {
    // The parent (its excluded peer may be gone) and everything else:
    // released by abort; only the new, healthy group is destroyed.
    EXPECT_EQ(fake.Count(threads[r], "ncclCommDestroy"), r == 2 ? 0 : 1) << r;
  }
  EXPECT_EQ(fake.LiveComms(), 0);
  EXPECT_EQ(fake.ReleasedTwice(), 0);
  EXPECT_EQ(fake.LiveAllocations(), 0);
}

TEST(NcclShrink, AnOperationInFlightIsShrinkAbort) {
  FakeNccl fake;
  fake.record_calls = true;
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::thread::id> threads(3);
  OnThreads(3, [&](int r) {
    threads[r] = std::this_thread::get_id();
    auto mesh = CudaMesh(store, r, {3}, {"DP"});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    if (r == 2) return;  // dies: never joins the all_reduce below
    auto old = *mesh->get_group("DP");
    auto* x = static_cast<int64_t*>(fake.DeviceAlloc(sizeof(int64_t)));
    auto work = old->iall_reduce(x, x, 1, DataType::kInt64, ReduceOp::kSum);
    ASSERT_TRUE(work.ok()) << work.status();
    auto smaller = mesh->shrink("DP", {2});
    ASSERT_TRUE(smaller.ok()) << smaller.status();
    std::vector<FakeComm> shrunk;
    for (const Call& c : fake.CallsOf(threads[r])) {
      if (c.fn == "ncclCommShrink") shrunk.push_back(fake.Comm(c.comm));
    }
    ASSERT_EQ(shrunk.size(), 1u);
    EXPECT_EQ(shrunk[0].shrink_flags, NCCL_SHRINK_ABORT);
    // The operation in flight ended, Aborted; the parent is aborted.
    absl::Status s = (*work)->wait();
    EXPECT_TRUE(absl::IsAborted(s)) << s;
    EXPECT_TRUE(old->aborted());
    auto sum = SumOfRanks(fake, **smaller->get_group("DP"));
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, 0 + 1);
    work->reset();
    fake.DeviceFree(x);
  });
  EXPECT_EQ(fake.LiveComms(), 0);
  EXPECT_EQ(fake.ReleasedTwice(), 0);
}

TEST(NcclShrink, ShrinkAbortWhenAskedEvenWithNothingInFlight) {
  FakeNccl fake;
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::thread::id> threads(2);
  OnThreads(2, [&](int r) {
    threads[r] = std::this_thread::get_id();
    auto mesh = CudaMesh(store, r, {2}, {"DP"});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    if (r == 1) return;
    ShrinkOptions options;
    options.abort_in_flight = true;
    auto smaller = mesh->shrink("DP", {1}, options);
    ASSERT_TRUE(smaller.ok()) << smaller.status();
    std::vector<FakeComm> shrunk;
    for (const Call& c : fake.CallsOf(threads[r])) {
      if (c.fn == "ncclCommShrink") shrunk.push_back(fake.Comm(c.comm));
    }
    ASSERT_EQ(shrunk.size(), 1u);
    EXPECT_EQ(shrunk[0].shrink_flags, NCCL_SHRINK_ABORT);
  });
  EXPECT_EQ(fake.LiveComms(), 0);
}

TEST(NcclShrink, AfterAbortTheGroupsAreRebuiltOverTheShrunkTwins) {
  FakeNccl fake;
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::thread::id> threads(4);
  OnThreads(4, [&](int r) {
    threads[r] = std::this_thread::get_id();
    auto mesh = CudaMesh(store, r, {2, 2}, {"DP", "TP"});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    ASSERT_TRUE(mesh->abort().ok());
    if (r >= 2) return;  // DP coordinate 1 leaves
    const size_t before = fake.CallsOf(threads[r]).size();
    auto smaller = mesh->shrink("DP", {1});
    ASSERT_TRUE(smaller.ok()) << smaller.status();
    int inits = 0;
    for (const Call& c : CallsFrom(fake, before)) {
      EXPECT_NE(c.fn, "ncclCommShrink");  // the parents are gone
      inits += c.fn == "ncclCommInitRankConfig";
    }
    EXPECT_EQ(inits, 2);  // DP (one rank) and TP, made anew
    auto sum = SumOfRanks(fake, **smaller->get_group("TP"));
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, 0 + 1);
  });
  EXPECT_EQ(fake.LiveComms(), 0);
  EXPECT_EQ(fake.ReleasedTwice(), 0);
  EXPECT_EQ(fake.LiveAllocations(), 0);
}

#endif  // VEMESH_HAVE_NCCL

}  // namespace
}  // namespace vemesh
