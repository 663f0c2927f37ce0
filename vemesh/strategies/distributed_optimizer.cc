#include "vemesh/strategies/distributed_optimizer.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "vemesh/base/fnv1a.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/agreement.h"
#include "vemesh/comm/half.h"
#include "vemesh/comm/reconfigurable_communicator.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace vemesh::strategies {
namespace {

// FNV-1a over the shapes, to compare parameter lists across ranks in one
// number.
int64_t ShapeHash(const std::vector<std::pair<int64_t, int64_t>>& shapes) {
  uint64_t h = kFnv1aOffset;
  for (const auto& [rows, cols] : shapes) {
    h = Fnv1aWord(static_cast<uint64_t>(rows), h);
    h = Fnv1aWord(static_cast<uint64_t>(cols), h);
  }
  return static_cast<int64_t>(h);
}

// What Create agrees on over DP: the shapes in order (all of them in the
// hash, the first few in the text).
AgreementSummary ShapesSummary(
    const std::vector<std::pair<int64_t, int64_t>>& shapes, size_t elements) {
  AgreementSummary s;
  s.hash = Fnv1aWord(static_cast<uint64_t>(ShapeHash(shapes)),
                     Fnv1aWord(shapes.size()));
  s.text =
      absl::StrCat(shapes.size(), " parameters of ", elements, " values [");
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (s.text.size() > kAgreementTextBytes) break;
    absl::StrAppend(&s.text, i == 0 ? "" : ", ", shapes[i].first, "x",
                    shapes[i].second);
  }
  s.text += ']';
  return s;
}

// The group the state is sharded over: the options' shard_group, or the
// registry's DP group.
absl::StatusOr<RoleGroup> ShardGroupOf(
    const DistributedOptimizerOptions& options) {
  const std::shared_ptr<Communicator>& g = options.shard_group;
  if (g == nullptr) return CurrentDataParallelGroup();
  RoleGroup group;
  group.size = g->size();
  group.rank = g->rank();
  if (group.size > 1) group.comm = g;
  return group;
}

}  // namespace

absl::StatusOr<ZeroStage> ParseZeroStage(absl::string_view text) {
  if (text == "1") return ZeroStage::kOne;
  if (text == "2") return ZeroStage::kTwo;
  return absl::InvalidArgumentError(
      absl::StrCat("ZeRO stage '", text, "' is unknown: expected 1 or 2"));
}

