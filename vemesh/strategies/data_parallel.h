// vemesh/strategies/data_parallel.h
//
// Data parallelism: every rank of a data-parallel (DP) group holds the same
// parameters and trains on its own slice of the batch; the gradients are
// averaged over the group before the optimiser step.
//
//   std::vector<Parameter*> params = model.parameters();
//   DataParallel dp({.bucket_elements = 4096});
//   absl::Status s = dp.BroadcastParameters(params);   // once, at start
//   ... forward, backward on this rank's slice of the batch ...
//   absl::StatusOr<BucketStats> st = dp.AverageGradients(params);
//   for (Parameter* p : params) p->SgdStep(lr);
//
// BroadcastParameters copies DP rank `root`'s values (0 unless given) to the
// whole DP group, so replicas that were initialised differently start
// identical (and an elastic newcomer gets the state of a replica that has it).
// AverageGradients packs the gradients, in `params` order, into buckets of
// at most `bucket_elements` doubles (a parameter may straddle two buckets)
// and does one all_reduce per bucket, then divides by the DP size: fewer,
// larger messages than one per parameter, with a bounded staging buffer.
// The broadcast is bucketed the same way (one broadcast per bucket).
//
// Both are collective over the DP group, which they ask VESCALE_DEVICE_MESH
// for on every call: after a re-init they use the new group. A mesh without
// DP (or DP=1) makes both a no-op. Every DP rank must pass parameters of the
// same shapes in the same order.

#ifndef VEMESH_STRATEGIES_DATA_PARALLEL_H_
#define VEMESH_STRATEGIES_DATA_PARALLEL_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "vemesh/strategies/parameter.h"

namespace vemesh::strategies {

struct DataParallelOptions {
  // Most doubles one collective carries (>= 1).
  size_t bucket_elements = size_t{1} << 16;
};

// What one bucketed operation did (for logs and tests).
struct BucketStats {
  int dp_size = 1;
  size_t elements = 0;
  // Collective calls made: ceil(elements / bucket_elements) when dp_size > 1,
  // 0 otherwise.
  int collectives = 0;
};

class DataParallel {
 public:
  explicit DataParallel(DataParallelOptions options = {});

  absl::StatusOr<BucketStats> BroadcastParameters(
      absl::Span<Parameter* const> params, int root = 0) const;
  absl::StatusOr<BucketStats> AverageGradients(
      absl::Span<Parameter* const> params) const;

  const DataParallelOptions& options() const { return options_; }

 private:
  DataParallelOptions options_;
};

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_DATA_PARALLEL_H_
