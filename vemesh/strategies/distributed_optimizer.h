// vemesh/strategies/distributed_optimizer.h
//
// veScale's DistributedOptimizer (ZeRO stages 1 and 2) for parameters that
// every rank of the data-parallel (DP) group replicates: the optimizer
// state is split across the group, each rank steps only its shard of the
// values, and the updated shards are gathered back to every rank.
//
//   std::vector<Parameter*> params = model.parameters();
//   absl::StatusOr<std::unique_ptr<DistributedOptimizer>> zero =
//       DistributedOptimizer::Create(
//           {.optimizer = OptimizerOptions::AdamW(1e-3),
//            .stage = ZeroStage::kTwo},
//           params);                         // collective over DP
//   ... forward, backward on this rank's slice of the batch ...
//   absl::StatusOr<ZeroStepStats> st = (*zero)->Step();   // collective
//   (*zero)->ZeroGrad();                     // before the next backward
//   TrainingStateBytes m = (*zero)->memory();
//
// The parameters, concatenated in `params` order into N values, are cut into
// P = DP-size shards of S = ceil(N / P) values (the last ones padded with
// zeros, which the update rules leave at zero; N < P leaves whole shards of
// padding). DP rank r owns values [r S, (r + 1) S). Step, after the backward:
//
//   ZeRO-2 (kTwo): the gradients reduce_scatter (sum) over DP, so that rank r
//     receives only its shard, divided by P; each Parameter::grad is then
//     released (resized to 0 x 0: Parameter::ZeroGrad, or ZeroGrad() here,
//     makes it whole again before the next backward). Kept per rank across
//     steps: 8N parameter bytes + 8S gradient bytes + the shard's state.
//   ZeRO-1 (kOne): the gradients all_reduce (sum) over DP and every
//     Parameter::grad holds the average afterwards, as under DataParallel
//     (e.g. for gradient-norm clipping); only the optimizer state is
//     sharded. Kept: 8N + 8N + the shard's state.
//   Both: rank r steps values [r S, (r + 1) S) with its gradient shard and
//     its FlatOptimizer (state for S values: AdamW 16S bytes instead of DDP's
//     16N), then the shards all_gather (S values from each) so every rank
//     holds the updated parameters.
//
// Bytes sent per rank per step, with ring algorithms: ZeRO-2 is DDP's
// 2N(P-1)/P (a reduce_scatter plus an all_gather is an all_reduce cut in
// two); ZeRO-1 sends 3N(P-1)/P (all_reduce plus all_gather). The full local
// gradient still exists during the backward pass (the model writes
// Parameter::grad): memory() counts what is kept between steps.
//
// `gradient_type = kBFloat16` sends the gradients in bfloat16, as
// DataParallel does (vemesh/strategies/data_parallel.h: the same error
// bound, gamma_P * mean|g|); values and state stay in double.
//
// Agreement, never a hang: Create exchanges (over DP) each rank's verdict on
// its own input (options, null or repeated parameters) and the number, total
// size and shapes of its parameters; any difference is InvalidArgument on
// every rank, naming it, before anything is sharded. Step carries one flag
// per rank inside its first collective: a rank whose parameters changed
// shape since Create (or that forgot ZeroGrad after a ZeRO-2 step) sends
// zeros and its flag, and every rank answers InvalidArgument with nothing
// stepped.
//
// The DP group is asked of VESCALE_DEVICE_MESH on every call, as
// DataParallel does (a re-init is followed). The shards belong to the DP
// size and rank seen at Create: a re-init that changes them is
// FailedPrecondition (create a new optimizer). A mesh without DP (or DP=1)
// is a plain optimizer over one shard of everything.
//
// Parameters must be equal on every DP rank at Create (broadcast them first,
// DataParallel::BroadcastParameters); every step leaves them equal.

#ifndef VEMESH_STRATEGIES_DISTRIBUTED_OPTIMIZER_H_
#define VEMESH_STRATEGIES_DISTRIBUTED_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "vemesh/strategies/data_parallel.h"
#include "vemesh/strategies/optimizer.h"
#include "vemesh/strategies/parameter.h"
#include "vemesh/strategies/role_group.h"

namespace vemesh::strategies {

enum class ZeroStage {
  kOne = 1,  // shard the optimizer state
  kTwo = 2,  // shard the optimizer state and the gradients
};

// "1" or "2", anything else InvalidArgument naming it.
absl::StatusOr<ZeroStage> ParseZeroStage(absl::string_view text);

struct DistributedOptimizerOptions {
  OptimizerOptions optimizer;
  ZeroStage stage = ZeroStage::kTwo;
  GradientType gradient_type = GradientType::kFloat64;
};

struct ZeroStepStats {
  int dp_size = 1;
  size_t elements = 0;    // N
  size_t shard_size = 0;  // S
  int collectives = 0;    // 2 when dp_size > 1, else 0
};

class DistributedOptimizer {
 public:
  // Collective over DP (see "Agreement" above).
  static absl::StatusOr<std::unique_ptr<DistributedOptimizer>> Create(
      const DistributedOptimizerOptions& options,
      std::vector<Parameter*> params);

  // Averages the gradients, steps this rank's shard and gathers the
  // parameters. Collective over DP.
  absl::StatusOr<ZeroStepStats> Step();
  // Every parameter's gradient back to zeros of its value's shape.
  void ZeroGrad();

  // What this rank keeps across steps (see above), and what replicated
  // training with the same optimizer keeps (DataParallel: 8N + 8N + state
  // of N).
  TrainingStateBytes memory() const;
  TrainingStateBytes replicated_memory() const;

  int dp_size() const { return dp_size_; }
  int dp_rank() const { return dp_rank_; }
  size_t elements() const { return elements_; }
  size_t shard_size() const { return shard_; }
  int64_t step_count() const { return shard_optimizer_->step_count(); }
  // The optimizer of this rank's values [dp_rank * shard_size, + shard_size)
  // of the concatenated parameters (its state, for checkpoints).
  FlatOptimizer& shard_optimizer() { return *shard_optimizer_; }
  const DistributedOptimizerOptions& options() const { return options_; }

 private:
  DistributedOptimizer() = default;

  // Empty if every parameter has the shape it had at Create.
  std::string LocalShapeError() const;
  // This rank's shard of the averaged gradient into `shard` (S values);
  // `*bad_ranks`: how many DP ranks flagged bad input (then nothing else is
  // written). ZeRO-1 also writes the average into every Parameter::grad.
  absl::Status ReduceGradients(const RoleGroup& dp, bool bad,
                               std::vector<double>& shard, double* bad_ranks);
  // Copies values [begin, begin + count) of the concatenated `field` of the
  // parameters to `out` / from `in`.
  void Gather(Matrix Parameter::*field, size_t begin, size_t count,
              double* out) const;
  void Scatter(Matrix Parameter::*field, size_t begin, size_t count,
               const double* in);

  DistributedOptimizerOptions options_;
  std::vector<Parameter*> params_;
  std::vector<std::pair<int64_t, int64_t>> shapes_;  // at Create
  int dp_size_ = 1;
  int dp_rank_ = 0;
  size_t elements_ = 0;
  size_t shard_ = 0;
  std::unique_ptr<FlatOptimizer> shard_optimizer_;
  std::vector<size_t> offsets_;     // of each parameter in the N values
  std::vector<double> grad_shard_;  // ZeRO-2: S values, kept across steps
};

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_DISTRIBUTED_OPTIMIZER_H_
