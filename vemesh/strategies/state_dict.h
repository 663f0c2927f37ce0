// vemesh/strategies/state_dict.h
//
// What one rank trains with (parameters, however a strategy holds them, and
// the optimizer state), named once, and turned into a checkpoint StateDict
// under the SERIAL model's names and shapes (so that a checkpoint saved on
// one mesh and strategy loads on any other) and into the state an elastic
// mesh sends to joiners (vemesh/strategies/elastic_state.h).
//
//   TrainingState state;
//   // 1. The model: each parameter's serial name, shape and local box
//   //    (vemesh/strategies/parameter_placement.h), before FSDP frees them.
//   absl::Status s = state.AddColumnParallel("layer0", fc0);
//   s = state.AddRowParallel("layer1", fc1);
//   s = state.AddParameter(&head, WholePlacement("head.weight", 32, 10));
//   s = state.AddWholeParameters(experts);  // whole, by their own names
//   // 2. How each is trained (whichever the program uses):
//   s = state.AddOptimizer(opt);                 // DataParallel, experts
//   s = state.AddDistributedOptimizer(*zero, params);  // ZeRO-1/2
//   s = state.AddFsdp(fsdp, {fc0.parameters(), fc1.parameters()});
//   // 3. Save (the pieces point at live buffers: keep `state` and them
//   //    unchanged until Save returns, or AsyncSaver::Start copies them):
//   checkpoint::StateDict dict;
//   s = state.get_state_dict(&dict);
//   dict.SetMetadata("data_position", "1234");
//   s = checkpoint::Save(dict, step, dir, *world);
//   // ... or load, then apply what is not written in place (step counts):
//   checkpoint::StateDict want;
//   s = state.get_state_dict(&want, StateDictParts::kOptimizer);
//   absl::StatusOr<checkpoint::LoadResult> r =
//       checkpoint::Load(want, dir, *world);
//   s = state.set_state_dict();
//
// Names mirror torch.distributed.checkpoint.state_dict: get_state_dict
// (with get_model_state_dict and get_optimizer_state_dict as its parts)
// and set_state_dict. As there, the dict is keyed by the serial model's
// fully qualified names whatever the parallelism; unlike there, the dict
// holds no copies: Save reads the live buffers and Load writes them.
//
// Tensors, all float64 but the steps:
//   <name>                        the parameter (kModel): this rank's box.
//       From Parameter::value (DataParallel, ZeRO, TP, experts), or under
//       FSDP from the unit's flat shard, cut into per-parameter boxes
//       (FlatRunPieces), so the ranks of a shard group add disjoint pieces.
//   <name>.exp_avg, <name>.exp_avg_sq (AdamW), <name>.momentum_buffer (SGD
//       with momentum): the optimizer state of that parameter, laid out as
//       it is (kOptimizer), from wherever it lives: an Optimizer's per
//       parameter FlatOptimizer, a DistributedOptimizer's shard or an FSDP
//       unit's (flat runs cut into boxes as above).
//   <name>.step                   I64 scalar: the step count of the
//       optimizer that steps <name> (PyTorch's per-parameter `step`), added
//       by every rank holding any of its state. set_state_dict gives it back
//       to the optimizers (AdamW's bias correction and SGD momentum's first
//       step depend on it).
// Replicas (DP ranks, a row layer's bias on every TP rank) add the same
// boxes; Save writes each once.
//
// Loading: parameters must be loaded where they live when the load runs.
// Before FSDP or a DistributedOptimizer exist, a TrainingState with only
// the model (step 1) loads kModel into Parameter::value, and FSDP / ZeRO
// then shard the loaded values; once the optimizers exist, kOptimizer loads
// their state in place. Loading kModel into an FSDP module writes its
// shards (mutable_local_shard): only between steps, with no unit gathered
// (FULL_SHARD or HYBRID_SHARD), or its gathered copies go stale.
//
// Errors are InvalidArgument naming the tensor: a name added twice, a box
// outside its global shape, a Parameter whose value's shape is not its box
// (and not freed by FSDP), a parameter an optimizer or FSDP unit steps that
// was never added, or that two of them step, a unit or shard whose size is
// not its parameters'.
//
// A TrainingState holds pointers to what it was given, which must outlive
// it (and stay at their addresses: an std::optional emplaced again is the
// same object); it is neither copied nor moved (elastic entries point at
// it). Not thread-safe.

#ifndef VEMESH_STRATEGIES_STATE_DICT_H_
#define VEMESH_STRATEGIES_STATE_DICT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "vemesh/checkpoint/state_dict.h"
#include "vemesh/elastic/replica_state.h"
#include "vemesh/strategies/column_parallel_linear.h"
#include "vemesh/strategies/distributed_optimizer.h"
#include "vemesh/strategies/fully_sharded_data_parallel.h"
#include "vemesh/strategies/optimizer.h"
#include "vemesh/strategies/parameter.h"
#include "vemesh/strategies/parameter_placement.h"
#include "vemesh/strategies/row_parallel_linear.h"

namespace vemesh::strategies {

// PyTorch's get_model_state_dict / get_optimizer_state_dict / both.
enum class StateDictParts { kAll, kModel, kOptimizer };

// One entry of the elastic state (ReplicaState): live bytes, or (for what
// is not one buffer) a pair of callbacks.
struct ElasticStateEntry {
  std::string name;
  ReplicaState::BytesFn bytes;           // set: sent, received, hashed in place
  ReplicaState::StateDictFn state_dict;  // else these two
  ReplicaState::LoadStateDictFn load_state_dict;
};

class TrainingState {
 public:
  TrainingState() = default;
  TrainingState(const TrainingState&) = delete;
  TrainingState& operator=(const TrainingState&) = delete;

