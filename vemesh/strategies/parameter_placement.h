// vemesh/strategies/parameter_placement.h
//
// Where one rank's parameter sits in the SERIAL model: the serial tensor's
// name and global shape, and the box (vemesh/checkpoint/box.h) that the
// rank's local Matrix covers. A checkpoint stores tensors under these names
// and shapes, so one saved under one parallelism loads under any other
// (TrainingState, vemesh/strategies/state_dict.h, builds on this).
//
//   // A replicated (DataParallel) or expert parameter: the whole tensor.
//   ParameterPlacement b = WholePlacement("head.bias", 1, 10);
//   // The two Megatron layer kinds, TP rank 1 of 4, a 64 -> 128 layer:
//   absl::StatusOr<std::vector<ParameterPlacement>> col =
//       ColumnParallelPlacements("layer0", 64, 128, 1, 4);
//   // (*col)[0]: layer0.weight [64, 128] box [0:64, 32:64] (a column block)
//   // (*col)[1]: layer0.bias   [1, 128]  box [0:1, 32:64]
//   absl::StatusOr<std::vector<ParameterPlacement>> row =
//       RowParallelPlacements("layer1", 128, 64, 1, 4);
//   // (*row)[0]: layer1.weight [128, 64] box [32:64, 0:64] (a row block)
//   // (*row)[1]: layer1.bias   [1, 64]   box [0:1, 0:64] (on every rank)
//   // A flat shard (FSDP, ZeRO) of the concatenated local tensors: values
//   // [2000, 2064) of `col` (2048 of the weight block, then 32 of the
//   // bias), cut into boxes of each tensor:
//   absl::StatusOr<std::vector<FlatRunPiece>> pieces =
//       FlatRunPieces(*col, 2000, 64);
//   // layer0.weight [62:63, 48:64] and [63:64, 32:64], layer0.bias
//   // [0:1, 32:48], at offsets 0, 16 and 48 of the run.
//
// The TP helpers follow ColumnParallelLinear and RowParallelLinear: equal
// blocks in TP-rank order; a column layer splits the output features (the
// weight's columns and the bias), a row layer the input features (the
// weight's rows; the bias stays whole). Overloads read the same from a
// layer object (its TensorParallelShard) for callers that hold one.

#ifndef VEMESH_STRATEGIES_PARAMETER_PLACEMENT_H_
#define VEMESH_STRATEGIES_PARAMETER_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "vemesh/checkpoint/box.h"
#include "vemesh/strategies/column_parallel_linear.h"
#include "vemesh/strategies/row_parallel_linear.h"

namespace vemesh::strategies {

struct ParameterPlacement {
  std::string name;                   // the serial model's, "layer0.weight"
  std::vector<int64_t> global_shape;  // the serial tensor's
  checkpoint::Box box;                // the local tensor, in global terms

  // Elements of the local tensor.
  int64_t numel() const { return checkpoint::BoxNumel(box); }
};

// OK when the name is non-empty and the box lies in the global shape;
// InvalidArgument naming the tensor, its box and shape otherwise.
absl::Status CheckPlacement(const ParameterPlacement& placement);

// The whole [rows, cols] tensor (replicated, or held by one rank).
ParameterPlacement WholePlacement(std::string name, int64_t rows, int64_t cols);

// `prefix`.weight ([in, out]) and `prefix`.bias ([1, out]) as TP rank
// `tp_rank` of `tp_size` holds them. The split dimension must divide by
// tp_size (InvalidArgument naming it otherwise).
absl::StatusOr<std::vector<ParameterPlacement>> ColumnParallelPlacements(
    const std::string& prefix, int64_t in, int64_t out, int tp_rank,
    int tp_size);
absl::StatusOr<std::vector<ParameterPlacement>> RowParallelPlacements(
    const std::string& prefix, int64_t in, int64_t out, int tp_rank,
    int tp_size);
// The same from a layer: its shard gives the block, its weight the other
// dimension (so before FSDP frees the values).
absl::StatusOr<std::vector<ParameterPlacement>> ColumnParallelPlacements(
    const std::string& prefix, ColumnParallelLinear& layer);
absl::StatusOr<std::vector<ParameterPlacement>> RowParallelPlacements(
    const std::string& prefix, RowParallelLinear& layer);

// One piece of a flat run: `box` of tensor placements[placement] (global
// coordinates), whose values start `offset` values into the run.
struct FlatRunPiece {
  size_t placement = 0;
  checkpoint::Box box;
  int64_t offset = 0;
};

// The run [begin, begin + count) of the concatenation of the placements'
// local tensors (each row-major, in order) as boxes of each tensor
// (checkpoint::FlatRangeToBoxes, shifted to global offsets), in run order,
// empty boxes left out. InvalidArgument when begin or count is negative or
// the run ends past the tensors' values (naming both).
absl::StatusOr<std::vector<FlatRunPiece>> FlatRunPieces(
    absl::Span<const ParameterPlacement> placements, int64_t begin,
    int64_t count);

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_PARAMETER_PLACEMENT_H_
