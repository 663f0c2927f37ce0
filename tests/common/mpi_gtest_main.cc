// main() for GoogleTest binaries that run under mpiexec, one process a rank.
//
// Every rank runs every test. Rank 0 prints the usual GoogleTest report; the
// other ranks print only their failures, each line tagged with the rank, so
// that 8 ranks stay readable. The exit code is non-zero on any rank that saw
// a failure, which makes mpiexec (and ctest) fail.
#include <cstdio>

#include "gtest/gtest.h"
#include "vemesh/comm/mpi/mpi_environment.h"

namespace {

// Prints failed assertions only, tagged "[rank N]".
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_,
                   info.test_suite_name(), info.name());
    }
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  vemesh::MpiSession mpi(&argc, &argv);
  if (!mpi.status().ok()) {
    std::fprintf(stderr, "MPI failed to start: %s\n",
                 std::string(mpi.status().message()).c_str());
    return 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  return RUN_ALL_TESTS();
}
