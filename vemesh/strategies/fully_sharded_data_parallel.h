// vemesh/strategies/fully_sharded_data_parallel.h
//
// Fully sharded data parallelism (PyTorch's FSDP, ZeRO-3): the parameters of
// each unit (a layer, or several) are flattened and split evenly, with
// padding, over a shard group; a rank keeps only its shard (the master copy,
// its gradient and, in the caller's optimizer, its state) and gathers the
// whole unit just before it computes.
//
//   // The seeds' HSDP: shard inside a host, replicate across hosts.
//   auto mesh = *init_device_mesh("cpu", {2, 4}, {"replicate", "shard"});
//   Linear fc1(...), fc2(...);
//   auto fsdp = *FullyShardedDataParallel::Create(
//       mesh, {{"fc1", fc1.parameters()}, {"fc2", fc2.parameters()}},
//       {.sharding_strategy = ShardingStrategy::kHybridShard});
//   // forward: unit by unit, in registration order
//   s = fsdp.PreForward(0);  h = fc1.Forward(x);  s = fsdp.PostForward(0);
//   s = fsdp.PreForward(1);  y = fc2.Forward(a);  s = fsdp.PostForward(1);
//   // backward: the reverse order
//   s = fsdp.PreBackward(1);
//   da = fc2.Backward(a, dy);
//   s = fsdp.PostBackward(1);
//   s = fsdp.PreBackward(0);
//   fc1.Backward(x, dh);
//   s = fsdp.PostBackward(0);
//   s = fsdp.FinishBackward();  // gradient shards averaged over DP
//   s = fsdp.SetOptimizer(OptimizerOptions::AdamW(1e-3));  // once
//   s = fsdp.OptimizerStep();   // or Step(fn): any rule on a shard
//   fsdp.ZeroGrad();
//
// The modes (PyTorch's ShardingStrategy):
//   kFullShard    gathered parameters are freed after each unit's forward and
//                 gathered again for its backward (least memory: 1/S of the
//                 state plus about one unit gathered).
//   kShardGradOp  gathered parameters stay from forward to backward (one
//                 all_gather per step instead of two; a whole model gathered
//                 at the peak).
//   kHybridShard  full sharding inside the shard group and replication over
//                 a replicate group: gradients reduce_scatter over the shard
//                 group, then the shard all_reduces over the replicate group.
//   kNoShard      DDP: nothing sharded, gradients all_reduced.
// Gradients are always averaged over the whole data-parallel group (shard
// size x replicate size ranks, the replicate size of that step), each of
// which trains on its own data.
//
// Groups. `shard_dims` names the mesh dimensions the shard group spans (one,
// or several flattened with DeviceMesh::flatten, e.g. {"DP_SHARD", "CP"}),
// `replicate_dims` those of the replicate group (kHybridShard and kNoShard).
// Left empty they default as PyTorch reads a device mesh: kFullShard and
// kShardGradOp shard over every dimension; kHybridShard replicates over the
// first dimension and shards over the others (the seeds' ("replicate",
// "shard")); kNoShard replicates over every dimension.
//
// Create is collective over the mesh: every rank checks its own arguments
// (dimensions the mesh lacks or names twice, options out of range, empty or
// null units), then all ranks agree on a fingerprint of the options and of
// every unit's name and shapes, one small all_reduce per mesh dimension,
// before any other collective. A rank whose arguments are wrong, or differ
// from another rank's, makes Create InvalidArgument on every rank (no hang).
// Not over a ReconfigurableCommunicator outside shard_dims (an elastic
// mesh's replicate dimension): a replica that joins a running job creates
// its module alone, while the others are in their recovery on that group;
// the elastic mesh compares the replicas (descriptor, state fingerprint).
// Parameters must start identical on all ranks of the data-parallel group
// (initialise them deterministically, or broadcast them first).
//
// Prefetch. `prefetch` = k > 0 starts the all_gathers of the next k units
// (forward: the following units; backward: the preceding ones) while the
// current one computes; 0 gathers each unit only when it is needed (the
// baseline). Results are the same either way (the same values, the same
// collectives in the same order on every rank). The hooks assume units run
// forward in registration order and backward in reverse, as the example;
// the backward order is checked: each reduction carries its unit's tag
// (one element per shard block, summed with the peers'), and a rank whose
// PostBackward calls leave that order makes FinishBackward InvalidArgument
// on every rank of the data-parallel group (the offending one naming its
// hook), with nothing added to the gradient shards (ZeroGrad, redo).
//
// Mixed precision. `mixed_precision = kBFloat16` sends parameters (all_gather)
// and gradients (reduce_scatter, all_reduce) as bfloat16 while the master
// shards, gradients shards and the optimizer stay in double. A gathered
// parameter is then within gamma_2 |p| of the master, and an averaged
// gradient within gamma_{S+R} * mean_r |g_r| of the exact one, for S shard
// and R replicate ranks (gamma_n = n u / (1 - n u), u = 2^-8): each value is
// rounded once to bf16 (after a double -> float step counted as one more
// rounding), then at most S - 1 partial sums over the shard group and R - 1
// over the replicate group are rounded (data_parallel.h for the argument).
//
// Memory. MemoryUsage() says what a rank holds: the padded parameter and
// gradient shards, the state of the optimizer SetOptimizer installed (one
// FlatOptimizer per unit over this rank's elements only: sharded) and the
// gathered units right now.
//
// Buffers are host memory: the MPI and Gloo backends ("cpu" meshes). A group
// on NCCL is FailedPrecondition at Create (a group of one needs no backend).
// The communicators are taken at Create and kept: a re-init of
// VESCALE_DEVICE_MESH does not move a module to new groups (its shards are
// laid out for the old ones). The replicate group, though, may be a
// ReconfigurableCommunicator (vemesh/comm/reconfigurable_communicator.h)
// whose group changes size between steps, as an elastic mesh's replicate
// group does when replicas leave or join: FinishBackward reads its size
// every time (the average is over shard size x the replicate size now), and
// replicate_size(), replicate_rank(), dp_size() and dp_rank() answer the
// current group, so the data slice follows too. Every replicate group of a
// replica must be reconfigured together, between steps (FinishBackward
// reads the size once per step). The shard group never changes size (the
// shards are laid out for it). One thread uses a module at a time.

