// examples/first_program: the start-up of docs/USER_GUIDE.md section 1, as
// a program. Any launcher starts it; MPI starts only under an MPI launcher.
//
//   mpirun -n 8 first_program
//   torchrun --no_python --standalone --nproc_per_node=8 --redirects 1
//       --tee 1 first_program              (one line)
//
// Prints one line per rank ("rank 5 of 8: coordinate [1, 0, 1], TP size 2,
// launch torchrun/env://, MPI started: no") and exits 0, or prints the error
// and exits 1. tests/launch/first_program_test.py runs it under both.

#include <cstdio>
#include <string>

#include "absl/strings/str_join.h"
#include "vemesh/bootstrap/launch_session.h"
#include "vemesh/registry/ve_device_mesh.h"

// USER_GUIDE section 1 begins
int main(int argc, char** argv) {
  vemesh::LaunchSession launch(&argc, &argv);  // MPI only under mpirun/srun
  if (!launch.status().ok()) {
    std::fprintf(stderr, "%s\n", launch.status().ToString().c_str());
    return 1;
  }
  // Collective: every rank calls it with the same arguments.
  auto mesh = VESCALE_DEVICE_MESH.init_device_mesh("cpu", {2, 2, 2},
                                                   {"PP", "DP", "TP"});
  if (!mesh.ok()) {
    std::fprintf(stderr, "%s\n", mesh.status().ToString().c_str());
    return 1;
  }
  // USER_GUIDE section 1 ends
  auto coordinate = VESCALE_DEVICE_MESH.get_strategy_coordinate();
  auto tp = VESCALE_DEVICE_MESH.get_strategy_size("TP");
  if (!coordinate.ok() || !tp.ok()) {
    std::fprintf(stderr, "query failed\n");
    return 1;
  }
  const char* kinds[] = {"mpirun/srun", "torchrun/env://", "none"};
  std::printf(
      "rank %d of %d: coordinate [%s], TP size %lld, launch %s, MPI "
      "started: %s\n",
      static_cast<int>(mesh->global_rank()), static_cast<int>(mesh->size()),
      absl::StrJoin(*coordinate, ", ").c_str(), static_cast<long long>(*tp),
      kinds[static_cast<int>(launch.launch().kind)],
      launch.uses_mpi() ? "yes" : "no");
  std::fflush(stdout);
  VESCALE_DEVICE_MESH.reset();  // frees the communicators before MPI ends
  return 0;
}
