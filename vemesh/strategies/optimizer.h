// vemesh/strategies/optimizer.h
//
// SGD and AdamW with PyTorch's update rules and defaults, in two shapes:
//
// A FlatOptimizer steps one flat run of values (a shard of a flattened
// parameter under FSDP or ZeRO, or one whole parameter) and owns the state
// (momentum, Adam's moments) of exactly that run:
//
//   absl::StatusOr<std::unique_ptr<FlatOptimizer>> opt = MakeFlatOptimizer(
//       OptimizerOptions::AdamW(1e-3), shard.size());
//   absl::Status s = (*opt)->Step(absl::MakeSpan(shard),
//                                 absl::MakeConstSpan(grad_shard));
//
// An Optimizer steps a list of Parameters (torch.optim's shape; the serial
// reference and DataParallel use it), one FlatOptimizer per parameter:
//
//   absl::StatusOr<Optimizer> opt =
//       Optimizer::Create(OptimizerOptions::Sgd(0.05), model.parameters());
//   ... backward, DataParallel::AverageGradients ...
//   s = opt->Step();        // value <- update(value, grad)
//   opt->ZeroGrad();
//
// The rules, as torch.optim writes them (t counts Step calls from 1):
//   SGD:   g += weight_decay * p;  b = t == 1 ? g : momentum * b + g
//          (b = g without momentum);  p -= lr * b
//   AdamW: p *= 1 - lr * weight_decay          (decoupled decay)
//          m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//          p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// With weight_decay = 0, AdamW is Adam. Defaults are PyTorch's: lr 1e-3,
// betas (0.9, 0.999), eps 1e-8, weight decay 0 for SGD and 1e-2 for AdamW.
//
// A value that is 0 with a gradient that is 0 stays 0 under both rules, so a
// shard padded with zeros steps its padding harmlessly.
//
// State is allocated when the optimizer is made (PyTorch allocates it on the
// first step), so state_bytes() is the steady-state memory from the start:
// SGD 0 (8 per value with momentum), AdamW 16 per value.

#ifndef VEMESH_STRATEGIES_OPTIMIZER_H_
#define VEMESH_STRATEGIES_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "vemesh/strategies/parameter.h"

namespace vemesh::strategies {

enum class OptimizerKind { kSgd, kAdamW };

// "sgd" or "adamw".
absl::string_view OptimizerKindName(OptimizerKind kind);
// Parses "sgd", "adam" or "adamw" (the same rule: Adam is AdamW without
// weight decay, and ParseOptimizerKind leaves the decay to the caller).
absl::StatusOr<OptimizerKind> ParseOptimizerKind(absl::string_view name);

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kSgd;
  double lr = 1e-3;  // >= 0
  // SGD only: >= 0 (0: no momentum buffer).
  double momentum = 0.0;
  // AdamW only: each in [0, 1).
  double beta1 = 0.9;
  double beta2 = 0.999;
  // AdamW only: > 0.
  double eps = 1e-8;
  // >= 0. Unset: PyTorch's default for `kind` (SGD 0, AdamW 1e-2). SGD adds
  // it to the gradient (L2); AdamW decays the value directly (decoupled).
  std::optional<double> weight_decay = std::nullopt;

  static OptimizerOptions Sgd(double lr, double momentum = 0.0) {
    OptimizerOptions o;
    o.lr = lr;
    o.momentum = momentum;
    return o;
  }
  static OptimizerOptions AdamW(double lr) {
    OptimizerOptions o;
    o.kind = OptimizerKind::kAdamW;
    o.lr = lr;
    return o;
  }
  double resolved_weight_decay() const {
    return weight_decay.value_or(kind == OptimizerKind::kAdamW ? 1e-2 : 0.0);
  }
};

// OK, or InvalidArgument naming the first option out of range.
absl::Status ValidateOptimizerOptions(const OptimizerOptions& options);

// Bytes of optimizer state for `elements` values (what a FlatOptimizer of
// that size reports): SGD 0 or 8 per value with momentum, AdamW 16.
size_t OptimizerStateBytes(const OptimizerOptions& options, size_t elements);

// What one rank keeps across steps to train: the memory a sharding strategy
// saves is counted here (transient buffers of one step are not).
struct TrainingStateBytes {
  size_t parameters = 0;
  size_t gradients = 0;
  size_t optimizer_state = 0;
  size_t total() const { return parameters + gradients + optimizer_state; }
};

// Replicated training (serial, DataParallel) of `elements` values: full
// parameters, full gradients and full optimizer state on every rank.
TrainingStateBytes ReplicatedStateBytes(const OptimizerOptions& options,
                                        size_t elements);

// The update rule and state of one flat run of `size()` values.
class FlatOptimizer {
 public:
  virtual ~FlatOptimizer() = default;

  // One step: `value` (in place) from `grad`. InvalidArgument, with nothing
  // changed, unless both have size() elements.
  absl::Status Step(absl::Span<double> value, absl::Span<const double> grad);

  size_t size() const { return size_; }
  // Step calls that succeeded (PyTorch's `step` state).
  int64_t step_count() const { return step_; }
  // Bytes of optimizer state this object holds for its run.
  virtual size_t state_bytes() const = 0;
  // The state buffers, each of size() values, by PyTorch's state names
  // ("momentum_buffer"; "exp_avg", "exp_avg_sq"): what a checkpoint saves
  // and restores in place. Empty for SGD without momentum.
  virtual std::vector<std::pair<std::string, absl::Span<double>>>
  mutable_state() = 0;
  // Restores step_count() from a checkpoint (AdamW's bias correction uses
  // it); the next Step is step `count` + 1.
  void set_step_count(int64_t count) { step_ = count; }
  const OptimizerOptions& options() const { return options_; }

 protected:
  FlatOptimizer(const OptimizerOptions& options, size_t size)
      : options_(options), size_(size) {}
  // `t` is the 1-based step number; sizes are checked.
  virtual void Update(int64_t t, absl::Span<double> value,
                      absl::Span<const double> grad) = 0;

  OptimizerOptions options_;  // weight_decay resolved

 private:
  size_t size_;
  int64_t step_ = 0;
};

// InvalidArgument if `options` are out of range.
absl::StatusOr<std::unique_ptr<FlatOptimizer>> MakeFlatOptimizer(
    const OptimizerOptions& options, size_t size);

// Steps a fixed list of Parameters, each with its own state.
class Optimizer {
 public:
  // InvalidArgument for bad options, a null or repeated parameter.
  static absl::StatusOr<Optimizer> Create(const OptimizerOptions& options,
                                          std::vector<Parameter*> params);

  // Every parameter's value from its grad. InvalidArgument, with nothing
  // changed, if a parameter's size changed since Create.
  absl::Status Step();
  void ZeroGrad();

  size_t state_bytes() const;
  int64_t step_count() const { return step_; }
  const OptimizerOptions& options() const { return options_; }
  const std::vector<Parameter*>& params() const { return params_; }
  // Parameter i's optimizer (its state, for checkpoints).
  FlatOptimizer& flat(size_t i) { return *flat_[i]; }
  void set_step_count(int64_t count);

 private:
  Optimizer() = default;

  OptimizerOptions options_;
  std::vector<Parameter*> params_;
  std::vector<std::unique_ptr<FlatOptimizer>> flat_;
  int64_t step_ = 0;
};

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_OPTIMIZER_H_
