// The rank and size of the job a multi-rank test runs in, whichever launcher
// started it: MPI (mpiexec) or env:// (torchrun, tests/launch's spawner).
#ifndef TESTS_COMMON_JOB_WORLD_H_
#define TESTS_COMMON_JOB_WORLD_H_

#include <mpi.h>

#include "vemesh/bootstrap/launch.h"
#include "vemesh/comm/mpi/mpi_environment.h"

namespace vemesh::testing {

inline bool LaunchedByEnv() {
  auto info = DetectLaunch();
  return info.ok() && info->kind == LaunchKind::kEnv;
}

inline int JobRank() {
  auto info = DetectLaunch();
  if (info.ok() && info->kind == LaunchKind::kEnv) return info->rank;
  int r = 0;
  if (MpiIsUsable()) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int JobSize() {
  auto info = DetectLaunch();
  if (info.ok() && info->kind == LaunchKind::kEnv) return info->world_size;
  int n = 1;
  if (MpiIsUsable()) MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

}  // namespace vemesh::testing

#endif  // TESTS_COMMON_JOB_WORLD_H_