absl::StatusOr<std::unique_ptr<DistributedOptimizer>>
DistributedOptimizer::Create(const DistributedOptimizerOptions& options,
                             std::vector<Parameter*> params) {
  // This rank's verdict on its own input; shared below before anyone
  // returns, so that no rank waits in a collective for one that left.
  std::string local_error;
  if (absl::Status s = ValidateOptimizerOptions(options.optimizer); !s.ok()) {
    local_error = std::string(s.message());
  } else if (options.stage != ZeroStage::kOne &&
             options.stage != ZeroStage::kTwo) {
    local_error = absl::StrCat("ZeRO stage ", static_cast<int>(options.stage),
                               " is unknown: expected 1 or 2");
  }
  std::vector<std::pair<int64_t, int64_t>> shapes;
  absl::flat_hash_set<const Parameter*> seen;
  size_t elements = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const Parameter* p = params[i];
    if (p == nullptr) {
      if (local_error.empty()) {
        local_error = absl::StrCat("parameter ", i, " is null");
      }
      continue;
    }
    if (!seen.insert(p).second && local_error.empty()) {
      local_error =
          absl::StrCat("parameter ", i, " ('", p->name, "') is listed twice");
    }
    shapes.emplace_back(p->value.rows(), p->value.cols());
    elements += static_cast<size_t>(p->value.size());
  }

  // The groups themselves: without a shard group this rank cannot know
  // whom it would agree with, so it answers at once (every rank passes the
  // same options, so every rank does).
  if (options.replicate_group != nullptr && options.shard_group == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DistributedOptimizer: replicate_group (a group of ",
        options.replicate_group->size(),
        ") is set but shard_group is null; expected a shard_group with it "
        "(HSDP-style ZeRO), a shard_group alone, or neither (the registry's "
        "DP group)"));
  }
  for (const auto& [group, what] :
       {std::pair{&options.shard_group, "shard_group"},
        std::pair{&options.replicate_group, "replicate_group"}}) {
    if (*group != nullptr && (*group)->backend() == "nccl") {
      return absl::FailedPreconditionError(absl::StrCat(
          "DistributedOptimizer: ", what,
          " is on nccl, but the optimizer keeps its buffers in host memory; "
          "expected an mpi or gloo group"));
    }
  }
  VEMESH_ASSIGN_OR_RETURN(RoleGroup dp, ShardGroupOf(options));
  const AgreementSummary mine =
      local_error.empty() ? ShapesSummary(shapes, elements)
                          : AgreementSummary::Of(
                                "rejected its own input (its error names "
                                "it)");
  absl::Status agreed;
  if (dp.size > 1) {
    // A rank that rejected its own input says so instead of its shapes:
    // the others are told which rank, it returns its own error below.
    agreed = AgreeAcrossRanks(
        *dp.comm,
        "DistributedOptimizer parameters (every DP rank must pass the same "
        "shapes in the same order)",
        mine,
        {.member = options.shard_group != nullptr ? "shard rank" : "DP rank"});
  }
  // Over the replicate group too, whatever the shard group answered (its
  // other members wait in this agreement).
  // Not over a reconfigurable (elastic) one: a joiner creates its optimizer
  // while the other replicas train.
  if (options.replicate_group != nullptr &&
      options.replicate_group->size() > 1 &&
      dynamic_cast<const ReconfigurableCommunicator*>(
          options.replicate_group.get()) == nullptr) {
    absl::Status over_replicas = AgreeAcrossRanks(
        *options.replicate_group,
        "DistributedOptimizer parameters (every replica must pass the same "
        "shapes in the same order)",
        mine, {.member = "replicate rank"});
    if (agreed.ok()) agreed = over_replicas;
  }
  if (!local_error.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DistributedOptimizer: ", local_error));
  }
  VEMESH_RETURN_IF_ERROR(agreed);

  auto opt = std::unique_ptr<DistributedOptimizer>(new DistributedOptimizer);
  opt->options_ = options;
  opt->params_ = std::move(params);
  opt->shapes_ = std::move(shapes);
  opt->num_shards_ = dp.size;
  opt->shard_rank_ = dp.rank;
  opt->elements_ = elements;
  opt->shard_ = (elements + dp.size - 1) / dp.size;
  size_t at = 0;
  for (const Parameter* p : opt->params_) {
    opt->offsets_.push_back(at);
    at += static_cast<size_t>(p->value.size());
  }
  VEMESH_ASSIGN_OR_RETURN(opt->shard_optimizer_,
                          MakeFlatOptimizer(options.optimizer, opt->shard_));
  if (options.stage == ZeroStage::kTwo) {
    opt->grad_shard_.assign(opt->shard_, 0.0);
  }
  return opt;
}

int DistributedOptimizer::replicate_size() const {
  const std::shared_ptr<Communicator>& g = options_.replicate_group;
  return g == nullptr ? 1 : g->size();
}

int DistributedOptimizer::replicate_rank() const {
  const std::shared_ptr<Communicator>& g = options_.replicate_group;
  return g == nullptr ? 0 : g->rank();
}

std::string DistributedOptimizer::LocalShapeError() const {
  for (size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = *params_[i];
    const auto [rows, cols] = shapes_[i];
    if (p.value.rows() != rows || p.value.cols() != cols) {
      return absl::StrCat("parameter '", p.name, "' is ", p.value.rows(), "x",
                          p.value.cols(), " but was ", rows, "x", cols,
                          " at Create");
    }
    if (p.grad.rows() != rows || p.grad.cols() != cols) {
      return absl::StrCat(
          "parameter '", p.name, "' has a ", p.grad.rows(), "x", p.grad.cols(),
          " gradient for a ", rows, "x", cols,
          " value (after a ZeRO-2 step, call ZeroGrad before the backward)");
    }
  }
  return "";
}

void DistributedOptimizer::Gather(Matrix Parameter::*field, size_t begin,
                                  size_t count, double* out) const {
  const size_t end = std::min(begin + count, elements_);
  // The first parameter that holds `begin`.
  size_t i = std::upper_bound(offsets_.begin(), offsets_.end(), begin) -
             offsets_.begin();
  i = i == 0 ? 0 : i - 1;
  for (size_t at = begin; at < end && i < params_.size(); ++i) {
    const Matrix& m = params_[i]->*field;
    const size_t from = at - offsets_[i];
    const size_t take =
        std::min(static_cast<size_t>(m.size()) - from, end - at);
    std::copy_n(m.data() + from, take, out + (at - begin));
    at += take;
  }
}

