#include "tools/plan/launch_flags.h"

#include "absl/strings/str_cat.h"

namespace vemesh::plan {
namespace {

// A path as a shell word: as is when it is plain, else in single quotes.
std::string ShellWord(absl::string_view path) {
  const bool plain = !path.empty() &&
                     path.find_first_not_of(
                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUV"
                         "WXYZ0123456789_-./:=+,@%") == absl::string_view::npos;
  if (plain) return std::string(path);
  std::string out = "'";
  for (char c : path) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

}  // namespace

std::vector<LaunchLine> LaunchFlags(const HostMap& hosts,
                                    absl::string_view hostfile_path) {
  const int64_t world = hosts.world_size();
  const int64_t nodes = hosts.host_count();
  const int64_t per_host = hosts.ranks_per_host();
  std::vector<LaunchLine> out;
  switch (hosts.policy()) {
    case PlacementPolicy::kBlock: {
      out.push_back(
          {"mpirun",
           absl::StrCat("mpirun -n ", world, " --map-by slot --hostfile HOSTS"),
           absl::StrCat("HOSTS lists ", nodes, nodes == 1 ? " host" : " hosts",
                        " with slots=", per_host, " each")});
      out.push_back({"srun",
                     absl::StrCat("srun -N ", nodes, " -n ", world,
                                  " --ntasks-per-node=", per_host,
                                  " --distribution=block"),
                     ""});
      if (world % per_host == 0) {
        out.push_back(
            {"torchrun",
             absl::StrCat("torchrun --nnodes=", nodes,
                          " --nproc_per_node=", per_host),
             "node_rank 0.." + absl::StrCat(nodes - 1) + " in host order"});
      } else {
        out.push_back(
            {"torchrun", "",
             absl::StrCat("torchrun gives every node the same "
                          "--nproc_per_node; ",
                          world, " ranks do not fill hosts of ", per_host)});
      }
      break;
    }
    case PlacementPolicy::kCyclic:
      out.push_back(
          {"mpirun",
           absl::StrCat("mpirun -n ", world, " --map-by node --hostfile HOSTS"),
           absl::StrCat("HOSTS lists ", nodes, " hosts with slots>=", per_host,
                        " each")});
      out.push_back({"srun",
                     absl::StrCat("srun -N ", nodes, " -n ", world,
                                  " --distribution=cyclic"),
                     ""});
      out.push_back({"torchrun", "",
                     "torchrun places ranks in blocks (node_rank * "
                     "nproc_per_node + local_rank): no cyclic placement"});
      break;
    case PlacementPolicy::kHostfile:
      out.push_back({"mpirun",
                     absl::StrCat("mpirun -n ", world, " --hostfile ",
                                  ShellWord(hostfile_path), " --map-by slot"),
                     ""});
      out.push_back(
          {"srun", absl::StrCat("srun -n ", world, " --distribution=arbitrary"),
           absl::StrCat("with SLURM_HOSTFILE naming each rank's host, one "
                        "line per rank (",
                        hosts.names().front(), " ", hosts.host_size(0),
                        " times, ...)")});
      // Hosts of one size are torchrun's blocks.
      bool even = true;
      for (int64_t h = 1; h < nodes; ++h) {
        even &= hosts.host_size(h) == hosts.host_size(0);
      }
      if (even) {
        out.push_back(
            {"torchrun",
             absl::StrCat("torchrun --nnodes=", nodes,
                          " --nproc_per_node=", hosts.host_size(0)),
             absl::StrCat("node_rank 0..", nodes - 1, " in hostfile order")});
      } else {
        out.push_back({"torchrun", "",
                       "torchrun gives every node the same --nproc_per_node: "
                       "no uneven hosts"});
      }
      break;
  }
  return out;
}

}  // namespace vemesh::plan
