// bench/mpi_ops.cc
//
// The MPI backend's operations of issue 15, each against a baseline in the
// same mpirun job, over one group (a private copy of the world):
//
//   (a) bf16 all_reduce against fp32 all_reduce of the same bytes (twice
//       the elements in bf16), both through vemesh;
//   (b) vemesh all_to_all against MPI_Alltoall;
//   (c) blocking all_reduce through vemesh (MPI_Iallreduce polled by
//       Work::wait) against MPI_Allreduce: the cost of the async-based
//       blocking path;
//   (d) MPI_Iallreduce + MPI_Wait against MPI_Allreduce, by plain MPI: how
//       much of (c) is MPI's own non-blocking algorithm rather than vemesh.
//
//   mpirun --oversubscribe --bind-to none -n 4 build/release/bench/mpi_ops
//   --reps=31
//
// As bench/collectives: each repetition takes one sample of A and two of B
// in an order rotated by the repetition; a sample is the slowest rank's mean
// time per call over a batch. The table gives both medians, the median of
// the paired ratios A/B, and the control B/B (how far noise alone moves a
// ratio).

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/mpi_bench.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/comm/mpi/mpi_communicator.h"
#include "vemesh/comm/mpi/mpi_environment.h"

ABSL_FLAG(int, reps, 31, "paired samples per row");
ABSL_FLAG(bool, smoke, false,
          "one repetition of one call per row: proves the program works");

namespace vemesh::bench {
namespace {

struct Size {
  const char* label;
  size_t bytes;
  int batch;  // calls per sample: a sample lasts some milliseconds
};

// One table row: A against B, paired.
void Row(const std::string& what, const Size& size, int reps, bool smoke,
         const std::function<void()>& a, const std::function<void()>& b) {
  const Paired t = SamplePaired(reps, smoke ? 1 : size.batch, a, b);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    std::printf("| %s | %s | %.1f | %.1f | %.3f | %.3f |\n", what.c_str(),
                size.label, Median(t.a) * 1e6, Median(t.b) * 1e6,
                Median(t.paired), Median(t.control));
  }
}

void Header(const char* title, const char* a, const char* b) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return;
  std::printf(
      "\n%s\n\n| row | buffer | %s median us | %s median us | median "
      "paired ratio | control: paired %s/%s |\n",
      title, a, b, b, b);
  std::printf("|---|---|---:|---:|---:|---:|\n");
}

