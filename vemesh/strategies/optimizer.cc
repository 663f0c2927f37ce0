#include "vemesh/strategies/optimizer.h"

#include <cmath>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace vemesh::strategies {
namespace {

class SgdOptimizer final : public FlatOptimizer {
 public:
  SgdOptimizer(const OptimizerOptions& options, size_t size)
      : FlatOptimizer(options, size) {
    if (options.momentum > 0) momentum_buffer_.assign(size, 0.0);
  }
  size_t state_bytes() const override {
    return momentum_buffer_.size() * sizeof(double);
  }
  std::vector<std::pair<std::string, absl::Span<double>>> mutable_state()
      override {
    if (momentum_buffer_.empty()) return {};
    return {{"momentum_buffer", absl::MakeSpan(momentum_buffer_)}};
  }

 private:
  void Update(int64_t t, absl::Span<double> value,
              absl::Span<const double> grad) override {
    const double lr = options_.lr;
    const double wd = *options_.weight_decay;
    const double mu = options_.momentum;
    for (size_t i = 0; i < value.size(); ++i) {
      double g = grad[i];
      if (wd != 0) g += wd * value[i];
      if (mu > 0) {
        double& b = momentum_buffer_[i];
        b = t == 1 ? g : mu * b + g;
        g = b;
      }
      value[i] -= lr * g;
    }
  }

  std::vector<double> momentum_buffer_;
};

class AdamWOptimizer final : public FlatOptimizer {
 public:
  AdamWOptimizer(const OptimizerOptions& options, size_t size)
      : FlatOptimizer(options, size), exp_avg_(size), exp_avg_sq_(size) {}
  size_t state_bytes() const override {
    return (exp_avg_.size() + exp_avg_sq_.size()) * sizeof(double);
  }
  std::vector<std::pair<std::string, absl::Span<double>>> mutable_state()
      override {
    return {{"exp_avg", absl::MakeSpan(exp_avg_)},
            {"exp_avg_sq", absl::MakeSpan(exp_avg_sq_)}};
  }

 private:
  void Update(int64_t t, absl::Span<double> value,
              absl::Span<const double> grad) override {
    const double lr = options_.lr;
    const double b1 = options_.beta1;
    const double b2 = options_.beta2;
    const double decay = 1.0 - lr * *options_.weight_decay;
    const double td = static_cast<double>(t);
    const double step_size = lr / (1.0 - std::pow(b1, td));
    const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(b2, td));
    for (size_t i = 0; i < value.size(); ++i) {
      const double g = grad[i];
      double& m = exp_avg_[i];
      double& v = exp_avg_sq_[i];
      m = b1 * m + (1.0 - b1) * g;
      v = b2 * v + (1.0 - b2) * g * g;
      const double denom = std::sqrt(v) / bias_correction2_sqrt + options_.eps;
      value[i] = value[i] * decay - step_size * m / denom;
    }
  }

  std::vector<double> exp_avg_;
  std::vector<double> exp_avg_sq_;
};

absl::Status OutOfRange(absl::string_view what, double value,
                        absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer option ", what, "=", value,
                   " is out of range: expected ", expected));
}

}  // namespace

absl::string_view OptimizerKindName(OptimizerKind kind) {
  return kind == OptimizerKind::kAdamW ? "adamw" : "sgd";
}

absl::StatusOr<OptimizerKind> ParseOptimizerKind(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "sgd") return OptimizerKind::kSgd;
  if (lower == "adam" || lower == "adamw") return OptimizerKind::kAdamW;
  return absl::InvalidArgumentError(absl::StrCat(
      "optimizer '", name, "' is unknown: expected sgd, adam or adamw"));
}

