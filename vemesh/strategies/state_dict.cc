#include "vemesh/strategies/state_dict.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/base/status_macros.h"

namespace vemesh::strategies {
namespace {

using checkpoint::Box;
using checkpoint::DType;
using checkpoint::StateDict;

absl::Span<char> Bytes(double* data, size_t count) {
  return absl::MakeSpan(reinterpret_cast<char*>(data), count * sizeof(double));
}

ElasticStateEntry LiveBytes(std::string name, ReplicaState::BytesFn bytes) {
  ElasticStateEntry e;
  e.name = std::move(name);
  e.bytes = std::move(bytes);
  return e;
}

}  // namespace

absl::Status TrainingState::AddParameter(Parameter* param,
                                         ParameterPlacement placement) {
  if (param == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state dict: parameter '", placement.name, "' is a null pointer"));
  }
  VEMESH_RETURN_IF_ERROR(CheckPlacement(placement));
  if (placement.global_shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("state dict: parameter '", placement.name, "' has a ",
                     placement.global_shape.size(), "-D global shape [",
                     absl::StrJoin(placement.global_shape, ", "),
                     "]; a Parameter is a matrix: expected 2-D"));
  }
  if (auto it = by_name_.find(placement.name); it != by_name_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state dict: the name '", placement.name, "' is added twice (boxes ",
        checkpoint::BoxToString(params_[it->second].placement.box), " and ",
        checkpoint::BoxToString(placement.box),
        "): expected one piece per tensor and rank"));
  }
  if (auto it = index_.find(param); it != index_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state dict: parameter '", param->name, "' is added twice, as '",
        params_[it->second].placement.name, "' and as '", placement.name, "'"));
  }
  Param p{param, std::move(placement)};
  // A freed value is checked when it is used (an FSDP module may hold it).
  VEMESH_RETURN_IF_ERROR(CheckValue(p, /*allow_freed=*/true));
  index_[param] = params_.size();
  by_name_[p.placement.name] = params_.size();
  params_.push_back(std::move(p));
  return absl::OkStatus();
}

absl::Status TrainingState::AddParameters(
    absl::Span<Parameter* const> params,
    std::vector<ParameterPlacement> placements) {
  if (params.size() != placements.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("state dict: ", params.size(), " parameters but ",
                     placements.size(), " placements: expected one each"));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    VEMESH_RETURN_IF_ERROR(AddParameter(params[i], std::move(placements[i])));
  }
  return absl::OkStatus();
}

absl::Status TrainingState::AddWholeParameters(
    absl::Span<Parameter* const> params) {
  for (Parameter* p : params) {
    if (p == nullptr) {
      return absl::InvalidArgumentError(
          "state dict: AddWholeParameters got a null parameter");
    }
    if (p->value.rows() == 0 && p->value.cols() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state dict: ", p->name,
          " is freed (0 x 0, FSDP's?): AddWholeParameters needs its value's "
          "shape; name it before FSDP is made"));
    }
    VEMESH_RETURN_IF_ERROR(AddParameter(
        p, WholePlacement(p->name, p->value.rows(), p->value.cols())));
  }
  return absl::OkStatus();
}

absl::Status TrainingState::AddColumnParallel(const std::string& prefix,
                                              ColumnParallelLinear& layer) {
  VEMESH_ASSIGN_OR_RETURN(std::vector<ParameterPlacement> placements,
                          ColumnParallelPlacements(prefix, layer));
  return AddParameters(layer.parameters(), std::move(placements));
}

absl::Status TrainingState::AddRowParallel(const std::string& prefix,
                                           RowParallelLinear& layer) {
  VEMESH_ASSIGN_OR_RETURN(std::vector<ParameterPlacement> placements,
                          RowParallelPlacements(prefix, layer));
  return AddParameters(layer.parameters(), std::move(placements));
}

absl::StatusOr<size_t> TrainingState::Find(const Parameter* p,
                                           const char* who) const {
  if (p == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("state dict: ", who, " has a null parameter"));
  }
  auto it = index_.find(p);
  if (it == index_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("state dict: ", who, " holds parameter '", p->name,
                     "', which was not added (AddParameter names it first)"));
  }
  return it->second;
}

absl::Status TrainingState::MarkStepped(size_t index, const char* who) {
  Param& p = params_[index];
  if (p.stepped) {
    return absl::InvalidArgumentError(
        absl::StrCat("state dict: ", who, " steps '", p.placement.name,
                     "', which another optimizer already steps"));
  }
  p.stepped = true;
  return absl::OkStatus();
}