void Run(int reps, bool smoke) {
  auto world = MpiCommunicator::World();
  if (!world.ok()) Die(world.status().ToString());
  std::shared_ptr<MpiCommunicator> comm = *world;
  const MPI_Comm hand = comm->comm();  // the same group, by plain MPI
  const int n = comm->size();
  if (comm->rank() == 0) {
    std::printf("world %d, %d paired samples per row\n", n, reps);
  }

  // (a) bf16 against fp32, the same bytes.
  const Size reduce_sizes[] = {
      {"4 KiB", 4 << 10, 200}, {"1 MiB", 1 << 20, 20}, {"16 MiB", 16 << 20, 3}};
  Header(
      "(a) all_reduce sum through vemesh: bf16 against fp32 of the same "
      "bytes",
      "bf16", "fp32");
  for (const Size& size : reduce_sizes) {
    // Zeros: sums stay exact and finite however many calls.
    std::vector<BFloat16> half(size.bytes / 2, BFloat16(0.0f));
    std::vector<float> full(size.bytes / 4, 0.0f);
    // Both give the right sum once (every rank adds 1).
    std::vector<BFloat16> ones(8, BFloat16(1.0f));
    Check(comm->all_reduce(absl::MakeSpan(ones), ReduceOp::kSum), "bf16 sum");
    if (static_cast<float>(ones[7]) != static_cast<float>(n)) {
      Die("bf16 all_reduce gave a wrong sum");
    }
    Row(
        "bf16 / fp32", size, reps, smoke,
        [&] {
          Check(comm->all_reduce(absl::MakeSpan(half), ReduceOp::kSum),
                "all_reduce bf16");
        },
        [&] {
          Check(comm->all_reduce(absl::MakeSpan(full), ReduceOp::kSum),
                "all_reduce fp32");
        });
  }

  // (b) all_to_all against MPI_Alltoall: the whole buffer is `bytes`.
  const Size a2a_sizes[] = {
      {"4 KiB", 4 << 10, 200}, {"1 MiB", 1 << 20, 20}, {"16 MiB", 16 << 20, 3}};
  Header("(b) all_to_all of float blocks: vemesh against MPI_Alltoall",
         "vemesh", "MPI");
  for (const Size& size : a2a_sizes) {
    const size_t block = size.bytes / 4 / static_cast<size_t>(n);
    std::vector<float> send(block * n), recv(block * n);
    for (int p = 0; p < n; ++p) {
      std::fill(send.begin() + p * block, send.begin() + (p + 1) * block,
                static_cast<float>(comm->rank() * n + p));
    }
    Check(comm->all_to_all(absl::MakeConstSpan(send), absl::MakeSpan(recv)),
          "all_to_all");
    for (int p = 0; p < n; ++p) {
      if (block > 0 &&
          recv[p * block] != static_cast<float>(p * n + comm->rank())) {
        Die("vemesh all_to_all delivered a wrong block");
      }
    }
    Row(
        "all_to_all", size, reps, smoke,
        [&] {
          Check(
              comm->all_to_all(absl::MakeConstSpan(send), absl::MakeSpan(recv)),
              "all_to_all");
        },
        [&] {
          MPI_Alltoall(send.data(), static_cast<int>(block), MPI_FLOAT,
                       recv.data(), static_cast<int>(block), MPI_FLOAT, hand);
        });
  }

  // (c) blocking all_reduce: non-blocking MPI polled, against MPI_Allreduce.
  const Size small_sizes[] = {{"8 B", 8, 2000},
                              {"256 B", 256, 2000},
                              {"4 KiB", 4 << 10, 200},
                              {"1 MiB", 1 << 20, 20}};
  Header(
      "(c) blocking all_reduce sum of floats: vemesh (MPI_Iallreduce + "
      "Work::wait) against MPI_Allreduce",
      "vemesh", "MPI");
  for (const Size& size : small_sizes) {
    std::vector<float> x(size.bytes / 4, 0.0f);
    Row(
        "all_reduce", size, reps, smoke,
        [&] {
          Check(comm->all_reduce(absl::MakeSpan(x), ReduceOp::kSum),
                "all_reduce");
        },
        [&] {
          MPI_Allreduce(MPI_IN_PLACE, x.data(), static_cast<int>(x.size()),
                        MPI_FLOAT, MPI_SUM, hand);
        });
  }

  // (d) The same split by plain MPI: non-blocking + MPI_Wait, blocking.
  Header("(d) plain MPI: MPI_Iallreduce + MPI_Wait against MPI_Allreduce",
         "Iallreduce", "Allreduce");
  for (const Size& size : small_sizes) {
    std::vector<float> x(size.bytes / 4, 0.0f);
    Row(
        "all_reduce", size, reps, smoke,
        [&] {
          MPI_Request request;
          MPI_Iallreduce(MPI_IN_PLACE, x.data(), static_cast<int>(x.size()),
                         MPI_FLOAT, MPI_SUM, hand, &request);
          MPI_Wait(&request, MPI_STATUS_IGNORE);
        },
        [&] {
          MPI_Allreduce(MPI_IN_PLACE, x.data(), static_cast<int>(x.size()),
                        MPI_FLOAT, MPI_SUM, hand);
        });
  }
}

}  // namespace
}  // namespace vemesh::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  vemesh::MpiSession mpi(&argc, &argv);
  if (!mpi.status().ok()) {
    std::fprintf(stderr, "MPI: %s\n", mpi.status().ToString().c_str());
    return 1;
  }
  const bool smoke = absl::GetFlag(FLAGS_smoke);
  vemesh::bench::Run(smoke ? 1 : absl::GetFlag(FLAGS_reps), smoke);
  return 0;
}
