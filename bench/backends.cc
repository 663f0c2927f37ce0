// bench/backends.cc
//
// Gloo against MPI on the same job: mesh creation (DeviceMesh::Create with
// every dimension on one backend) and all_reduce of 4 KiB, 1 MiB and
// 16 MiB float buffers over the DP groups, alternated in one mpirun job so
// that the machine's noise hits both alike.
//
//   mpirun --oversubscribe -n 8 build/bench/backends --shape=2x4 --reps=11
//
// Gloo runs here over a store that rank 0 hosts for the job (the backend a
// torchrun / env:// job gets, reached from mpirun through
// MeshOptions::backend = "gloo"). A sample is the slowest rank's time; the
// table gives both medians and the median of the paired ratios gloo/mpi.

#include <mpi.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/mpi_bench.h"
#include "vemesh/comm/mpi/mpi_environment.h"
#include "vemesh/mesh/device_mesh.h"

ABSL_FLAG(
    std::string, shape, "",
    "DP x TP shape, e.g. 2x4; default 2x(N/2) for an even world, else Nx1");
ABSL_FLAG(int, reps, 11, "paired samples per row");
ABSL_FLAG(bool, smoke, false, "one repetition, one call per size");

namespace vemesh::bench {
namespace {

struct Pair {
  std::vector<double> mpi;
  std::vector<double> gloo;
  std::vector<double> ratio;
};

void Print(const std::string& row, const Pair& p, double scale,
           const char* unit) {
  std::printf("| %-26s | %10.3f %s | %10.3f %s | %6.2f |\n", row.c_str(),
              Median(p.mpi) * scale, unit, Median(p.gloo) * scale, unit,
              Median(p.ratio));
}

absl::StatusOr<DeviceMesh> Make(const std::vector<int64_t>& shape,
                                const char* backend) {
  MeshOptions options;
  options.backend = backend;
  return init_device_mesh("cpu", shape, {"DP", "TP"}, options);
}

void Run(const std::vector<int64_t>& shape, int reps, bool smoke) {
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank == 0) {
    std::printf("backends: %d ranks, mesh DP x TP = %s, %d paired samples\n\n",
                size, ShapeText(shape).c_str(), reps);
    std::printf("| %-26s | %13s | %13s | %6s |\n", "what", "mpi", "gloo",
                "gloo/mpi");
    std::printf("|%s|%s|%s|%s|\n", std::string(28, '-').c_str(),
                std::string(15, '-').c_str(), std::string(15, '-').c_str(),
                std::string(8, '-').c_str());
  }
  // Creation, alternating which backend goes first.
  Pair create;
  for (int rep = 0; rep < reps; ++rep) {
    for (int turn = 0; turn < 2; ++turn) {
      const bool gloo = (rep + turn) % 2 == 1;
      MPI_Barrier(MPI_COMM_WORLD);
      const double start = MPI_Wtime();
      auto mesh = Make(shape, gloo ? "gloo" : "mpi");
      const double took = MaxOverRanks(MPI_Wtime() - start);
      if (!mesh.ok()) Die(absl::StrCat("create: ", mesh.status().ToString()));
      (gloo ? create.gloo : create.mpi).push_back(took);
    }
    create.ratio.push_back(create.gloo.back() / create.mpi.back());
  }
  if (rank == 0) Print("mesh creation", create, 1e3, "ms");

  auto mpi_mesh = Make(shape, "mpi");
  auto gloo_mesh = Make(shape, "gloo");
  if (!mpi_mesh.ok() || !gloo_mesh.ok()) Die("mesh creation failed");
  auto mpi_dp = *mpi_mesh->get_group("DP");
  auto gloo_dp = *gloo_mesh->get_group("DP");
  struct Size {
    const char* label;
    size_t floats;
    int batch;
  };
  const Size sizes[] = {{"4 KiB", 1024, 100},
                        {"1 MiB", 256 * 1024, 10},
                        {"16 MiB", 4 * 1024 * 1024, 2}};
  for (const Size& s : sizes) {
    std::vector<float> data(s.floats, 1.0f);
    const int batch = smoke ? 1 : s.batch;
    Pair p;
    for (int rep = 0; rep < reps; ++rep) {
      for (int turn = 0; turn < 2; ++turn) {
        const bool gloo = (rep + turn) % 2 == 1;
        Communicator& group = gloo ? *gloo_dp : *mpi_dp;
        const double took = Sample(batch, [&] {
          Check(group.all_reduce(absl::MakeSpan(data), ReduceOp::kSum),
                "all_reduce");
        });
        (gloo ? p.gloo : p.mpi).push_back(took);
      }
      p.ratio.push_back(p.gloo.back() / p.mpi.back());
    }
    if (rank == 0) {
      Print(absl::StrCat("all_reduce DP ", s.label), p, 1e6, "us");
    }
  }
}

}  // namespace
}  // namespace vemesh::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  vemesh::MpiSession mpi(&argc, &argv);
  if (!mpi.status().ok()) return 1;
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<int64_t> shape = size % 2 == 0 ? std::vector<int64_t>{2, size / 2}
                                             : std::vector<int64_t>{size, 1};
  if (!absl::GetFlag(FLAGS_shape).empty()) {
    auto parsed = vemesh::bench::ParseShape(absl::GetFlag(FLAGS_shape));
    if (!parsed.ok() || parsed->size() != 2) {
      vemesh::bench::Die("--shape must be DPxTP, e.g. 2x4");
    }
    shape = *parsed;
  }
  const bool smoke = absl::GetFlag(FLAGS_smoke);
  vemesh::bench::Run(shape, smoke ? 1 : absl::GetFlag(FLAGS_reps), smoke);
  return 0;
}
