// main() for GoogleTest binaries that run as several ranks: under mpiexec,
// or under torchrun / the env:// spawner (tests/launch/).
//
// Under MPI, MPI is started by a vemesh::MpiSession (and finalised when main
// ends) and the ranks' results are merged. Under env:// no MPI is started:
// each rank exits with its own result, and the launcher fails the job when
// any rank fails.
// Rank 0 prints the usual gtest report; the other ranks print only their
// failures, prefixed with their rank. The exit code is the worst over all
// ranks, so a failure on any rank fails the ctest entry even if the
// launcher only looked at rank 0. When every test skipped (no GPU, say) it
// says so, and ctest reports the entry as skipped rather than passed.
//
// vemesh_test(... NP ...) links it (tests/CMakeLists.txt); a test source
// that defines its own main() takes precedence.

#include <mpi.h>

#include <cstdio>
#include <optional>

#include "gtest/gtest.h"
#include "job_world.h"
#include "vemesh/comm/mpi/mpi_environment.h"

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}

  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.message());
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
  const bool env_launch = vemesh::testing::LaunchedByEnv();
  std::optional<vemesh::MpiSession> mpi;
  if (!env_launch) {
    mpi.emplace(&argc, &argv);
    if (!mpi->status().ok()) {
      std::fprintf(stderr, "MPI did not start: %s\n",
                   mpi->status().ToString().c_str());
      return 1;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = vemesh::testing::JobRank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  int result = RUN_ALL_TESTS();
  // ctest reports the entry as skipped (not passed) only when nothing ran:
  // tests/CMakeLists.txt matches this line.
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  if (rank == 0 && unit.test_to_run_count() > 0 &&
      unit.skipped_test_count() == unit.test_to_run_count()) {
    std::printf("vemesh: every test skipped\n");
    std::fflush(stdout);  // before MPI_Finalize closes the forwarding
  }
  if (env_launch) return result;
  int worst = result;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && worst != result) {
    std::fprintf(stderr,
                 "FAILED on another rank: see the [rank N] lines above\n");
  }
  return worst;
}
