// The conformance suite (conformance_test.cc) on the Gloo backend: one
// thread per rank in this process, rendezvous through a MemoryStore, on
// groups of 1, 2, 3 and 8 ranks.

#include <memory>
#include <string>
#include <vector>

#include "conformance.h"
#include "thread_ranks_harness.h"
#include "vemesh/comm/gloo/gloo_communicator.h"

namespace vemesh::testing {
namespace {

class GlooHarness final : public ThreadRanksHarness {
 public:
  std::string backend() const override { return "gloo"; }
  std::vector<int> Sizes() const override { return {1, 2, 3, 8}; }
  // Alone, a receive from oneself with nothing queued could only hang, so
  // Gloo refuses it (FailedPrecondition).
  bool SelfRecvBlocks() const override { return false; }
  bool SendRunsAheadOfRecv() const override { return false; }

 protected:
  absl::StatusOr<std::shared_ptr<Communicator>> MakeRank(
      std::shared_ptr<MemoryStore> store, int rank, int n) override {
    auto comm = GlooCommunicator::Create(store, "world", rank, n,
                                         GlobalRanks(n), kTimeout);
    if (!comm.ok()) return comm.status();
    return std::shared_ptr<Communicator>(*std::move(comm));
  }
};

INSTANTIATE_TEST_SUITE_P(Gloo, Conformance,
                         ConformanceParams(std::make_shared<GlooHarness>()),
                         ConformanceName);

}  // namespace
}  // namespace vemesh::testing
