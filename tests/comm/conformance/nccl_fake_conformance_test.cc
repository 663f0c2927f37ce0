// The conformance suite (conformance_test.cc) on the NCCL backend through
// its seam, with the fake NCCL and CUDA of tests/comm/fake_nccl.h: no GPU
// needed. The ranks are threads over Gloo twins, as a cuda mesh makes them;
// "device memory" is host memory the fake hands out, and the fake really
// moves the data, so every result is checked as on the other backends. On
// groups of 1, 2, 3 and 4 ranks. After each case every NCCL communicator,
// stream, event and buffer must be freed, and none twice.

#include <memory>
#include <string>
#include <vector>

#include "conformance.h"
#include "fake_nccl.h"
#include "gtest/gtest.h"
#include "thread_ranks_harness.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/comm/nccl/nccl_communicator.h"

namespace vemesh::testing {
namespace {

class FakeNcclHarness final : public ThreadRanksHarness {
 public:
  std::string backend() const override { return "nccl"; }
  std::vector<int> Sizes() const override { return {1, 2, 3, 4}; }

  void SetUp() override {
    fake_ = std::make_unique<FakeNccl>();
    fake_->record_calls = false;  // every poll is a call
  }
  void TearDown() override {
    EXPECT_EQ(fake_->LiveComms(), 0) << "NCCL communicators not released";
    EXPECT_EQ(fake_->ReleasedTwice(), 0);
    EXPECT_EQ(fake_->LiveAllocations(), 0)
        << "streams, events or device buffers not freed";
    fake_.reset();
  }

  void* Alloc(size_t bytes) override { return fake_->DeviceAlloc(bytes); }
  void Free(void* p) override { fake_->DeviceFree(p); }

 protected:
  absl::StatusOr<std::shared_ptr<Communicator>> MakeRank(
      std::shared_ptr<MemoryStore> store, int rank, int n) override {
    auto twin = GlooCommunicator::Create(store, "world", rank, n,
                                         GlobalRanks(n), kTimeout);
    if (!twin.ok()) return twin.status();
    auto nccl = CreateNcclCommunicator(*std::move(twin), /*device=*/0);
    if (!nccl.ok()) return nccl.status();
    // A case that went wrong ends instead of waiting for a peer forever.
    (*nccl)->set_timeout(kTimeout);
    return nccl;
  }

 private:
  std::unique_ptr<FakeNccl> fake_;
};

INSTANTIATE_TEST_SUITE_P(FakeNccl, Conformance,
                         ConformanceParams(std::make_shared<FakeNcclHarness>()),
                         ConformanceName);

}  // namespace
}  // namespace vemesh::testing