  // -- The model ------------------------------------------------------------
  // `param` is the local piece `placement` describes (2-D: a Parameter is a
  // Matrix). Its value must have the box's shape unless it is freed (0 x 0,
  // by FSDP: then AddFsdp must cover it).
  absl::Status AddParameter(Parameter* param, ParameterPlacement placement);
  // params[i] at placements[i]; the counts must match.
  absl::Status AddParameters(absl::Span<Parameter* const> params,
                             std::vector<ParameterPlacement> placements);
  // Each of `params` whole, under its own name (Parameter::name) and its
  // value's shape: replicated tensors, or tensors one rank owns whole (an
  // expert by its global name). A null or freed (0 x 0) one: InvalidArgument.
  absl::Status AddWholeParameters(absl::Span<Parameter* const> params);
  // A TP layer's weight and bias as `prefix`.weight / `prefix`.bias
  // (ColumnParallelPlacements / RowParallelPlacements of the layer).
  absl::Status AddColumnParallel(const std::string& prefix,
                                 ColumnParallelLinear& layer);
  absl::Status AddRowParallel(const std::string& prefix,
                              RowParallelLinear& layer);

  // -- How they are trained -------------------------------------------------
  // A torch.optim-shaped optimizer: its i-th parameter's state belongs to
  // params()[i], each added above.
  absl::Status AddOptimizer(Optimizer& optimizer);
  // A DistributedOptimizer made over `params` (the list given to Create, in
  // its order): this rank's shard of their concatenation holds the state.
  absl::Status AddDistributedOptimizer(DistributedOptimizer& zero,
                                       std::vector<Parameter*> params);
  // An FSDP module made over `units` (each unit's parameters, in the order
  // given to Create): the parameters' values and, once SetOptimizer ran,
  // their optimizer state come from its shards.
  absl::Status AddFsdp(FullyShardedDataParallel& fsdp,
                       std::vector<std::vector<Parameter*>> units);

  // -- Checkpoints ----------------------------------------------------------
  // Adds this rank's pieces of `parts` to `dict` (see above). Also copies
  // the optimizers' step counts into this object, where the pieces of
  // <name>.step point (until the next get_state_dict).
  absl::Status get_state_dict(checkpoint::StateDict* dict,
                              StateDictParts parts = StateDictParts::kAll);
  // After checkpoint::Load filled what the last get_state_dict listed:
  // sets every optimizer's step count to the loaded <name>.step
  // (InvalidArgument when the tensors one optimizer steps were saved with
  // different counts). Without optimizers, or after a kModel
  // get_state_dict, it does nothing.
  absl::Status set_state_dict();

  // -- Elastic state --------------------------------------------------------
  // The same pieces as live buffers, for ElasticMesh::register_state_bytes
  // (RegisterElasticState, vemesh/strategies/elastic_state.h, registers
  // them): each parameter's value not under FSDP (its name), each FSDP
  // unit's shard ("fsdp.<unit>"), each optimizer state buffer
  // ("<name>.<state>", "fsdp.<unit>.<state>", "zero<k>.<state>"), and the
  // step counts ("optimizer.steps": a pair of callbacks, 8 bytes per flat
  // optimizer (an Optimizer's parameter, a ZeRO shard, an FSDP unit), in
  // the order they were added). InvalidArgument as get_state_dict (a value
  // of the wrong shape).
  absl::StatusOr<std::vector<ElasticStateEntry>> elastic_state();

  size_t num_parameters() const { return params_.size(); }

 private:
  struct Param {
    Parameter* param = nullptr;
    ParameterPlacement placement;
    bool fsdp = false;     // its value lives in an FSDP unit's shard
    bool stepped = false;  // an optimizer holds its state
  };
  struct Fsdp {
    FullyShardedDataParallel* module = nullptr;
    std::vector<std::vector<size_t>> units;  // indexes into params_
  };
  struct Zero {
    DistributedOptimizer* zero = nullptr;
    std::vector<size_t> params;
  };
  // One optimizer's flat run: the values [begin, begin + count) of the
  // concatenation of `params` (this rank's shard, or a whole parameter).
  struct Run {
    FlatOptimizer* optimizer = nullptr;
    std::vector<size_t> params;
    int64_t begin = 0;
    int64_t count = 0;
    std::string name;  // the elastic entries' prefix
  };

  absl::StatusOr<size_t> Find(const Parameter* p, const char* who) const;
  absl::Status MarkStepped(size_t index, const char* who);
  std::vector<ParameterPlacement> Placements(
      absl::Span<const size_t> indexes) const;
  // OK when p's value has its box's shape (or is freed, if allowed).
  absl::Status CheckValue(const Param& p, bool allow_freed) const;
  static absl::Status SyncStepCount(Optimizer& opt);
  absl::Status AddRun(absl::Span<const size_t> indexes, int64_t begin,
                      int64_t count, double* data, const std::string& suffix,
                      checkpoint::StateDict* dict) const;
  // Every optimizer's run, in the order they were added.
  std::vector<Run> Runs() const;

  std::vector<Param> params_;
  absl::flat_hash_map<const Parameter*, size_t> index_;
  absl::flat_hash_map<std::string, size_t> by_name_;
  std::vector<Optimizer*> optimizers_;
  std::vector<Zero> zeros_;
  std::vector<Fsdp> fsdps_;
  // The <name>.step values of the last get_state_dict, one vector per
  // Runs() entry with one value per tensor (where the pieces point).
  std::vector<std::vector<int64_t>> steps_;
};

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_STATE_DICT_H_
