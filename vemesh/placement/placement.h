// vemesh/placement/placement.h
//
// Where a mesh's ranks run: each rank's host and, per dimension, how many of
// its groups cross a host boundary. Known after creation from the host
// identities every rank sent in the agreement step (no extra communication):
//
//   absl::StatusOr<Placement> p = VESCALE_DEVICE_MESH.get_placement();
//   p->hosts;                       // {"node0", "node1"}
//   p->host_of(5);                  // 1 (an index into hosts)
//   p->dim("TP")->crossing_groups;  // 0: every TP group inside one host
//   p->ToJson();                    // what `vemesh plan --check FILE` reads
//   Placement::FromJson(text, "placement.json");  // and back
//
// A latency-sensitive dimension (TP by default; MeshOptions::
// latency_sensitive_dims, by role) whose groups cross hosts although a block
// placement with that dimension innermost would keep them inside gets one
// warning, logged by global rank 0 through vemesh/base/log.h at creation.
//
// Crossing groups are counted by host_locality.h's ScanDimLocality, the
// count `vemesh plan` makes for a planned placement.
//
// JSON (keys in this order; docs/MULTIHOST.md). ToJson writes it, FromJson
// reads it back (both in placement_json.cc); FromJson refuses malformed text
// with InvalidArgument naming the field, and bounds every size before
// allocating for it:
//   {"vemesh_placement": 1, "world_size": 8,
//    "mesh": {"dim_names": ["PP", "DP", "TP"], "shape": [2, 2, 2]},
//    "hosts": ["node0", "node1"], "rank_hosts": [0, 0, 0, 0, 1, 1, 1, 1],
//    "dims": [{"name": "PP", "group_count": 4, "group_size": 2,
//              "crossing_groups": 4}, ...]}

#ifndef VEMESH_PLACEMENT_PLACEMENT_H_
#define VEMESH_PLACEMENT_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "vemesh/layout/mesh_layout.h"

namespace vemesh {

struct DimPlacement {
  std::string name;
  int64_t group_count = 0;
  int64_t group_size = 0;
  int64_t crossing_groups = 0;  // groups whose ranks sit on more than one host
};

// The largest placement JSON that FromJson reads, and the largest world: a
// world of 2^22 ranks writes about 10 MB of rank_hosts.
inline constexpr int64_t kMaxPlacementJsonBytes = int64_t{64} << 20;
inline constexpr int64_t kMaxPlacementJsonRanks = int64_t{1} << 22;

struct Placement {
  int64_t world_size = 0;
  std::vector<std::string> dim_names;
  std::vector<int64_t> shape;
  // Host names, in the order of their lowest global rank.
  std::vector<std::string> hosts;
  // rank_hosts[r]: index into `hosts` of global rank r, for every rank of
  // the world (inside the mesh or not).
  std::vector<int32_t> rank_hosts;
  std::vector<DimPlacement> dims;  // one per mesh dimension, in mesh order

  int32_t host_of(int64_t rank) const { return rank_hosts[rank]; }
  // The dimension named `name` exactly; null when the mesh has none.
  const DimPlacement* dim(absl::string_view name) const;
  std::string ToJson() const;
  // The JSON that ToJson writes (hand-edited files included: hosts need not
  // be numbered by their lowest rank). `source` names the text in messages
  // ("placement file 'job.json': field 'dims[1].name': expected ...").
  static absl::StatusOr<Placement> FromJson(absl::string_view text,
                                            absl::string_view source);
};

// The placement of `layout` over a world whose rank r runs on host
// `world_hosts[r]`. InvalidArgument when the layout holds a rank outside
// the world. O(world + size x ndim).
absl::StatusOr<Placement> ComputePlacement(
    const MeshLayout& layout, absl::Span<const std::string> world_hosts);

// The warnings for the dimensions that `roles` name (matched ignoring case,
// as the registry's roles are; roles the mesh lacks are skipped): one per
// such dimension whose groups cross hosts although every host's share of
// the mesh is a multiple of the dimension's size, so that a block placement
// with the dimension innermost would keep every group inside one host.
std::vector<std::string> PlacementWarnings(const Placement& placement,
                                           const MeshLayout& layout,
                                           absl::Span<const std::string> roles);

}  // namespace vemesh

#endif  // VEMESH_PLACEMENT_PLACEMENT_H_
