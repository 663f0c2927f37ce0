// vemesh/strategies/data_parallel.h
//
// Data parallelism: every rank of a data-parallel (DP) group holds the same
// parameters and trains on its own slice of the batch; the gradients are
// averaged over the group before the optimiser step.
//
//   std::vector<Parameter*> params = model.parameters();
//   DataParallel dp({.bucket_elements = 4096});
//   absl::Status s = dp.BroadcastParameters(params).status();  // at start
//   ... forward, backward on this rank's slice of the batch ...
//   absl::StatusOr<BucketStats> st = dp.AverageGradients(params);
//   for (Parameter* p : params) p->SgdStep(lr);
//
// Overlapping the reduction with the backward pass (PyTorch DDP's reducer):
// the model announces each parameter whose gradient is final, and a bucket's
// all_reduce starts as soon as all of its parameters are announced, while
// the backward of earlier layers still runs.
//
//   s = dp.PrepareGradientSync(params);       // before the backward pass
//   ... backward of the last layer ...
//   s = dp.MarkGradientReady(&last.weight);   // its bucket may start now
//   ... backward of the earlier layers, marking theirs ...
//   absl::StatusOr<BucketStats> st = dp.FinishGradientSync();  // waits all
//
// BroadcastParameters copies DP rank `root`'s values (0 unless given) to the
// whole DP group, so replicas that were initialised differently start
// identical (and an elastic newcomer gets the state of a replica that has it).
// Gradients are packed into buckets of at most `bucket_elements` values (a
// parameter may straddle two buckets), one all_reduce (sum) per bucket, then
// divided by the DP size: fewer, larger messages than one per parameter.
// Buckets are filled in *reverse* `params` order, the order a backward pass
// finishes them (the model lists its parameters first layer first), and are
// started strictly in bucket order on every rank, so the DP group's
// collectives pair up even if ranks announce in different orders. The
// broadcast uses buckets of the same size, in `params` order (one broadcast
// per bucket).
//
// `gradient_type = kBFloat16` communicates the gradients in bfloat16 (half
// the bytes) while the parameters and the optimiser stay in double, the
// "master weights": each bucket is rounded to bf16, summed in bf16 (the CPU
// backends add in fp32 and round once per combining step), and widened back
// before the division. The averaged gradient is then within
// gamma_P * mean(|g|) of the exact one for P ranks, gamma_P = P u / (1 - P u)
// with u = 2^-8 (bf16's unit roundoff); see tests/strategies.
//
// Both are collective over the DP group, which they ask VESCALE_DEVICE_MESH
// for on every call (PrepareGradientSync for a synchronisation): after a
// re-init they use the new group. A mesh without DP (or DP=1) makes both a
// no-op (no rounding to bf16 either). Every DP rank must pass parameters of
// the same shapes in the same order.

#ifndef VEMESH_STRATEGIES_DATA_PARALLEL_H_
#define VEMESH_STRATEGIES_DATA_PARALLEL_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/strategies/parameter.h"

namespace vemesh::strategies {

// The element type gradients travel in.
enum class GradientType {
  kFloat64,   // as stored: exact up to summation order
  kBFloat16,  // half the bytes of fp32, a quarter of double; rounded
};

struct DataParallelOptions {
  // Most values one collective carries (>= 1).
  size_t bucket_elements = size_t{1} << 16;
  // Start each bucket's all_reduce as its gradients become ready
  // (MarkGradientReady). Off: FinishGradientSync reduces every bucket
  // then, one blocking all_reduce after the other (the baseline).
  bool overlap = true;
  GradientType gradient_type = GradientType::kFloat64;
};

// What one bucketed operation did (for logs and tests).
struct BucketStats {
  int dp_size = 1;
  size_t elements = 0;
  // Collective calls made: ceil(elements / bucket_elements) when dp_size > 1,
  // 0 otherwise.
  int collectives = 0;
  // Of those, how many were started before FinishGradientSync (during the
  // backward pass).
  int started_early = 0;
};

class DataParallel {
 public:
  explicit DataParallel(DataParallelOptions options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  absl::StatusOr<BucketStats> BroadcastParameters(
      absl::Span<Parameter* const> params, int root = 0) const;

  // All three steps below at once, after the backward pass.
  absl::StatusOr<BucketStats> AverageGradients(
      absl::Span<Parameter* const> params);

  // -- Overlap with the backward pass ----------------------------------------
  // Starts a synchronisation of `params`' gradients: reads the DP group and
  // lays out the buckets. FailedPrecondition if one is already open.
  absl::Status PrepareGradientSync(absl::Span<Parameter* const> params);
  // `param`'s gradient is final for this step. Starts (with overlap) every
  // bucket, in order, whose parameters are all ready. InvalidArgument for a
  // parameter that was not prepared or is marked twice.
  absl::Status MarkGradientReady(const Parameter* param);
  // Marks what is left ready, waits for every bucket and writes the averaged
  // gradients back. Closes the synchronisation, also on error.
  absl::StatusOr<BucketStats> FinishGradientSync();
  bool sync_open() const { return sync_ != nullptr; }

  const DataParallelOptions& options() const { return options_; }

 private:
  struct Sync;
  absl::Status StartReadyBuckets(Sync& sync);

  DataParallelOptions options_;
  std::unique_ptr<Sync> sync_;
  // Synchronisations that failed with reductions in flight: their buffers
  // stay allocated (work.h: a backend may hold them after an abort).
  std::vector<std::unique_ptr<Sync>> abandoned_;
};

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_DATA_PARALLEL_H_