void DistributedOptimizer::Scatter(Matrix Parameter::*field, size_t begin,
                                   size_t count, const double* in) {
  const size_t end = std::min(begin + count, elements_);
  size_t i = std::upper_bound(offsets_.begin(), offsets_.end(), begin) -
             offsets_.begin();
  i = i == 0 ? 0 : i - 1;
  for (size_t at = begin; at < end && i < params_.size(); ++i) {
    Matrix& m = params_[i]->*field;
    const size_t from = at - offsets_[i];
    const size_t take =
        std::min(static_cast<size_t>(m.size()) - from, end - at);
    std::copy_n(in + (at - begin), take, m.data() + from);
    at += take;
  }
}

absl::Status DistributedOptimizer::ReduceGradients(
    const RoleGroup& dp, int replicas, bool bad, std::vector<double>& shard,
    double* bad_ranks, absl::Status* replicate_failed) {
  const size_t n = elements_;
  const size_t s = shard_;
  const size_t p = static_cast<size_t>(dp.size);
  const bool bf16 = options_.gradient_type == GradientType::kBFloat16;
  const double scale = 1.0 / (dp.size * replicas);
  Communicator* const replicate =
      replicas > 1 ? options_.replicate_group.get() : nullptr;
  // Sums `data` over the shard group (`scatter`: reduce_scatter of p equal
  // blocks into `out`, else all_reduce in place, `out` unused), then `out`
  // (or `data`) over the replicate group, each step skipped for a group of
  // one. Typed, so bf16 sends bf16 over both.
  auto sum = [&](auto& data, auto& out, bool scatter) -> absl::Status {
    auto& reduced = scatter ? out : data;
    if (scatter && p == 1) {
      std::copy(data.begin(), data.end(), out.begin());
    } else if (scatter) {
      VEMESH_RETURN_IF_ERROR(dp.comm->reduce_scatter(
          absl::MakeConstSpan(data), absl::MakeSpan(out), ReduceOp::kSum));
    } else if (p > 1) {
      VEMESH_RETURN_IF_ERROR(
          dp.comm->all_reduce(absl::MakeSpan(data), ReduceOp::kSum));
    }
    // A failed replicate group stops only itself (as FSDP's): the shard
    // group goes on, so that its ranks stay matched (see Step).
    if (replicate != nullptr && replicate_failed->ok()) {
      *replicate_failed =
          replicate->all_reduce(absl::MakeSpan(reduced), ReduceOp::kSum);
    }
    return absl::OkStatus();
  };
  // The gradients in the layout of the collective; a bad rank sends zeros.
  std::vector<double> grads;
  if (options_.stage == ZeroStage::kTwo) {
    // P blocks of S + 1: shard r's values, then rank r's copy of the flag.
    grads.assign(p * (s + 1), 0.0);
    for (size_t r = 0; r < p; ++r) {
      if (!bad) Gather(&Parameter::grad, r * s, s, &grads[r * (s + 1)]);
      grads[r * (s + 1) + s] = bad ? 1.0 : 0.0;
    }
    std::vector<double> mine(s + 1);
    if (bf16) {
      std::vector<BFloat16> send(grads.size());
      for (size_t j = 0; j < grads.size(); ++j) {
        send[j] = BFloat16(static_cast<float>(grads[j]));
      }
      std::vector<BFloat16> recv(s + 1);
      VEMESH_RETURN_IF_ERROR(sum(send, recv, /*scatter=*/true));
      for (size_t j = 0; j <= s; ++j) {
        mine[j] = static_cast<double>(static_cast<float>(recv[j]));
      }
    } else {
      VEMESH_RETURN_IF_ERROR(sum(grads, mine, /*scatter=*/true));
    }
    *bad_ranks = mine[s];
    if (*bad_ranks != 0 || !replicate_failed->ok()) return absl::OkStatus();
    for (size_t j = 0; j < s; ++j) shard[j] = mine[j] * scale;
    return absl::OkStatus();
  }
  // ZeRO-1: the whole gradient and one flag.
  grads.assign(n + 1, 0.0);
  if (!bad) Gather(&Parameter::grad, 0, n, grads.data());
  grads[n] = bad ? 1.0 : 0.0;
  if (bf16) {
    std::vector<BFloat16> buf(n + 1);
    for (size_t j = 0; j <= n; ++j) {
      buf[j] = BFloat16(static_cast<float>(grads[j]));
    }
    VEMESH_RETURN_IF_ERROR(sum(buf, buf, /*scatter=*/false));
    for (size_t j = 0; j <= n; ++j) {
      grads[j] = static_cast<double>(static_cast<float>(buf[j]));
    }
  } else {
    VEMESH_RETURN_IF_ERROR(sum(grads, grads, /*scatter=*/false));
  }
  *bad_ranks = grads[n];
  if (*bad_ranks != 0 || !replicate_failed->ok()) return absl::OkStatus();
  for (size_t j = 0; j < n; ++j) grads[j] *= scale;
  Scatter(&Parameter::grad, 0, n, grads.data());
  const size_t begin = static_cast<size_t>(dp.rank) * s;
  for (size_t j = 0; j < s && begin + j < n; ++j) shard[j] = grads[begin + j];
  return absl::OkStatus();
}

