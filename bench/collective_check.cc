// bench/collective_check.cc
//
// What the collective agreement check costs (issue 44): per-call latency of
// a small all_reduce with the check and without it, side by side in one
// mpirun job.
//
//   mpirun --oversubscribe -n 2 build/release/bench/collective_check --reps=11
//   mpirun --oversubscribe -n 8 build/release/bench/collective_check --reps=11
//
// MPI: MpiCommunicator::set_collective_check(true) (the default) against
// false, on the same world communicator. Gloo has no switch (its check is
// always on): its all_reduce is set against an all_gather of the 32-byte
// summaries alone, the exchange the check adds. A sample is the slowest
// rank's mean time per call over a batch; each row gives the medians, the
// median of the paired ratios with its range, and the control ratio (the
// same call timed twice: what noise alone does to a ratio here).

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/mpi_bench.h"
#include "vemesh/comm/mpi/mpi_communicator.h"
#include "vemesh/comm/mpi/mpi_environment.h"
#include "vemesh/mesh/device_mesh.h"

ABSL_FLAG(int, reps, 11, "paired samples per row");
ABSL_FLAG(int, batch, 200, "calls per sample");
ABSL_FLAG(bool, smoke, false, "one repetition of a few calls");

namespace vemesh::bench {
namespace {

void Row(const char* what, const char* a, const char* b, const Paired& p) {
  std::printf(
      "| %-28s | %-22s %9.2f us | %-26s %9.2f us | %5.2f (%4.2f-%4.2f) "
      "| %5.2f |\n",
      what, a, Median(p.a) * 1e6, b, Median(p.b) * 1e6, Median(p.paired),
      *std::min_element(p.paired.begin(), p.paired.end()),
      *std::max_element(p.paired.begin(), p.paired.end()), Median(p.control));
}

void Run(int reps, int batch) {
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto world = MpiCommunicator::World();
  if (!world.ok()) Die("MpiCommunicator::World failed");
  MeshOptions options;
  options.backend = "gloo";
  auto gloo_mesh = init_device_mesh("cpu", {size}, {"DP"}, options);
  if (!gloo_mesh.ok()) Die("gloo mesh creation failed");
  auto gloo = *gloo_mesh->get_group("DP");
  MpiCommunicator& mpi = **world;
  if (rank == 0) {
    std::printf("collective_check: %d ranks, %d paired samples of %d calls\n\n",
                size, reps, batch);
    std::printf("| %-28s | %-35s | %-39s | %-17s | %-5s |\n", "operation", "A",
                "B", "A/B median (range)", "B/B");
    std::printf("|---|---|---|---|---|\n");
  }
  for (size_t floats : {size_t{8}, size_t{1024}}) {
    std::vector<float> data(floats, 1.0f);
    Paired p = SamplePaired(
        reps, batch,
        [&] {
          mpi.set_collective_check(true);
          Check(mpi.all_reduce(absl::MakeSpan(data), ReduceOp::kSum), "mpi");
        },
        [&] {
          mpi.set_collective_check(false);
          Check(mpi.all_reduce(absl::MakeSpan(data), ReduceOp::kSum), "mpi");
        });
    mpi.set_collective_check(true);
    if (rank == 0) {
      Row(floats == 8 ? "MPI all_reduce 32 B" : "MPI all_reduce 4 KiB",
          "check on (default)", "check off", p);
    }
  }
  std::vector<float> small(8, 1.0f);
  std::vector<char> mine(32, 1), all(32 * static_cast<size_t>(size));
  Paired g = SamplePaired(
      reps, batch,
      [&] {
        Check(gloo->all_reduce(absl::MakeSpan(small), ReduceOp::kSum), "gloo");
      },
      [&] {
        Check(gloo->all_gather(mine.data(), all.data(), mine.size(),
                               DataType::kUInt8),
              "gloo all_gather");
      });
  if (rank == 0) {
    Row("Gloo all_reduce 32 B", "all_reduce (check on)",
        "all_gather 32 B (the check)", g);
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace vemesh::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  vemesh::MpiSession mpi(&argc, &argv);
  if (!mpi.status().ok()) return 1;
  const bool smoke = absl::GetFlag(FLAGS_smoke);
  vemesh::bench::Run(smoke ? 1 : absl::GetFlag(FLAGS_reps),
                     smoke ? 2 : absl::GetFlag(FLAGS_batch));
  return 0;
}
