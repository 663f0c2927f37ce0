// bench/collectives.cc
//
// What vemesh's Communicator costs on top of MPI: all_reduce of 4 KiB, 1 MiB
// and 16 MiB float buffers over the registry's TP and DP communicators,
// against MPI_Allreduce on the same groups made by hand (MPI_Comm_split),
// alternated in one mpirun job.
//
//   mpirun --oversubscribe -n 8 build/bench/collectives --shape=2x2x2 --reps=31
//
// Each repetition takes a vemesh sample and two MPI samples, in an order
// rotated by the repetition. A sample is the slowest rank's mean time per
// all_reduce over a batch of calls; the table gives both medians, their
// ratio, the median of the ratios of paired samples (the figure least moved
// by machine noise), and the same paired ratio of the two MPI samples, a
// control that shows how far noise alone moves a ratio.

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/mpi_bench.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/registry/ve_device_mesh.h"

ABSL_FLAG(std::string, shape, "",
          "mesh shape with DP and TP dimensions, e.g. 2x2x2 (PP,DP,TP) or "
          "2x4 (DP,TP); default: 2x2x2 on 8 ranks, 2x2 on 4, else Nx2");
ABSL_FLAG(int, reps, 31, "paired samples per group and size");
ABSL_FLAG(bool, smoke, false,
          "one repetition of one call per size: proves the program works");

namespace vemesh::bench {
namespace {

struct Size {
  const char* label;
  size_t floats;
  int batch;  // calls per sample: a sample lasts some milliseconds
};
const Size kSizes[] = {{"4 KiB", 1024, 200},
                       {"1 MiB", 256 * 1024, 20},
                       {"16 MiB", 4 * 1024 * 1024, 3}};

struct Group {
  std::string role;                    // "TP" or "DP"
  std::shared_ptr<Communicator> mesh;  // the registry's
  MPI_Comm hand = MPI_COMM_NULL;       // made by hand
};

void Run(const std::vector<int64_t>& shape, int reps, bool smoke) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::vector<std::string> names = RoleNames(shape.size());
  auto mesh = VESCALE_DEVICE_MESH.init_device_mesh("cpu", shape, names);
  if (!mesh.ok())
    Die(absl::StrCat("init_device_mesh: ", mesh.status().ToString()));

  const HandMesh hand(shape);
  std::vector<Group> groups;
  for (const std::string role : {"TP", "DP"}) {
    size_t d = 0;
    while (d < names.size() && names[d] != role) ++d;
    if (d == names.size()) Die("the mesh needs DP and TP dimensions");
    Group g;
    g.role = role;
    auto comm = role == "TP"
                    ? VESCALE_DEVICE_MESH.get_tensor_parallel_dim_groups()
                    : VESCALE_DEVICE_MESH.get_data_parallel_dim_groups();
    Check(comm.status(), "registry group");
    g.mesh = *comm;
    MPI_Comm_split(MPI_COMM_WORLD, hand.color(rank, d), hand.key(rank, d),
                   &g.hand);
    // Same members in the same order, or the comparison means nothing.
    auto members = g.mesh->ranks();
    if (std::vector<int>(members.begin(), members.end()) !=
        WorldRanksOf(g.hand)) {
      Die(absl::StrCat("the registry's ", role,
                       " group differs from the "
                       "hand-made one"));
    }
    groups.push_back(g);
  }

  if (rank == 0) {
    std::printf("\nworld %lld, mesh %s (%s), %d paired samples\n\n",
                static_cast<long long>(hand.size()), ShapeText(shape).c_str(),
                absl::StrJoin(names, ",").c_str(), reps);
    std::printf(
        "| group | size | buffer | vemesh median us | MPI median us "
        "| ratio of medians | median paired ratio | control: MPI/MPI "
        "paired |\n");
    std::printf("|---|---:|---|---:|---:|---:|---:|---:|\n");
  }
  for (Group& g : groups) {
    for (const Size& size : kSizes) {
      std::vector<float> buffer(size.floats, 1.0f);
      // Both paths must compute the same sum (every rank added 1).
      Check(g.mesh->all_reduce(absl::MakeSpan(buffer), ReduceOp::kSum),
            "all_reduce");
      if (buffer.front() != static_cast<float>(g.mesh->size())) {
        Die("vemesh all_reduce gave a wrong sum");
      }
      std::fill(buffer.begin(), buffer.end(), 1.0f);
      MPI_Allreduce(MPI_IN_PLACE, buffer.data(),
                    static_cast<int>(buffer.size()), MPI_FLOAT, MPI_SUM,
                    g.hand);
      if (buffer.back() != static_cast<float>(g.mesh->size())) {
        Die("MPI_Allreduce gave a wrong sum");
      }
      // Zeros from here on: the sums stay finite however many calls.
      std::fill(buffer.begin(), buffer.end(), 0.0f);

      const int batch = smoke ? 1 : size.batch;
      auto by_vemesh = [&] {
        Check(g.mesh->all_reduce(absl::MakeSpan(buffer), ReduceOp::kSum),
              "all_reduce");
      };
      auto by_mpi = [&] {
        MPI_Allreduce(MPI_IN_PLACE, buffer.data(),
                      static_cast<int>(buffer.size()), MPI_FLOAT, MPI_SUM,
                      g.hand);
      };
      // vemesh, MPI, and MPI again: the MPI/MPI ratio is the control.
      const Paired t = SamplePaired(reps, batch, by_vemesh, by_mpi);
      if (rank == 0) {
        const double v = Median(t.a), m = Median(t.b);
        std::printf("| %s | %d | %s | %.1f | %.1f | %.3f | %.3f | %.3f |\n",
                    g.role.c_str(), g.mesh->size(), size.label, v * 1e6,
                    m * 1e6, v / m, Median(t.paired), Median(t.control));
      }
    }
  }
  for (Group& g : groups) MPI_Comm_free(&g.hand);
  groups.clear();
  VESCALE_DEVICE_MESH.reset();
}

std::vector<int64_t> DefaultShape(int world) {
  if (world == 8) return {2, 2, 2};
  if (world == 4) return {2, 2};
  return {world / 2, 2};
}

}  // namespace
}  // namespace vemesh::bench

int main(int argc, char** argv) {
  using namespace vemesh::bench;
  MPI_Init(&argc, &argv);
  absl::ParseCommandLine(argc, argv);
  const bool smoke = absl::GetFlag(FLAGS_smoke);
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::vector<int64_t> shape = DefaultShape(world);
  if (!absl::GetFlag(FLAGS_shape).empty()) {
    auto parsed = ParseShape(absl::GetFlag(FLAGS_shape));
    if (!parsed.ok()) Die(std::string(parsed.status().message()));
    shape = *parsed;
  }
  Run(shape, smoke ? 1 : absl::GetFlag(FLAGS_reps), smoke);
  MPI_Finalize();
  return 0;
}
