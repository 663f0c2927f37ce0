// vemesh/placement/host_locality.h
//
// Which groups of a mesh dimension stay inside one host: the count that both
// `vemesh plan` (under a HostMap: block, cyclic or a hostfile's slots) and a
// live mesh's get_placement() (placement.h: every rank's host as reported)
// make.
//
//   HostMap hosts = HostMap::Block(/*ranks_per_host=*/4, /*world_size=*/8);
//   hosts.host_of(5);                 // 1
//   DimLocality tp = AnalyzeDimLocality(layout, layout.dim_index("TP").value(),
//                                       hosts);
//   tp.locality;                      // Locality::kIntraHost
//   tp.crossing_groups;               // 0
//
// Cost. For a default (row-major arange) layout the count is arithmetic:
// O(ndim + min(outer groups, ranks_per_host)), so a world of 2^62 ranks takes
// microseconds. Cyclic placement is O(ndim); a hostfile's slots O(ndim +
// hosts). Other layouts (a rank table, a slice or flattened mesh that is not
// an arange), and hosts known rank by rank (ScanDimLocality), are scanned:
// O(size) per dimension.

#ifndef VEMESH_PLACEMENT_HOST_LOCALITY_H_
#define VEMESH_PLACEMENT_HOST_LOCALITY_H_

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/placement/host_map.h"

namespace vemesh {

enum class Locality {
  kIntraHost,  // every group lies inside one host
  kMixed,      // some groups cross a host boundary, some do not
  kCrossHost,  // every group spans more than one host
};
// "intra-host", "mixed", "cross-host": the spelling of the JSON schema.
absl::string_view LocalityName(Locality locality);

struct DimLocality {
  int64_t group_count = 0;
  int64_t group_size = 0;
  int64_t crossing_groups = 0;  // groups that touch more than one host
  Locality locality = Locality::kIntraHost;
};

// True when `layout` is the default row-major arange of its shape, the case
// that the arithmetic below (and member strides) rely on. O(ndim): never
// walks a dimension, whatever its size.
bool IsDefaultLayout(const MeshLayout& layout);

// Row-major strides of the layout's shape: the rank distance between two
// neighbours along each dimension of a default layout.
std::vector<int64_t> RowMajorStrides(const MeshLayout& layout);

// Host locality of the groups along dimension `dim` (an index into the
// layout's dimensions, assumed valid).
DimLocality AnalyzeDimLocality(const MeshLayout& layout, int64_t dim,
                               const HostMap& hosts);

// The same count by visiting every group: the reference the fast path is
// tested against, and the path for layouts with a rank table.
DimLocality AnalyzeDimLocalityByScan(const MeshLayout& layout, int64_t dim,
                                     const HostMap& hosts);

// The count from each member's host, whatever the placement: `ranks` is
// layout.ranks() (passed in so that a caller scanning every dimension lists
// them once) and `host_of` maps a rank of it to its host. One pass: O(size).
DimLocality ScanDimLocality(const MeshLayout& layout,
                            absl::Span<const int64_t> ranks, int64_t dim,
                            absl::FunctionRef<int64_t(int64_t)> host_of);

}  // namespace vemesh

#endif  // VEMESH_PLACEMENT_HOST_LOCALITY_H_