absl::StatusOr<ZeroStepStats> DistributedOptimizer::Step() {
  VEMESH_ASSIGN_OR_RETURN(RoleGroup dp, ShardGroupOf(options_));
  const bool own_group = options_.shard_group != nullptr;
  if (dp.size != num_shards_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "DistributedOptimizer: the ", own_group ? "shard group's" : "DP",
        " size is now ", dp.size, " but was ", num_shards_,
        " at Create (the optimizer state is sharded for it); create a new "
        "DistributedOptimizer after a re-init that changes DP"));
  }
  std::string local = LocalShapeError();
  if (local.empty() && dp.rank != shard_rank_) {
    local = absl::StrCat("this rank's ", own_group ? "shard" : "DP",
                         " rank is now ", dp.rank, " but was ", shard_rank_,
                         " at Create (it owns that shard)");
  }
  const bool bad = !local.empty();
  absl::Status replicate_failed;
  // The replicate group as it is now: it may have changed size since the
  // last step (a ReconfigurableCommunicator of an elastic mesh).
  const int replicas = replicate_size();
  ZeroStepStats stats{dp.size * replicas, elements_, shard_, 0};

  std::vector<double> local_shard;
  std::vector<double>& grad =
      options_.stage == ZeroStage::kTwo
          ? grad_shard_
          : (local_shard.assign(shard_, 0.0), local_shard);
  if (dp.size == 1 && replicas == 1) {
    if (bad) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DistributedOptimizer step: ", local, "; nothing was stepped"));
    }
    std::fill(grad.begin(), grad.end(), 0.0);
    Gather(&Parameter::grad, 0, shard_, grad.data());
  } else {
    double bad_ranks = 0;
    VEMESH_RETURN_IF_ERROR(ReduceGradients(dp, replicas, bad, grad, &bad_ranks,
                                           &replicate_failed));
    stats.collectives += (dp.size > 1 ? 1 : 0) + (replicas > 1 ? 1 : 0);
    if (bad_ranks != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DistributedOptimizer step: ",
          bad ? local
              : absl::StrCat(bad_ranks,
                             " DP rank(s) flagged bad input (their "
                             "errors name it)"),
          "; nothing was stepped on any DP rank"));
    }
  }

  // Step this rank's shard of the values (zero padding past N); after a
  // failed replicate group, nothing: the shard is gathered as it is.
  const size_t begin = static_cast<size_t>(dp.rank) * shard_;
  std::vector<double> values(shard_, 0.0);
  Gather(&Parameter::value, begin, shard_, values.data());
  if (replicate_failed.ok()) {
    VEMESH_RETURN_IF_ERROR(shard_optimizer_->Step(absl::MakeSpan(values),
                                                  absl::MakeConstSpan(grad)));
  }
  if (dp.size == 1) {
    Scatter(&Parameter::value, 0, shard_, values.data());
  } else {
    std::vector<double> gathered(shard_ * dp.size);
    VEMESH_RETURN_IF_ERROR(dp.comm->all_gather(absl::MakeConstSpan(values),
                                               absl::MakeSpan(gathered)));
    ++stats.collectives;
    Scatter(&Parameter::value, 0, elements_, gathered.data());
  }
  VEMESH_RETURN_IF_ERROR(replicate_failed);  // the gradients left as they are
  if (options_.stage == ZeroStage::kTwo) {
    // Only the shard is kept; ZeroGrad makes the gradients whole again.
    for (Parameter* p : params_) p->grad.resize(0, 0);
  }
  return stats;
}

void DistributedOptimizer::ZeroGrad() {
  for (Parameter* p : params_) p->ZeroGrad();
}

TrainingStateBytes DistributedOptimizer::memory() const {
  const size_t kept_grads =
      options_.stage == ZeroStage::kTwo ? shard_ : elements_;
  return {elements_ * sizeof(double), kept_grads * sizeof(double),
          shard_optimizer_->state_bytes()};
}

TrainingStateBytes DistributedOptimizer::replicated_memory() const {
  return ReplicatedStateBytes(options_.optimizer, elements_);
}

}  // namespace vemesh::strategies
