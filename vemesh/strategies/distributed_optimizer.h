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
// Shard and replicate groups (HSDP-style ZeRO, named as FSDP names them).
// With `shard_group` in the options the state is sharded over that group
// instead of the registry's DP group (P is its size; the same rules: it
// must keep its size and this rank its rank). With `replicate_group` too,
// every rank of the shard group trains as one replica among the replicate
// group's: the gradients reduce_scatter (ZeRO-1: all_reduce) over the shard
// group, the shard all_reduces over the replicate group, and the average is
// over P x R ranks, R the replicate group's size at that step. Replicas hold
// the same shard and state, so the updated shards gather over the shard
// group only. The replicate group may be a ReconfigurableCommunicator
// (vemesh/comm/reconfigurable_communicator.h) whose size changes between
// steps, as an elastic mesh's is: the optimizer is created once, and
// Create does not agree over such a group (a replica that joins creates its
// optimizer while the others train). A failed replicate group stops only
// itself, as FSDP's: the shard group's collectives still run (its ranks stay
// matched, an elastic step's rule), nothing is stepped on this rank, and
// Step returns the replicate group's error (undo the step and redo it after
// the recovery; other ranks of the shard group may have stepped). A
// `replicate_group` without a `shard_group` is InvalidArgument at once, on
// the rank that passed it (every rank passes the same options), as a group
// on nccl is FailedPrecondition (the buffers are host memory).
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
#include "vemesh/comm/communicator.h"
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
  // HSDP-style ZeRO (see "Shard and replicate groups" above). Both null:
  // the registry's DP group. `shard_group` alone: ZeRO over it. Both: the
  // state sharded over `shard_group`, the gradients also averaged over
  // `replicate_group`, whose size may change between steps.
  std::shared_ptr<Communicator> shard_group = nullptr;
  std::shared_ptr<Communicator> replicate_group = nullptr;
};

struct ZeroStepStats {
  int dp_size = 1;        // shards x replicas this step
  size_t elements = 0;    // N
  size_t shard_size = 0;  // S
  // 2 when there are several shards (reduce and gather), plus 1 when there
  // are several replicas (the shard's all_reduce over them); 0 for neither.
  int collectives = 0;
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

  // The shards (P, fixed at Create) and this rank's shard. Without
  // shard_group they are the DP size and rank.
  int num_shards() const { return num_shards_; }
  int shard_rank() const { return shard_rank_; }
  // The replicate group as it is now (1 and 0 without one).
  int replicate_size() const;
  int replicate_rank() const;
  // Every rank that trains on its own data: num_shards x replicate_size,
  // and this rank's index among them (the data slice to train on). Without
  // groups in the options: the DP size and rank.
  int dp_size() const { return num_shards_ * replicate_size(); }
  int dp_rank() const { return replicate_rank() * num_shards_ + shard_rank_; }
  size_t elements() const { return elements_; }
  size_t shard_size() const { return shard_; }
  int64_t step_count() const { return shard_optimizer_->step_count(); }
  // The optimizer of this rank's values [shard_rank * shard_size,
  // + shard_size) of the concatenated parameters (its state, for
  // checkpoints; the same on every replica of the shard).
  FlatOptimizer& shard_optimizer() { return *shard_optimizer_; }
  const DistributedOptimizerOptions& options() const { return options_; }

 private:
  DistributedOptimizer() = default;

  // Empty if every parameter has the shape it had at Create.
  std::string LocalShapeError() const;
  // This rank's shard of the gradient averaged over the shard group's P
  // ranks and `replicas` ranks of the replicate group into `shard` (S
  // values); `*bad_ranks`: how many ranks flagged bad input (then nothing
  // else is written). ZeRO-1 also writes the average into every
  // Parameter::grad.
  // `*replicate_failed`: the replicate group's error (the shard group's
  // collectives still ran; nothing is written then).
  absl::Status ReduceGradients(const RoleGroup& dp, int replicas, bool bad,
                               std::vector<double>& shard, double* bad_ranks,
                               absl::Status* replicate_failed);
  // Copies values [begin, begin + count) of the concatenated `field` of the
  // parameters to `out` / from `in`.
  void Gather(Matrix Parameter::*field, size_t begin, size_t count,
              double* out) const;
  void Scatter(Matrix Parameter::*field, size_t begin, size_t count,
               const double* in);

  DistributedOptimizerOptions options_;
  std::vector<Parameter*> params_;
  std::vector<std::pair<int64_t, int64_t>> shapes_;  // at Create
  int num_shards_ = 1;                               // at Create
  int shard_rank_ = 0;                               // at Create
  size_t elements_ = 0;
  size_t shard_ = 0;
  std::unique_ptr<FlatOptimizer> shard_optimizer_;
  std::vector<size_t> offsets_;     // of each parameter in the N values
  std::vector<double> grad_shard_;  // ZeRO-2: S values, kept across steps
};

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_DISTRIBUTED_OPTIMIZER_H_