absl::Status ValidateOptimizerOptions(const OptimizerOptions& o) {
  // Written so that NaN fails every check.
  if (!(o.lr >= 0) || std::isinf(o.lr)) {
    return OutOfRange("lr", o.lr, "a finite value >= 0");
  }
  const double wd = o.resolved_weight_decay();
  if (!(wd >= 0) || std::isinf(wd)) {
    return OutOfRange("weight_decay", wd, "a finite value >= 0");
  }
  if (o.kind == OptimizerKind::kSgd) {
    if (!(o.momentum >= 0) || std::isinf(o.momentum)) {
      return OutOfRange("momentum", o.momentum, "a finite value >= 0");
    }
    return absl::OkStatus();
  }
  if (!(o.beta1 >= 0 && o.beta1 < 1)) {
    return OutOfRange("beta1", o.beta1, "[0, 1)");
  }
  if (!(o.beta2 >= 0 && o.beta2 < 1)) {
    return OutOfRange("beta2", o.beta2, "[0, 1)");
  }
  if (!(o.eps > 0) || std::isinf(o.eps)) {
    return OutOfRange("eps", o.eps, "a finite value > 0");
  }
  return absl::OkStatus();
}

size_t OptimizerStateBytes(const OptimizerOptions& options, size_t elements) {
  if (options.kind == OptimizerKind::kAdamW)
    return 2 * elements * sizeof(double);
  return options.momentum > 0 ? elements * sizeof(double) : 0;
}

TrainingStateBytes ReplicatedStateBytes(const OptimizerOptions& options,
                                        size_t elements) {
  return {elements * sizeof(double), elements * sizeof(double),
          OptimizerStateBytes(options, elements)};
}

absl::Status FlatOptimizer::Step(absl::Span<double> value,
                                 absl::Span<const double> grad) {
  if (value.size() != size_ || grad.size() != size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        OptimizerKindName(options_.kind), " step: value has ", value.size(),
        " and gradient ", grad.size(), " elements; expected ", size_,
        " each (the size the optimizer was made for)"));
  }
  ++step_;
  Update(step_, value, grad);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<FlatOptimizer>> MakeFlatOptimizer(
    const OptimizerOptions& options, size_t size) {
  if (absl::Status s = ValidateOptimizerOptions(options); !s.ok()) return s;
  OptimizerOptions resolved = options;
  resolved.weight_decay = options.resolved_weight_decay();
  if (options.kind == OptimizerKind::kAdamW) {
    return std::make_unique<AdamWOptimizer>(resolved, size);
  }
  return std::make_unique<SgdOptimizer>(resolved, size);
}

absl::StatusOr<Optimizer> Optimizer::Create(const OptimizerOptions& options,
                                            std::vector<Parameter*> params) {
  if (absl::Status s = ValidateOptimizerOptions(options); !s.ok()) return s;
  Optimizer opt;
  opt.options_ = options;
  opt.options_.weight_decay = options.resolved_weight_decay();
  absl::flat_hash_set<const Parameter*> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("Optimizer: parameter ", i, " is null"));
    }
    if (!seen.insert(params[i]).second) {
      return absl::InvalidArgumentError(absl::StrCat("Optimizer: parameter ", i,
                                                     " ('", params[i]->name,
                                                     "') is listed twice"));
    }
    absl::StatusOr<std::unique_ptr<FlatOptimizer>> flat = MakeFlatOptimizer(
        opt.options_, static_cast<size_t>(params[i]->value.size()));
    if (!flat.ok()) return flat.status();
    opt.flat_.push_back(*std::move(flat));
  }
  opt.params_ = std::move(params);
  return opt;
}

absl::Status Optimizer::Step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = *params_[i];
    const size_t n = flat_[i]->size();
    if (static_cast<size_t>(p.value.size()) != n ||
        static_cast<size_t>(p.grad.size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Optimizer step: parameter '", p.name, "' has ", p.value.size(),
          " values and ", p.grad.size(), " gradients; expected ", n,
          " each (its size at Create)"));
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    if (absl::Status s = flat_[i]->Step(AsSpan(p.value), AsConstSpan(p.grad));
        !s.ok()) {
      return s;
    }
  }
  ++step_;
  return absl::OkStatus();
}

void Optimizer::set_step_count(int64_t count) {
  step_ = count;
  for (std::unique_ptr<FlatOptimizer>& f : flat_) f->set_step_count(count);
}

void Optimizer::ZeroGrad() {
  for (Parameter* p : params_) p->ZeroGrad();
}

size_t Optimizer::state_bytes() const {
  size_t n = 0;
  for (const auto& f : flat_) n += f->state_bytes();
  return n;
}

}  // namespace vemesh::strategies
