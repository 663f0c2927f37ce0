#include "checkpoint_state.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace train_nd {
namespace {

using vemesh::checkpoint::Box;
using vemesh::checkpoint::DType;
using vemesh::checkpoint::StateDict;
using vemesh::strategies::FlatOptimizer;
using vemesh::strategies::Parameter;

// One tensor of the serial model and the block of it this rank holds.
struct Block {
  std::string name;
  std::vector<int64_t> global_shape;  // rows, cols
  Box box;                            // the local tensor, in global terms
  int64_t rows() const { return box.lengths[0]; }
  int64_t cols() const { return box.lengths[1]; }
  int64_t size() const { return rows() * cols(); }
};

// The weight and bias of layer `l` as TP rank `t` of `tp` holds them:
// column layers split the output features, row layers the input features
// (their bias stays whole), in equal blocks by TP rank.
std::vector<Block> LayerPieces(const MlpShape& shape, int l, int t, int tp) {
  const int64_t in = shape.in_features(l);
  const int64_t out = shape.out_features(l);
  const std::string name = absl::StrCat("layer", l);
  if (MlpShape::column_parallel(l)) {
    const int64_t n = out / tp;
    return {{name + ".weight", {in, out}, Box{{0, t * n}, {in, n}}},
            {name + ".bias", {1, out}, Box{{0, t * n}, {1, n}}}};
  }
  const int64_t n = in / tp;
  return {{name + ".weight", {in, out}, Box{{t * n, 0}, {n, out}}},
          {name + ".bias", {1, out}, Box{{0, 0}, {1, out}}}};
}

absl::Status AddWhole(const Block& piece, const std::string& suffix,
                      double* data, StateDict* dict) {
  return dict->Add(piece.name + suffix, DType::kF64, piece.global_shape,
                   piece.box, data);
}

// Adds the flat run [begin, begin + count) of the concatenation of
// `pieces` (each row-major, in order), whose values start at `data`, cut
// into boxes of each piece (FlatRangeToBoxes) shifted to global offsets.
absl::Status AddFlatRun(const std::vector<Block>& pieces, int64_t begin,
                        int64_t count, double* data, const std::string& suffix,
                        StateDict* dict) {
  const int64_t end = begin + count;
  int64_t at = 0;  // the current piece's first flat index
  for (const Block& p : pieces) {
    const int64_t lo = std::max(begin, at);
    const int64_t hi = std::min(end, at + p.size());
    if (lo < hi) {
      const std::vector<int64_t> local = {p.rows(), p.cols()};
      for (const Box& b :
           vemesh::checkpoint::FlatRangeToBoxes(local, lo - at, hi - at)) {
        if (b.lengths[0] == 0 || b.lengths[1] == 0) continue;
        const int64_t first = b.offsets[0] * p.cols() + b.offsets[1];
        Box global{
            {p.box.offsets[0] + b.offsets[0], p.box.offsets[1] + b.offsets[1]},
            b.lengths};
        if (absl::Status s =
                dict->Add(p.name + suffix, DType::kF64, p.global_shape,
                          std::move(global), data + (at + first - begin));
            !s.ok()) {
          return s;
        }
      }
    }
    at += p.size();
  }
  if (end > at) {
    return absl::InternalError(absl::StrCat("checkpoint: a flat shard [", begin,
                                            ", ", end, ") runs past the ", at,
                                            " values of its parameters"));
  }
  return absl::OkStatus();
}

// The optimizer state of a flat run, one AddFlatRun per state buffer.
absl::Status AddFlatState(const std::vector<Block>& pieces, int64_t begin,
                          FlatOptimizer& opt, StateDict* dict) {
  for (auto& [name, span] : opt.mutable_state()) {
    if (span.empty()) continue;
    if (absl::Status s =
            AddFlatRun(pieces, begin, static_cast<int64_t>(span.size()),
                       span.data(), "." + name, dict);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ShapeError(const std::string& name, int64_t rows, int64_t cols,
                        const Block& p) {
  return absl::InternalError(absl::StrCat(
      "checkpoint: '", name, "' is ", rows, "x", cols, " on this rank; the ",
      "plan says its TP block of '", p.name, "' is ", p.rows(), "x", p.cols()));
}

}  // namespace

absl::Status DescribeState(const TrainPlan& plan, const TrainingState& state,
                           StateParts parts, StateDict* dict) {
  ParallelMlpStage& stage = *state.stage;
  std::vector<std::vector<Block>> layers;  // per local layer
  std::vector<Block> all;                  // parameters() order
  for (int l = stage.first_layer(); l < stage.end_layer(); ++l) {
    layers.push_back(
        LayerPieces(plan.shape, l, stage.tp_rank(), stage.tp_size()));
    all.insert(all.end(), layers.back().begin(), layers.back().end());
  }
  const bool params = parts != StateParts::kOptimizer;
  const bool optimizer = parts != StateParts::kParameters;
  if (state.fsdp != nullptr && parts == StateParts::kParameters) {
    return absl::InvalidArgumentError(
        "checkpoint: load the parameters before FSDP shards them");
  }

  if (state.fsdp != nullptr) {
    vemesh::strategies::FullyShardedDataParallel& fsdp = *state.fsdp;
    if (fsdp.num_units() != layers.size()) {
      return absl::InternalError(
          absl::StrCat("checkpoint: FSDP has ", fsdp.num_units(),
                       " units; the stage has ", layers.size(), " layers"));
    }
    for (size_t u = 0; u < layers.size(); ++u) {
      int64_t numel = 0;
      for (const Block& p : layers[u]) numel += p.size();
      if (static_cast<int64_t>(fsdp.unit_elements(u)) != numel) {
        return absl::InternalError(absl::StrCat(
            "checkpoint: FSDP unit '", fsdp.unit_name(u), "' has ",
            fsdp.unit_elements(u), " values; its layer has ", numel));
      }
      const int64_t begin =
          static_cast<int64_t>(fsdp.shard_elements(u)) * fsdp.shard_rank();
      absl::Span<const double> shard = fsdp.local_shard(u);
      if (params && !shard.empty()) {
        // Save only reads it (kParameters is refused above).
        if (absl::Status s =
                AddFlatRun(layers[u], begin, static_cast<int64_t>(shard.size()),
                           const_cast<double*>(shard.data()), "", dict);
            !s.ok()) {
          return s;
        }
      }
      if (optimizer && fsdp.optimizer(u) != nullptr) {
        if (absl::Status s =
                AddFlatState(layers[u], begin, *fsdp.optimizer(u), dict);
            !s.ok()) {
          return s;
        }
      }
    }
  } else {
    std::vector<Parameter*> ps = stage.parameters();
    if (ps.size() != all.size()) {
      return absl::InternalError(
          absl::StrCat("checkpoint: the stage has ", ps.size(),
                       " parameters; its layers ", all.size()));
    }
    for (size_t i = 0; i < ps.size(); ++i) {
      if (ps[i]->value.rows() != all[i].rows() ||
          ps[i]->value.cols() != all[i].cols()) {
        return ShapeError(ps[i]->name, ps[i]->value.rows(), ps[i]->value.cols(),
                          all[i]);
      }
      if (params) {
        if (absl::Status s = AddWhole(all[i], "", ps[i]->value.data(), dict);
            !s.ok()) {
          return s;
        }
      }
      if (optimizer && state.local_optimizer != nullptr) {
        if (absl::Status s =
                AddFlatState({all[i]}, 0, state.local_optimizer->flat(i), dict);
            !s.ok()) {
          return s;
        }
      }
    }
    if (optimizer && state.zero != nullptr) {
      vemesh::strategies::DistributedOptimizer& zero = *state.zero;
      int64_t total = 0;
      for (const Block& p : all) total += p.size();
      const int64_t begin =
          static_cast<int64_t>(zero.shard_size()) * zero.dp_rank();
      // The last shards are padding past the values: not state.
      const int64_t count = std::max<int64_t>(
          0, std::min<int64_t>(static_cast<int64_t>(zero.shard_size()),
                               total - begin));
      for (auto& [name, span] : zero.shard_optimizer().mutable_state()) {
        if (count == 0) break;
        if (absl::Status s =
                AddFlatRun(all, begin, count, span.data(), "." + name, dict);
            !s.ok()) {
          return s;
        }
      }
    }
  }

  // The experts: whole, one owner each, named by their global index.
  std::vector<Parameter*> experts = stage.expert_parameters();
  for (size_t i = 0; i < experts.size(); ++i) {
    Parameter& p = *experts[i];
    Block piece{p.name,
                {p.value.rows(), p.value.cols()},
                Box{{0, 0}, {p.value.rows(), p.value.cols()}}};
    if (params) {
      if (absl::Status s = AddWhole(piece, "", p.value.data(), dict); !s.ok()) {
        return s;
      }
    }
    if (optimizer && state.expert_optimizer != nullptr) {
      if (absl::Status s =
              AddFlatState({piece}, 0, state.expert_optimizer->flat(i), dict);
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

std::string ModelFingerprint(const TrainPlan& plan) {
  const TrainOptions& o = plan.options;
  return absl::StrFormat(
      "mlp input_dim=%d hidden=%d output_dim=%d layers=%d experts=%d seed=%d "
      "batch=%d optimizer=%s lr=%.17g",
      o.input_dim, o.hidden, o.output_dim, o.layers, o.experts, o.seed, o.batch,
      vemesh::strategies::OptimizerKindName(plan.optimizer.kind), o.lr);
}

void SetStateMetadata(const TrainPlan& plan, int64_t step, StateDict* dict) {
  dict->SetMetadata("step", absl::StrCat(step));
  // The next batch to train on: MakeBatch(seed, step).
  dict->SetMetadata("data_position", absl::StrCat(step));
  dict->SetMetadata("model", ModelFingerprint(plan));
}

absl::Status CheckResumable(
    const TrainPlan& plan, const std::string& path, int64_t step,
    const absl::flat_hash_map<std::string, std::string>& metadata) {
  const std::string want = ModelFingerprint(plan);
  auto model = metadata.find("model");
  if (model == metadata.end() || model->second != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint '", path, "' is of another model or training: it holds '",
        model == metadata.end() ? "(no model metadata)" : model->second,
        "'; this run is '", want, "'"));
  }
  auto position = metadata.find("data_position");
  if (position == metadata.end() || position->second != absl::StrCat(step)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint '", path, "' at step ", step, " has data_position '",
        position == metadata.end() ? "(none)" : position->second,
        "'; expected ", step));
  }
  if (step >= plan.options.steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("--steps=", plan.options.steps, " but checkpoint '", path,
                     "' is at step ", step,
                     ": nothing left to train; expected --steps > ", step));
  }
  return absl::OkStatus();
}

}  // namespace train_nd
