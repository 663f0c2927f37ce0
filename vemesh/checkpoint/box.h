// vemesh/checkpoint/box.h
//
// A Box is the part of a tensor one rank holds: per dimension an offset and
// a length, in the tensor's global (row-major) coordinates. A checkpoint
// stores boxes, so any decomposition (row or column shards, replicas, flat
// FSDP/ZeRO ranges) saves and loads onto any other.
//
//   Box rows{{4, 0}, {4, 16}};           // rows 4..7 of a [16, 16] tensor
//   BoxNumel(rows);                      // 64
//   // Elements [10, 40) of a flat [16, 16] tensor as boxes: the rest of
//   // row 0, rows 1..1, the head of row 2.
//   std::vector<Box> boxes = FlatRangeToBoxes({16, 16}, 10, 40);

#ifndef VEMESH_CHECKPOINT_BOX_H_
#define VEMESH_CHECKPOINT_BOX_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace vemesh::checkpoint {

// A box of a tensor in global coordinates (row-major); lengths may be 0 (an
// empty piece). A scalar (shape []) has one box with no dimensions.
struct Box {
  std::vector<int64_t> offsets;
  std::vector<int64_t> lengths;

  friend bool operator==(const Box&, const Box&) = default;
};

// Elements in the box (1 for a zero-dimensional box).
int64_t BoxNumel(const Box& box);
// "[4:8, 0:16]" (offset:end per dimension).
std::string BoxToString(const Box& box);
// OK when the box has the shape's rank, non-negative offsets and lengths,
// and lies inside `shape` (whose sizes are non-negative); else
// InvalidArgument naming the box and the shape.
absl::Status CheckBox(const Box& box, absl::Span<const int64_t> shape);
// The common part of two boxes of one tensor; nullopt when it is empty or
// the ranks differ.
std::optional<Box> Intersect(const Box& a, const Box& b);

// OK when `boxes` (each already inside `shape`, per CheckBox) tile the
// tensor exactly: every element in exactly one box. Empty boxes are
// ignored. Otherwise InvalidArgument naming two boxes that overlap, or the
// number of elements no box covers. Near-linear for the usual layouts (row,
// column and grid shards, flat ranges): a sweep along the dimension with the
// most distinct offsets compares only boxes that meet in it.
absl::Status CheckTiling(const std::vector<Box>& boxes,
                         absl::Span<const int64_t> shape);

// A flat range [begin, end) of a row-major tensor of `shape` as at most
// 2*ndim-1 boxes, in flat order, each a row-major contiguous run (FSDP and
// ZeRO flat shards map onto per-parameter boxes with this). The range is
// clamped to [0, numel); an empty range gives no boxes.
std::vector<Box> FlatRangeToBoxes(absl::Span<const int64_t> shape,
                                  int64_t begin, int64_t end);

}  // namespace vemesh::checkpoint

#endif  // VEMESH_CHECKPOINT_BOX_H_