absl::Status TrainingState::AddOptimizer(Optimizer& optimizer) {
  std::vector<size_t> indexes;
  for (const Parameter* p : optimizer.params()) {
    VEMESH_ASSIGN_OR_RETURN(size_t i, Find(p, "an optimizer"));
    indexes.push_back(i);
  }
  for (size_t i : indexes) {
    VEMESH_RETURN_IF_ERROR(MarkStepped(i, "an optimizer"));
  }
  optimizers_.push_back(&optimizer);
  return absl::OkStatus();
}

absl::Status TrainingState::AddDistributedOptimizer(
    DistributedOptimizer& zero, std::vector<Parameter*> params) {
  Zero z{&zero, {}};
  int64_t total = 0;
  for (const Parameter* p : params) {
    VEMESH_ASSIGN_OR_RETURN(size_t i, Find(p, "a DistributedOptimizer"));
    z.params.push_back(i);
    total += params_[i].placement.numel();
  }
  if (static_cast<size_t>(total) != zero.elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state dict: a DistributedOptimizer over ", zero.elements(),
        " values, given ", params.size(), " parameters of ", total,
        " values: expected the list its Create was given"));
  }
  for (size_t i : z.params) {
    VEMESH_RETURN_IF_ERROR(MarkStepped(i, "a DistributedOptimizer"));
  }
  zeros_.push_back(std::move(z));
  return absl::OkStatus();
}

absl::Status TrainingState::AddFsdp(
    FullyShardedDataParallel& fsdp,
    std::vector<std::vector<Parameter*>> units) {
  if (units.size() != fsdp.num_units()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state dict: an FSDP module of ", fsdp.num_units(), " units, given ",
        units.size(), " lists of parameters: expected one per unit"));
  }
  Fsdp f{&fsdp, {}};
  for (size_t u = 0; u < units.size(); ++u) {
    std::vector<size_t>& unit = f.units.emplace_back();
    int64_t total = 0;
    for (const Parameter* p : units[u]) {
      VEMESH_ASSIGN_OR_RETURN(size_t i, Find(p, "an FSDP unit"));
      if (params_[i].fsdp) {
        return absl::InvalidArgumentError(
            absl::StrCat("state dict: '", params_[i].placement.name,
                         "' is in two FSDP units"));
      }
      unit.push_back(i);
      total += params_[i].placement.numel();
    }
    if (static_cast<size_t>(total) != fsdp.unit_elements(u)) {
      return absl::InvalidArgumentError(
          absl::StrCat("state dict: FSDP unit '", fsdp.unit_name(u), "' has ",
                       fsdp.unit_elements(u),
                       " values; its parameters' boxes hold ", total));
    }
    for (size_t i : unit) params_[i].fsdp = true;
  }
  // Its optimizers (SetOptimizer) step every unit's parameters.
  for (const std::vector<size_t>& unit : f.units) {
    for (size_t i : unit) {
      VEMESH_RETURN_IF_ERROR(MarkStepped(i, "an FSDP module"));
    }
  }
  fsdps_.push_back(std::move(f));
  return absl::OkStatus();
}

std::vector<ParameterPlacement> TrainingState::Placements(
    absl::Span<const size_t> indexes) const {
  std::vector<ParameterPlacement> out;
  for (size_t i : indexes) out.push_back(params_[i].placement);
  return out;
}

absl::Status TrainingState::CheckValue(const Param& p, bool allow_freed) const {
  const Matrix& v = p.param->value;
  const std::vector<int64_t>& want = p.placement.box.lengths;
  if (v.rows() == want[0] && v.cols() == want[1]) return absl::OkStatus();
  // Freed (0 x 0) by FSDP, or an empty piece.
  if (v.size() == 0 && (allow_freed || p.placement.numel() == 0)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "state dict: parameter '", p.placement.name, "' is ", v.rows(), "x",
      v.cols(), " on this rank; its box ",
      checkpoint::BoxToString(p.placement.box), " is ", want[0], "x", want[1],
      v.size() == 0 ? " (freed: add the FSDP module that holds it)" : ""));
}

// All of an Optimizer's parameters step together: one count.
absl::Status TrainingState::SyncStepCount(Optimizer& opt) {
  for (size_t k = 1; k < opt.params().size(); ++k) {
    if (opt.flat(k).step_count() != opt.flat(0).step_count()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state dict: one optimizer steps '", opt.params()[0]->name,
          "' (step ", opt.flat(0).step_count(), ") and '",
          opt.params()[k]->name, "' (step ", opt.flat(k).step_count(),
          "): expected one step count"));
    }
  }
  if (!opt.params().empty()) opt.set_step_count(opt.flat(0).step_count());
  return absl::OkStatus();
}

