// tools/plan/launch_flags.h
//
// The plan's placement said in each launcher's own flags, so that the job is
// launched the way it was planned:
//
//   HostMap block = HostMap::Block(4, 8);
//   LaunchFlags(block, "");
//   // mpirun   -n 8 --map-by slot --hostfile HOSTS   (HOSTS: 2 hosts, slots=4)
//   // srun     -N 2 -n 8 --ntasks-per-node=4 --distribution=block
//   // torchrun --nnodes=2 --nproc_per_node=4
//
// Cyclic placement is `mpirun --map-by node` / `srun --distribution=cyclic`;
// a hostfile is `mpirun --hostfile FILE --map-by slot`. A launcher that
// cannot give the placement (torchrun has no cyclic, no uneven hosts) gets
// no command, and a note saying why.

#ifndef VEMESH_TOOLS_PLAN_LAUNCH_FLAGS_H_
#define VEMESH_TOOLS_PLAN_LAUNCH_FLAGS_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "vemesh/placement/host_map.h"

namespace vemesh::plan {

struct LaunchLine {
  std::string launcher;  // "mpirun", "srun", "torchrun"
  std::string command;   // "mpirun -n 8 --map-by slot ..."; empty: none
  std::string note;      // what the command assumes, or why there is none
};

// `hostfile_path`: the hostfile the plan read (hostfile placement), else "".
std::vector<LaunchLine> LaunchFlags(const HostMap& hosts,
                                    absl::string_view hostfile_path);

}  // namespace vemesh::plan

#endif  // VEMESH_TOOLS_PLAN_LAUNCH_FLAGS_H_
