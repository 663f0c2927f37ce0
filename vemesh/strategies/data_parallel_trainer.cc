#include "vemesh/strategies/data_parallel_trainer.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "vemesh/base/status_macros.h"

namespace vemesh::strategies {
namespace {

const char* ModeName(DataParallelMode mode) {
  switch (mode) {
    case DataParallelMode::kDdp:
      return "DDP";
    case DataParallelMode::kZero:
      return "ZeRO";
    case DataParallelMode::kHsdp:
      return "HSDP";
  }
  return "?";
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataParallelTrainer>>
DataParallelTrainer::Create(const DeviceMesh& mesh, std::vector<FsdpUnit> units,
                            const DataParallelTrainerOptions& options) {
  const char* mode = ModeName(options.mode);
  if (units.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DataParallelTrainer (", mode,
                     "): no units, expected at least one layer's parameters"));
  }
  // A parameter in two units would be reduced and stepped twice.
  absl::flat_hash_map<const Parameter*, const FsdpUnit*> unit_of;
  for (const FsdpUnit& u : units) {
    for (const Parameter* p : u.params) {
      auto [it, fresh] = unit_of.emplace(p, &u);
      if (!fresh) {
        const std::string name = p == nullptr ? "(null)" : p->name;
        return absl::InvalidArgumentError(
            it->second == &u
                ? absl::StrCat("DataParallelTrainer (", mode, "): parameter '",
                               name, "' is listed twice in unit '", u.name,
                               "'; expected each parameter once")
                : absl::StrCat("DataParallelTrainer (", mode, "): parameter '",
                               name, "' is in unit '", it->second->name,
                               "' and in unit '", u.name,
                               "'; expected each parameter in one unit"));
      }
    }
  }
  std::unique_ptr<DataParallelTrainer> t(new DataParallelTrainer(options));
  for (const FsdpUnit& u : units) {
    t->units_.push_back(u.params);
    t->params_.insert(t->params_.end(), u.params.begin(), u.params.end());
  }
  if (options.mode != DataParallelMode::kDdp) {
    for (const std::string* dim :
         {&options.shard_dim, &options.replicate_dim}) {
      absl::StatusOr<std::shared_ptr<Communicator>> g = mesh.get_group(*dim);
      if (!g.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "DataParallelTrainer (", mode, "): the mesh has no dimension '",
            *dim, "' (", g.status().message(),
            "); expected shard_dim and replicate_dim among its dimensions"));
      }
      (dim == &options.shard_dim ? t->shard_ : t->replicate_) = *std::move(g);
    }
  }
  switch (options.mode) {
    case DataParallelMode::kDdp: {
      VEMESH_ASSIGN_OR_RETURN(Optimizer opt,
                              Optimizer::Create(options.optimizer, t->params_));
      t->optimizer_.emplace(std::move(opt));
      // No overlap: every DP operation comes after the replica's own.
      t->dp_.emplace(DataParallelOptions{
          .bucket_elements = options.bucket_elements, .overlap = false});
      break;
    }
    case DataParallelMode::kZero: {
      VEMESH_ASSIGN_OR_RETURN(t->zero_, DistributedOptimizer::Create(
                                            {.optimizer = options.optimizer,
                                             .stage = options.zero_stage,
                                             .shard_group = t->shard_,
                                             .replicate_group = t->replicate_},
                                            t->params_));
      break;
    }
    case DataParallelMode::kHsdp: {
      VEMESH_ASSIGN_OR_RETURN(DeviceMesh dp_mesh,
                              mesh.slice(std::vector<std::string>{
                                  options.replicate_dim, options.shard_dim}));
      VEMESH_ASSIGN_OR_RETURN(
          FullyShardedDataParallel fsdp,
          FullyShardedDataParallel::Create(
              dp_mesh, std::move(units),
              {.sharding_strategy = ShardingStrategy::kHybridShard,
               .shard_dims = {options.shard_dim},
               .replicate_dims = {options.replicate_dim}}));
      t->fsdp_.emplace(std::move(fsdp));
      VEMESH_RETURN_IF_ERROR(t->fsdp_->SetOptimizer(options.optimizer));
      break;
    }
  }
  return t;
}

absl::Status DataParallelTrainer::BeginStep() {
  if (fsdp_) {
    fsdp_->ZeroGrad();
    for (size_t u = fsdp_->num_units(); u-- > 0;) {
      VEMESH_RETURN_IF_ERROR(fsdp_->PreBackward(u));
    }
  } else if (zero_) {
    zero_->ZeroGrad();
  } else {
    optimizer_->ZeroGrad();
  }
  return absl::OkStatus();
}

absl::Status DataParallelTrainer::AfterBackward() {
  if (!fsdp_) return absl::OkStatus();
  for (size_t u = fsdp_->num_units(); u-- > 0;) {
    VEMESH_RETURN_IF_ERROR(fsdp_->PostBackward(u));
  }
  return absl::OkStatus();
}

absl::Status DataParallelTrainer::Step() {
  if (fsdp_) {
    VEMESH_RETURN_IF_ERROR(fsdp_->FinishBackward());
    return fsdp_->OptimizerStep();
  }
  if (zero_) return zero_->Step().status();
  VEMESH_RETURN_IF_ERROR(dp_->AverageGradients(params_).status());
  return optimizer_->Step();
}

absl::Status DataParallelTrainer::AddTo(TrainingState& state) {
  if (fsdp_) return state.AddFsdp(*fsdp_, units_);
  if (zero_) return state.AddDistributedOptimizer(*zero_, params_);
  return state.AddOptimizer(*optimizer_);
}

}  // namespace vemesh::strategies