#ifndef VEMESH_STRATEGIES_FULLY_SHARDED_DATA_PARALLEL_H_
#define VEMESH_STRATEGIES_FULLY_SHARDED_DATA_PARALLEL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/mesh/device_mesh.h"
#include "vemesh/strategies/optimizer.h"
#include "vemesh/strategies/parameter.h"

namespace vemesh::strategies {

// PyTorch's FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, NO_SHARD.
enum class ShardingStrategy {
  kFullShard,
  kShardGradOp,
  kHybridShard,
  kNoShard
};
absl::string_view ShardingStrategyName(ShardingStrategy s);
// "full_shard", "shard_grad_op", "hybrid_shard", "no_shard" (or the
// upper-case PyTorch spellings); InvalidArgument naming the text otherwise.
absl::StatusOr<ShardingStrategy> ParseShardingStrategy(absl::string_view text);

// The element type parameters and gradients travel in.
enum class MixedPrecision { kNone, kBFloat16 };

struct FsdpOptions {
  ShardingStrategy sharding_strategy = ShardingStrategy::kFullShard;
  // Mesh dimensions of the shard and replicate groups; empty: the defaults
  // above.
  std::vector<std::string> shard_dims = {};
  std::vector<std::string> replicate_dims = {};
  // All_gathers started ahead of the unit that needs them, in [0, 64].
  int prefetch = 1;
  MixedPrecision mixed_precision = MixedPrecision::kNone;
};

// One unit: its name and the model's parameters, gathered and freed together.
struct FsdpUnit {
  std::string name;
  std::vector<Parameter*> params;
};

// What a rank holds, in bytes.
struct FsdpMemory {
  size_t parameter_shards = 0;  // padded master shards
  size_t gradient_shards = 0;   // padded gradient shards
  size_t optimizer_state = 0;   // the installed optimizer's state_bytes
  size_t gathered = 0;          // parameters and gradients materialised now
  // The most a step materialises at once: the largest unit's parameters
  // and gradients (kFullShard), every unit's (kShardGradOp, kNoShard).
  size_t gathered_peak = 0;
  size_t state() const {
    return parameter_shards + gradient_shards + optimizer_state;
  }
};

// An optimizer step on one unit's local shard: `value` and `grad` are the
// elements of the unit's flat parameters this rank owns (padding excluded;
// empty on a rank that owns none), in the order of the unit's parameters,
// row-major. `unit` indexes the units, so the optimizer can keep per-unit
// (sharded) state.
using ShardStepFn = std::function<absl::Status(
    size_t unit, absl::Span<double> value, absl::Span<const double> grad)>;

class FullyShardedDataParallel {
 public:
  // Shards `units` over the groups `options` names on `mesh` (see above).
  // Takes each unit's parameters' values as they are now (identical on
  // every rank) and frees them (0 x 0) unless kNoShard; they are
  // materialised again by the hooks. The parameters must outlive the module.
  static absl::StatusOr<FullyShardedDataParallel> Create(
      const DeviceMesh& mesh, std::vector<FsdpUnit> units,
      FsdpOptions options = {});

