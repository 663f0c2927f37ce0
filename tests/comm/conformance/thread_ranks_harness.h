// A CommHarness whose ranks are threads of this process meeting in one
// MemoryStore (Gloo, and NCCL over Gloo twins): each world is fresh, and
// its global ranks are 100, 101, ... so that a mix-up of group and global
// ranks shows.

#ifndef TESTS_COMM_CONFORMANCE_THREAD_RANKS_HARNESS_H_
#define TESTS_COMM_CONFORMANCE_THREAD_RANKS_HARNESS_H_

#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "conformance.h"
#include "gtest/gtest.h"
#include "vemesh/rendezvous/memory_store.h"

namespace vemesh::testing {

class ThreadRanksHarness : public CommHarness {
 public:
  // How long a rank waits for its peers: long enough for 8 ranks on a
  // loaded 2-core machine, and a bound on a case that went wrong.
  static constexpr absl::Duration kTimeout = absl::Seconds(30);

  std::vector<int> GlobalRanks(int n) const override {
    std::vector<int> out(n);
    for (int r = 0; r < n; ++r) out[r] = 100 + r;
    return out;
  }

  void OnRanks(int n, const RankBody& body) override {
    auto store = std::make_shared<MemoryStore>();
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        absl::StatusOr<std::shared_ptr<Communicator>> comm =
            MakeRank(store, r, n);
        ASSERT_TRUE(comm.ok()) << "rank " << r << ": " << comm.status();
        body(*std::move(comm));
      });
    }
    for (std::thread& t : threads) t.join();
  }

 protected:
  // Rank `rank` of a world of `n` meeting in `store`.
  virtual absl::StatusOr<std::shared_ptr<Communicator>> MakeRank(
      std::shared_ptr<MemoryStore> store, int rank, int n) = 0;
};

}  // namespace vemesh::testing

#endif  // TESTS_COMM_CONFORMANCE_THREAD_RANKS_HARNESS_H_