absl::Status TrainingState::AddRun(absl::Span<const size_t> indexes,
                                   int64_t begin, int64_t count, double* data,
                                   const std::string& suffix,
                                   StateDict* dict) const {
  const std::vector<ParameterPlacement> placements = Placements(indexes);
  VEMESH_ASSIGN_OR_RETURN(std::vector<FlatRunPiece> pieces,
                          FlatRunPieces(placements, begin, count));
  for (FlatRunPiece& piece : pieces) {
    const ParameterPlacement& p = placements[piece.placement];
    VEMESH_RETURN_IF_ERROR(dict->Add(p.name + suffix, DType::kF64,
                                     p.global_shape, std::move(piece.box),
                                     data + piece.offset));
  }
  return absl::OkStatus();
}

std::vector<TrainingState::Run> TrainingState::Runs() const {
  std::vector<Run> runs;
  for (Optimizer* opt : optimizers_) {
    for (size_t k = 0; k < opt->params().size(); ++k) {
      const size_t i = index_.at(opt->params()[k]);
      runs.push_back({&opt->flat(k),
                      {i},
                      0,
                      params_[i].placement.numel(),
                      params_[i].placement.name});
    }
  }
  for (size_t z = 0; z < zeros_.size(); ++z) {
    DistributedOptimizer& zero = *zeros_[z].zero;
    const int64_t total = static_cast<int64_t>(zero.elements());
    const int64_t begin =
        static_cast<int64_t>(zero.shard_size()) * zero.dp_rank();
    // The last shards are padding past the values: not state.
    const int64_t count = std::clamp<int64_t>(
        total - begin, 0, static_cast<int64_t>(zero.shard_size()));
    runs.push_back({&zero.shard_optimizer(), zeros_[z].params,
                    std::min(begin, total), count, absl::StrCat("zero", z)});
  }
  for (const Fsdp& f : fsdps_) {
    for (size_t u = 0; u < f.units.size(); ++u) {
      FlatOptimizer* opt = f.module->optimizer(u);
      if (opt == nullptr) continue;
      runs.push_back({opt, f.units[u],
                      static_cast<int64_t>(f.module->shard_elements(u)) *
                          f.module->shard_rank(),
                      static_cast<int64_t>(opt->size()),
                      "fsdp." + f.module->unit_name(u)});
    }
  }
  return runs;
}

absl::Status TrainingState::get_state_dict(StateDict* dict,
                                           StateDictParts parts) {
  // A kModel dict lists no step counts: set_state_dict leaves them.
  steps_.clear();
  if (parts != StateDictParts::kOptimizer) {
    for (Param& p : params_) {
      if (p.fsdp) continue;
      VEMESH_RETURN_IF_ERROR(CheckValue(p, /*allow_freed=*/false));
      VEMESH_RETURN_IF_ERROR(dict->Add(p.placement.name, DType::kF64,
                                       p.placement.global_shape,
                                       p.placement.box, p.param->value.data()));
    }
    for (const Fsdp& f : fsdps_) {
      for (size_t u = 0; u < f.units.size(); ++u) {
        absl::Span<double> shard = f.module->mutable_local_shard(u);
        const int64_t begin =
            static_cast<int64_t>(f.module->shard_elements(u)) *
            f.module->shard_rank();
        VEMESH_RETURN_IF_ERROR(AddRun(f.units[u], begin,
                                      static_cast<int64_t>(shard.size()),
                                      shard.data(), "", dict));
      }
    }
  }
  if (parts == StateDictParts::kModel) return absl::OkStatus();
  const std::vector<Run> runs = Runs();
  steps_.reserve(runs.size());  // the pieces point into each vector
  for (const Run& run : runs) {
    for (auto& [state, span] : run.optimizer->mutable_state()) {
      // (A ZeRO shard's state runs on over its padding: not state.)
      if (static_cast<int64_t>(span.size()) < run.count) {
        return absl::InternalError(absl::StrCat(
            "state dict: the optimizer of '", run.name, "' keeps ", span.size(),
            " values of ", state, "; its run has ", run.count));
      }
      VEMESH_RETURN_IF_ERROR(AddRun(run.params, run.begin, run.count,
                                    span.data(), "." + state, dict));
    }
    std::vector<int64_t>& steps =
        steps_.emplace_back(run.params.size(), run.optimizer->step_count());
    for (size_t k = 0; k < run.params.size(); ++k) {
      VEMESH_RETURN_IF_ERROR(
          dict->Add(params_[run.params[k]].placement.name + ".step",
                    DType::kI64, {}, Box{}, &steps[k]));
    }
  }
  return absl::OkStatus();
}

