// vemesh/placement/host_map.h
//
// Where each rank of a job lands: the placement policy a launcher applies,
// as a value the planner asks "which host holds rank r, and which slot?".
//
//   HostMap block = HostMap::Block(/*ranks_per_host=*/4, /*world_size=*/8);
//   block.host_of(5);     // 1    (srun --distribution=block,
//                         //       mpirun --map-by slot)
//   HostMap cyclic = HostMap::Cyclic(/*host_count=*/2, 8);
//   cyclic.host_of(5);    // 1, cyclic.local_of(5) == 2
//                         //      (srun --distribution=cyclic,
//                         //       mpirun --map-by node)
//   HostMap slots = HostMap::Slots({"node0", "node1"}, {4, 2});
//   slots.host_of(5);     // 1    (an Open MPI hostfile, --map-by slot)
//
// Block and cyclic are arithmetic, O(1) per query whatever the world.
// Slots keeps one start per host (the planner bounds them by
// kMaxHostfileHosts) and answers host_of by binary search. Hosts are numbered
// in the order of their lowest rank, as get_placement() numbers them.

#ifndef VEMESH_PLACEMENT_HOST_MAP_H_
#define VEMESH_PLACEMENT_HOST_MAP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace vemesh {

enum class PlacementPolicy {
  kBlock,     // consecutive ranks fill a host, then the next
  kCyclic,    // rank r on host r mod H: round-robin over the hosts
  kHostfile,  // block fill over hosts of uneven sizes (a hostfile's slots)
};
// "block", "cyclic", "hostfile".
absl::string_view PlacementPolicyName(PlacementPolicy policy);

class HostMap {
 public:
  // One host of one rank: the empty world's placement.
  HostMap() = default;
  // Block placement (kept as a constructor: HostMap{4, 8}).
  HostMap(int64_t ranks_per_host, int64_t world_size);

  // `ranks_per_host` >= 1, `world_size` >= 1 (the caller validates).
  static HostMap Block(int64_t ranks_per_host, int64_t world_size);
  // 1 <= `host_count` <= `world_size` (the caller validates).
  static HostMap Cyclic(int64_t host_count, int64_t world_size);
  // Hosts filled in order, host i taking sizes[i] > 0 ranks; the world is
  // their sum. `names` has one entry per size.
  static HostMap Slots(std::vector<std::string> names,
                       std::vector<int64_t> sizes);

  PlacementPolicy policy() const { return policy_; }
  int64_t world_size() const { return world_size_; }
  // Hosts holding at least one rank.
  int64_t host_count() const;
  // Block: the ranks per host; otherwise the largest host.
  int64_t ranks_per_host() const { return ranks_per_host_; }
  int64_t max_host_size() const;

  int64_t host_of(int64_t rank) const;
  // The slot of a rank on its host (its local rank).
  int64_t local_of(int64_t rank) const;
  // Ranks on `host`, and the `local`-th of them (both indices in range).
  int64_t host_size(int64_t host) const;
  int64_t rank_on(int64_t host, int64_t local) const;

  // Host names from a hostfile; empty for block and cyclic.
  const std::vector<std::string>& names() const { return names_; }
  // Hostfile only: first rank of every host, and the world size at the end.
  const std::vector<int64_t>& starts() const { return starts_; }

  // The placement in a few words, for messages: "4 ranks per host",
  // "cyclic over 2 hosts", "hostfile slots 4,2".
  std::string Describe() const;

 private:
  PlacementPolicy policy_ = PlacementPolicy::kBlock;
  int64_t world_size_ = 1;
  int64_t ranks_per_host_ = 1;
  int64_t cyclic_hosts_ = 1;
  std::vector<std::string> names_;
  std::vector<int64_t> starts_;
};

}  // namespace vemesh

#endif  // VEMESH_PLACEMENT_HOST_MAP_H_
