// The conformance suite (conformance_test.cc) on the MPI backend: every case
// runs on the job's world, one process per rank (ctest runs it under
// mpiexec -np 1, 2 and 4; tests/common's main merges the ranks' results).

#include <mpi.h>

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "conformance.h"
#include "gtest/gtest.h"
#include "vemesh/comm/mpi/mpi_communicator.h"

namespace vemesh::testing {
namespace {

class MpiHarness final : public CommHarness {
 public:
  std::string backend() const override { return "mpi"; }
  std::vector<int> Sizes() const override { return {0}; }  // the job's world

  void OnRanks(int, const RankBody& body) override {
    auto world = MpiCommunicator::World();
    ASSERT_TRUE(world.ok()) << world.status();
    body(*std::move(world));
  }
  std::vector<int> GlobalRanks(int n) const override {
    std::vector<int> out(n);
    std::iota(out.begin(), out.end(), 0);
    return out;
  }

  // MPI cannot cancel the receive rank 0 abandoned: once every rank is
  // here (the first barrier: a message sent earlier could complete the
  // receive before rank 0 looked), the last rank sends the message it
  // waited for, with plain MPI on the communicator's MPI_Comm (the vemesh
  // one is aborted), so that no request is left unmatched at MPI_Finalize.
  void SettleAbandonedRecv(Communicator& comm) override {
    auto* mpi = dynamic_cast<MpiCommunicator*>(&comm);
    ASSERT_NE(mpi, nullptr) << "a split of an MPI world is an MPI communicator";
    MPI_Barrier(mpi->comm());
    if (mpi->rank() == mpi->size() - 1) {
      const int32_t payload[4] = {1, 2, 3, 4};
      MPI_Request request;
      MPI_Isend(payload, 4, MPI_INT32_T, 0, 0, mpi->comm(), &request);
      MPI_Wait(&request, MPI_STATUS_IGNORE);
    }
    MPI_Barrier(mpi->comm());
  }
};

INSTANTIATE_TEST_SUITE_P(Mpi, Conformance,
                         ConformanceParams(std::make_shared<MpiHarness>()),
                         ConformanceName);

}  // namespace
}  // namespace vemesh::testing
