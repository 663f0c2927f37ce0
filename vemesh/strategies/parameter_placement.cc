#include "vemesh/strategies/parameter_placement.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vemesh::strategies {
namespace {

using checkpoint::Box;

absl::Status CheckSplit(const std::string& prefix, const char* what,
                        int64_t features, int tp_rank, int tp_size) {
  if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", prefix, "': TP rank ", tp_rank, " of ", tp_size,
                     ": expected 0 <= rank < size"));
  }
  if (features < 0 || features % tp_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", prefix, "': ", features, " ", what,
                     " do not divide into TP=", tp_size, " equal blocks"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckPlacement(const ParameterPlacement& placement) {
  if (placement.name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a parameter placement without a name (box ",
                     checkpoint::BoxToString(placement.box), ")"));
  }
  if (absl::Status s =
          checkpoint::CheckBox(placement.box, placement.global_shape);
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter '", placement.name, "': box ",
        checkpoint::BoxToString(placement.box), " is not inside its global ",
        "shape [", absl::StrJoin(placement.global_shape, ", "), "]"));
  }
  return absl::OkStatus();
}

ParameterPlacement WholePlacement(std::string name, int64_t rows,
                                  int64_t cols) {
  return {std::move(name), {rows, cols}, Box{{0, 0}, {rows, cols}}};
}

absl::StatusOr<std::vector<ParameterPlacement>> ColumnParallelPlacements(
    const std::string& prefix, int64_t in, int64_t out, int tp_rank,
    int tp_size) {
  if (absl::Status s =
          CheckSplit(prefix, "output features", out, tp_rank, tp_size);
      !s.ok()) {
    return s;
  }
  const int64_t n = out / tp_size;
  return std::vector<ParameterPlacement>{
      {prefix + ".weight", {in, out}, Box{{0, tp_rank * n}, {in, n}}},
      {prefix + ".bias", {1, out}, Box{{0, tp_rank * n}, {1, n}}}};
}

absl::StatusOr<std::vector<ParameterPlacement>> RowParallelPlacements(
    const std::string& prefix, int64_t in, int64_t out, int tp_rank,
    int tp_size) {
  if (absl::Status s =
          CheckSplit(prefix, "input features", in, tp_rank, tp_size);
      !s.ok()) {
    return s;
  }
  const int64_t n = in / tp_size;
  return std::vector<ParameterPlacement>{
      {prefix + ".weight", {in, out}, Box{{tp_rank * n, 0}, {n, out}}},
      {prefix + ".bias", {1, out}, Box{{0, 0}, {1, out}}}};
}

absl::StatusOr<std::vector<ParameterPlacement>> ColumnParallelPlacements(
    const std::string& prefix, ColumnParallelLinear& layer) {
  const TensorParallelShard& shard = layer.shard();
  return ColumnParallelPlacements(prefix, layer.weight().value.rows(),
                                  shard.total(), shard.tp_rank(),
                                  shard.tp_size());
}

absl::StatusOr<std::vector<ParameterPlacement>> RowParallelPlacements(
    const std::string& prefix, RowParallelLinear& layer) {
  const TensorParallelShard& shard = layer.shard();
  return RowParallelPlacements(prefix, shard.total(),
                               layer.weight().value.cols(), shard.tp_rank(),
                               shard.tp_size());
}

absl::StatusOr<std::vector<FlatRunPiece>> FlatRunPieces(
    absl::Span<const ParameterPlacement> placements, int64_t begin,
    int64_t count) {
  int64_t total = 0;
  for (const ParameterPlacement& p : placements) total += p.numel();
  if (begin < 0 || count < 0 || begin + count > total) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a flat run [", begin, ", ", begin + count, ") of ", placements.size(),
        " parameters (",
        absl::StrJoin(placements, ", ",
                      [](std::string* out, const ParameterPlacement& p) {
                        absl::StrAppend(out, p.name);
                      }),
        "): expected it inside their ", total, " values"));
  }
  std::vector<FlatRunPiece> out;
  const int64_t end = begin + count;
  int64_t at = 0;  // the current tensor's first flat index
  for (size_t i = 0; i < placements.size(); ++i) {
    const ParameterPlacement& p = placements[i];
    const int64_t lo = std::max(begin, at);
    const int64_t hi = std::min(end, at + p.numel());
    if (lo < hi) {
      const std::vector<int64_t>& local = p.box.lengths;
      for (const Box& b :
           checkpoint::FlatRangeToBoxes(local, lo - at, hi - at)) {
        if (checkpoint::BoxNumel(b) == 0) continue;
        // The box's first value, row-major in the local tensor.
        int64_t first = 0;
        for (size_t d = 0; d < local.size(); ++d) {
          first = first * local[d] + b.offsets[d];
        }
        Box global = b;
        for (size_t d = 0; d < local.size(); ++d) {
          global.offsets[d] += p.box.offsets[d];
        }
        out.push_back({i, std::move(global), at + first - begin});
      }
    }
    at += p.numel();
  }
  return out;
}

}  // namespace vemesh::strategies