absl::Status TrainingState::set_state_dict() {
  const std::vector<Run> runs = Runs();
  if (steps_.size() != runs.size()) {
    // The last get_state_dict listed no optimizer state (kModel).
    return absl::OkStatus();
  }
  for (size_t r = 0; r < runs.size(); ++r) {
    const std::vector<int64_t>& steps = steps_[r];
    for (size_t k = 1; k < steps.size(); ++k) {
      if (steps[k] != steps[0]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "state dict: one optimizer (", runs[r].name, ") steps '",
            params_[runs[r].params[0]].placement.name, "' (step ", steps[0],
            ") and '", params_[runs[r].params[k]].placement.name, "' (step ",
            steps[k], "): expected one step count"));
      }
    }
  }
  for (size_t r = 0; r < runs.size(); ++r) {
    if (!steps_[r].empty()) runs[r].optimizer->set_step_count(steps_[r][0]);
  }
  for (Optimizer* opt : optimizers_) {
    VEMESH_RETURN_IF_ERROR(SyncStepCount(*opt));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ElasticStateEntry>> TrainingState::elastic_state() {
  std::vector<ElasticStateEntry> entries;
  for (Param& p : params_) {
    if (p.fsdp) continue;
    VEMESH_RETURN_IF_ERROR(CheckValue(p, /*allow_freed=*/false));
    Parameter* param = p.param;
    entries.push_back(LiveBytes(p.placement.name, [param] {
      return Bytes(param->value.data(),
                   static_cast<size_t>(param->value.size()));
    }));
  }
  for (const Fsdp& f : fsdps_) {
    FullyShardedDataParallel* module = f.module;
    for (size_t u = 0; u < f.units.size(); ++u) {
      entries.push_back(LiveBytes("fsdp." + module->unit_name(u), [module, u] {
        absl::Span<double> s = module->mutable_local_shard(u);
        return Bytes(s.data(), s.size());
      }));
    }
  }
  const std::vector<Run> runs = Runs();
  for (const Run& run : runs) {
    const std::vector<std::pair<std::string, absl::Span<double>>> states =
        run.optimizer->mutable_state();
    for (size_t k = 0; k < states.size(); ++k) {
      // Through the optimizer each time: the buffers are its own.
      FlatOptimizer* opt = run.optimizer;
      entries.push_back(LiveBytes(run.name + "." + states[k].first, [opt, k] {
        absl::Span<double> s = opt->mutable_state()[k].second;
        return Bytes(s.data(), s.size());
      }));
    }
  }
  if (!runs.empty()) {
    std::vector<FlatOptimizer*> opts;
    for (const Run& run : runs) opts.push_back(run.optimizer);
    std::vector<Optimizer*> whole = optimizers_;
    ElasticStateEntry steps;
    steps.name = "optimizer.steps";
    steps.state_dict = [opts]() -> absl::StatusOr<std::string> {
      std::string bytes;
      for (const FlatOptimizer* o : opts) {
        const int64_t t = o->step_count();
        bytes.append(reinterpret_cast<const char*>(&t), sizeof(t));
      }
      return bytes;
    };
    steps.load_state_dict = [opts, whole](absl::string_view bytes) {
      if (bytes.size() != opts.size() * sizeof(int64_t)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer.steps: ", bytes.size(), " bytes, expected ",
            opts.size() * sizeof(int64_t), " (", opts.size(), " optimizers)"));
      }
      for (size_t i = 0; i < opts.size(); ++i) {
        int64_t t = 0;
        std::memcpy(&t, bytes.data() + i * sizeof(t), sizeof(t));
        opts[i]->set_step_count(t);
      }
      for (Optimizer* o : whole) {
        VEMESH_RETURN_IF_ERROR(SyncStepCount(*o));
      }
      return absl::OkStatus();
    };
    entries.push_back(std::move(steps));
  }
  absl::flat_hash_set<std::string> seen;
  for (const ElasticStateEntry& e : entries) {
    if (!seen.insert(e.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("state dict: two elastic state entries are named '",
                       e.name, "' (a parameter named like an FSDP unit or ",
                       "optimizer entry?): expected unique names"));
    }
  }
  return entries;
}

}  // namespace vemesh::strategies