  FullyShardedDataParallel(FullyShardedDataParallel&&) noexcept;
  FullyShardedDataParallel& operator=(FullyShardedDataParallel&&) noexcept;
  ~FullyShardedDataParallel();

  // -- Hooks around each unit's computation ---------------------------------
  // Materialises unit `u`'s parameters (waiting for its all_gather) and
  // starts the prefetch of the next units.
  absl::Status PreForward(size_t u);
  // Frees the gathered copy (kFullShard); the other modes keep it.
  absl::Status PostForward(size_t u);
  // Materialises `u` again where it was freed, zeroes its gradients, and
  // prefetches the preceding units.
  absl::Status PreBackward(size_t u);
  // Starts the reduce_scatter of `u`'s gradients and frees the gathered
  // parameters and gradients (except kNoShard, which keeps the parameters).
  absl::Status PostBackward(size_t u);
  // Waits for every reduction started by PostBackward (and all_reduces over
  // the replicate group), and adds the averages to the gradient shards.
  // When the replicate group fails (a replica lost; a
  // ReconfigurableCommunicator between configurations answers its status)
  // only that group is stopped (a reconfigurable one until its next
  // configure): the shard group's reductions are waited for, nothing is
  // added to the gradient shards, and after the recovery the step is redone
  // from its forward (ZeroGrad first if it accumulated). A failure of the
  // shard group stops both groups.
  absl::Status FinishBackward();

  // -- The optimizer --------------------------------------------------------
  // Calls `step` on each unit's local shard, then refreshes or frees what is
  // materialised. FailedPrecondition while reductions are pending.
  absl::Status Step(const ShardStepFn& step);
  absl::Status SgdStep(double learning_rate);
  // Installs one FlatOptimizer per unit over this rank's shard (replacing
  // any before, state and all). InvalidArgument for options out of range
  // (ValidateOptimizerOptions), with nothing changed.
  absl::Status SetOptimizer(const OptimizerOptions& options);
  // Step with the installed optimizer; FailedPrecondition without one.
  absl::Status OptimizerStep();
  // Unit `u`'s installed optimizer, over local_shard(u) (its state, for
  // checkpoints); null before SetOptimizer.
  FlatOptimizer* optimizer(size_t u);
  // Zeroes the gradient shards (they accumulate over backward passes).
  void ZeroGrad();

  // -- Inspection -----------------------------------------------------------
  // Collective over the shard group: unit `u`'s full parameters, in its
  // parameters' order (for checkpoints and tests). Does not materialise.
  absl::StatusOr<std::vector<Matrix>> FullParameters(size_t u);
  absl::Span<const double> local_shard(size_t u) const;
  // The same elements, writable (to load a replica's state, e.g. an elastic
  // joiner's). Only between steps, with no unit materialised (kFullShard
  // or kHybridShard after PostBackward): a gathered copy would go stale.
  absl::Span<double> mutable_local_shard(size_t u);
  absl::Span<const double> local_grad_shard(size_t u) const;
  FsdpMemory MemoryUsage() const;

  size_t num_units() const;
  const std::string& unit_name(size_t u) const;
  // Elements of unit `u`, unpadded, and of one shard.
  size_t unit_elements(size_t u) const;
  size_t shard_elements(size_t u) const;
  int shard_size() const;
  int shard_rank() const;
  // The replicate group as it is now (it may change between steps).
  int replicate_size() const;
  int replicate_rank() const;
  // shard_size x replicate_size, and this rank's index among them
  // (replicate_rank * shard_size + shard_rank): the data slice to train on.
  int dp_size() const { return shard_size() * replicate_size(); }
  int dp_rank() const { return replicate_rank() * shard_size() + shard_rank(); }
  // Collectives started, by kind, since Create (for tests and benchmarks).
  struct Counters {
    int64_t all_gathers = 0;
    int64_t reduce_scatters = 0;
    int64_t all_reduces = 0;
    // What a ring algorithm sends from this rank: (S - 1) shards per
    // all_gather and reduce_scatter, 2 (R - 1) / R shards per all_reduce.
    int64_t bytes_sent = 0;
  };
  const Counters& counters() const;
  const FsdpOptions& options() const;

 private:
  struct State;
  explicit FullyShardedDataParallel(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_FULLY_SHARDED_DATA_PARALLEL_H_
