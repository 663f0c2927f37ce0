#include "parallel_mlp_stage.h"

#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "vemesh/registry/ve_device_mesh.h"
#include "vemesh/strategies/expert_mesh.h"
#include "vemesh/strategies/role_group.h"

namespace train_nd {

using vemesh::strategies::ColumnParallelLinear;
using vemesh::strategies::ExpertInit;
using vemesh::strategies::ExpertParallelMoe;
using vemesh::strategies::Parameter;
using vemesh::strategies::RoleGroup;
using vemesh::strategies::RoleGroupFrom;
using vemesh::strategies::RowParallelLinear;

ParallelMlpStage::ParallelMlpStage(const TrainPlan& plan, MlpShape::Range range,
                                   int64_t dp_rank, int tp_size)
    : plan_(plan),
      range_(range),
      dp_rank_(dp_rank),
      tp_size_(tp_size),
      inputs_(plan.options.micro_batches) {
  moe_in_.resize(plan.options.micro_batches);
  moe_dispatch_.resize(plan.options.micro_batches);
}

absl::Status ParallelMlpStage::Rebind(const TrainPlan& plan) {
  absl::StatusOr<int64_t> dp_rank =
      VESCALE_DEVICE_MESH.get_data_parallel_rank();
  if (!dp_rank.ok()) return dp_rank.status();
  plan_ = plan;
  dp_rank_ = *dp_rank;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ParallelMlpStage>> ParallelMlpStage::Create(
    const TrainPlan& plan) {
  absl::StatusOr<int64_t> pp_rank =
      VESCALE_DEVICE_MESH.get_pipeline_parallel_rank();
  if (!pp_rank.ok()) return pp_rank.status();
  absl::StatusOr<int64_t> pp_size = VESCALE_DEVICE_MESH.get_role_size("PP");
  if (!pp_size.ok()) return pp_size.status();
  absl::StatusOr<int64_t> dp_rank =
      VESCALE_DEVICE_MESH.get_data_parallel_rank();
  if (!dp_rank.ok()) return dp_rank.status();
  absl::StatusOr<int64_t> tp_size = VESCALE_DEVICE_MESH.get_role_size("TP");
  if (!tp_size.ok()) return tp_size.status();
  absl::StatusOr<int64_t> tp_rank =
      VESCALE_DEVICE_MESH.get_tensor_parallel_rank();
  if (!tp_rank.ok()) return tp_rank.status();

  const MlpShape& shape = plan.shape;
  const MlpShape::Range range = shape.stage_layers(static_cast<int>(*pp_rank),
                                                   static_cast<int>(*pp_size));
  std::unique_ptr<ParallelMlpStage> stage(
      new ParallelMlpStage(plan, range, *dp_rank, static_cast<int>(*tp_size)));
  stage->tp_rank_ = static_cast<int>(*tp_rank);
  if (shape.experts > 0) {
    // Expert folding (issue 45): the experts' own mesh over the same
    // ranks, "experts" = (PP, EDP, EP), EP contiguous ranks of a stage's DP
    // x TP (DP may be DP_REPLICATE x DP_SHARD: FSDP shards only the
    // replicated layers; the experts stay whole), EDP its replicas. Every
    // rank takes part (collective over the world), also those of stages
    // without the block. EP = DP x TP by default: the groups of the
    // flattening DP x TP, one owner per expert.
    const int64_t ep_size = plan.options.expert_parallel > 0
                                ? plan.options.expert_parallel
                                : int64_t{plan.dp} * plan.tp;
    absl::StatusOr<vemesh::DeviceMesh> experts =
        vemesh::strategies::FoldExpertMesh(VESCALE_DEVICE_MESH, ep_size);
    if (!experts.ok()) return experts.status();
    absl::StatusOr<vemesh::strategies::ExpertGroups> groups =
        vemesh::strategies::ExpertGroupsOf(VESCALE_DEVICE_MESH);
    if (!groups.ok()) return groups.status();
    std::shared_ptr<vemesh::Communicator> ep = groups->ep;
    stage->expert_edp_ = groups->edp;
    if (range.begin <= MlpShape::kMoeLayer && MlpShape::kMoeLayer < range.end) {
      const int64_t width = shape.out_features(MlpShape::kMoeLayer);
      const uint64_t seed = plan.options.seed;
      absl::StatusOr<ExpertParallelMoe> moe =
          ExpertParallelMoe::Create("moe", shape.experts, ep, [&](int e) {
            return ExpertInit{InitialExpertWeight(seed, e, width),
                              InitialExpertBias(seed, e, width)};
          });
      if (!moe.ok()) return moe.status();
      stage->moe_.emplace(*std::move(moe));
    }
  }
  for (int l = range.begin; l < range.end; ++l) {
    const std::string name = absl::StrCat("layer", l);
    // An elastic job's replicas start equal (the library's fingerprint
    // check compares them from the first epoch on): replica 0's weights.
    const int64_t init = plan.options.elastic.empty() ? *dp_rank : 0;
    const Matrix w = InitialWeight(plan.options.seed, l, shape, init);
    const Matrix b = InitialBias(plan.options.seed, l, shape, init);
    if (MlpShape::column_parallel(l)) {
      // Gather only at the model's end: the loss needs the whole output.
      absl::StatusOr<ColumnParallelLinear> layer = ColumnParallelLinear::Create(
          name, w, b, {.gather_output = l + 1 == shape.layers});
      if (!layer.ok()) return layer.status();
      stage->layers_.emplace_back(*std::move(layer));
    } else {
      // A row layer always follows a column layer, whose output is split.
      absl::StatusOr<RowParallelLinear> layer =
          RowParallelLinear::Create(name, w, b, {.input_is_parallel = true});
      if (!layer.ok()) return layer.status();
      stage->layers_.emplace_back(*std::move(layer));
    }
  }
  return stage;
}

void ParallelMlpStage::SetBatch(const Batch& batch) {
  const int64_t rows = plan_.rows_per_replica;
  replica_.x = batch.x.middleRows(dp_rank_ * rows, rows);
  replica_.y = batch.y.middleRows(dp_rank_ * rows, rows);
  backwards_ = 0;
}

double ParallelMlpStage::TakeSquaredError() {
  return std::exchange(squared_error_, 0.0);
}

std::vector<Parameter*> ParallelMlpStage::parameters() {
  std::vector<Parameter*> params;
  for (Layer& layer : layers_) {
    std::visit(
        [&](auto& l) {
          for (Parameter* p : l.parameters()) params.push_back(p);
        },
        layer);
  }
  return params;
}

std::vector<std::vector<Parameter*>> ParallelMlpStage::layer_parameters() {
  std::vector<std::vector<Parameter*>> units;
  for (Layer& layer : layers_) {
    std::visit([&](auto& l) { units.push_back(l.parameters()); }, layer);
  }
  return units;
}

std::vector<Parameter*> ParallelMlpStage::expert_parameters() {
  if (!moe_.has_value()) return {};
  return moe_->parameters();
}

std::vector<vemesh::strategies::FsdpUnit> ParallelMlpStage::fsdp_units() {
  std::vector<vemesh::strategies::FsdpUnit> units;
  int l = range_.begin;
  for (std::vector<Parameter*>& ps : layer_parameters()) {
    units.push_back({absl::StrCat("layer", l++), std::move(ps)});
  }
  return units;
}

absl::Status ParallelMlpStage::NameParameters(
    vemesh::strategies::TrainingState* state) {
  int l = range_.begin;
  for (Layer& layer : layers_) {
    const std::string name = absl::StrCat("layer", l++);
    absl::Status s = std::visit(
        [&](auto& tp) {
          if constexpr (std::is_same_v<std::decay_t<decltype(tp)>,
                                       ColumnParallelLinear>) {
            return state->AddColumnParallel(name, tp);
          } else {
            return state->AddRowParallel(name, tp);
          }
        },
        layer);
    if (!s.ok()) return s;
  }
  return state->AddWholeParameters(expert_parameters());
}

std::pair<int64_t, int64_t> ParallelMlpStage::TpShare(int64_t rows) const {
  return {rows * tp_rank_ / tp_size_, rows * (tp_rank_ + 1) / tp_size_};
}

namespace {

// Every TP rank's share of the rows, in TP order (shares may differ by one
// row: all_gather_v).
absl::StatusOr<Matrix> GatherOverTp(const Matrix& share, int64_t rows) {
  absl::StatusOr<RoleGroup> tp =
      RoleGroupFrom(VESCALE_DEVICE_MESH.get_tensor_parallel_dim_groups(), "TP");
  if (!tp.ok()) return tp.status();
  if (tp->size == 1) return share;
  std::vector<size_t> counts(tp->size);
  for (int t = 0; t < tp->size; ++t) {
    counts[t] = static_cast<size_t>(
        (rows * (t + 1) / tp->size - rows * t / tp->size) * share.cols());
  }
  Matrix all(rows, share.cols());
  absl::Status s = tp->comm->all_gather_v(share.data(), all.data(), counts,
                                          vemesh::DataType::kFloat64);
  if (!s.ok()) return s;
  return all;
}

}  // namespace

absl::StatusOr<Matrix> ParallelMlpStage::MoeForward(int mb, const Matrix& h) {
  const auto [begin, end] = TpShare(h.rows());
  // Routed by the row's index in the step's global batch, as the serial
  // reference routes it.
  std::vector<int64_t> ids;
  for (int64_t i = begin; i < end; ++i) {
    ids.push_back(dp_rank_ * plan_.rows_per_replica +
                  mb * plan_.rows_per_micro_batch + i);
  }
  absl::StatusOr<Matrix> y =
      moe_->Forward(h.middleRows(begin, end - begin),
                    vemesh::strategies::RouteByHash(ids, moe_->num_experts(),
                                                    plan_.options.seed),
                    &moe_dispatch_[mb]);
  if (!y.ok()) return y.status();
  absl::StatusOr<Matrix> all = GatherOverTp(*y, h.rows());
  if (!all.ok()) return all.status();
  moe_in_[mb] = h;
  return Matrix(h + *all);
}

absl::StatusOr<Matrix> ParallelMlpStage::MoeBackward(int mb,
                                                     const Matrix& grad) {
  const auto [begin, end] = TpShare(grad.rows());
  absl::StatusOr<Matrix> dx =
      moe_->Backward(moe_dispatch_[mb], grad.middleRows(begin, end - begin));
  if (!dx.ok()) return dx.status();
  absl::StatusOr<Matrix> all = GatherOverTp(*dx, grad.rows());
  if (!all.ok()) return all.status();
  moe_dispatch_[mb] = {};
  return Matrix(grad + *all);
}

int64_t ParallelMlpStage::InputRows(int) const {
  return plan_.rows_per_micro_batch;
}

int64_t ParallelMlpStage::InputCols() const {
  // A row layer takes its TP slice of the previous column layer's output.
  const int l = range_.begin;
  return MlpShape::column_parallel(l) ? plan_.shape.in_features(l)
                                      : plan_.shape.in_features(l) / tp_size_;
}

absl::StatusOr<Matrix> ParallelMlpStage::FirstStageInput(int mb) {
  return Matrix(replica_.x.middleRows(mb * plan_.rows_per_micro_batch,
                                      plan_.rows_per_micro_batch));
}

absl::StatusOr<Matrix> ParallelMlpStage::Forward(int mb, const Matrix& input) {
  std::vector<Matrix>& saved = inputs_[mb];
  saved.assign(1, input);
  for (size_t i = 0; i < layers_.size(); ++i) {
    absl::StatusOr<Matrix> y = std::visit(
        [&](const auto& l) { return l.Forward(saved.back()); }, layers_[i]);
    if (!y.ok()) return y.status();
    const int layer = range_.begin + static_cast<int>(i);
    if (plan_.shape.has_activation(layer)) {
      *y = y->array().tanh().matrix();
    }
    if (plan_.shape.has_moe(layer)) {
      y = MoeForward(mb, *y);
      if (!y.ok()) return y.status();
    }
    saved.push_back(*std::move(y));
  }
  return saved.back();
}

absl::StatusOr<Matrix> ParallelMlpStage::LossGradient(int mb,
                                                      const Matrix& output) {
  const Matrix target = replica_.y.middleRows(mb * plan_.rows_per_micro_batch,
                                              plan_.rows_per_micro_batch);
  const Matrix diff = output - target;
  squared_error_ += diff.squaredNorm();
  // d/d(output) of sum(diff^2) / (replica rows * outputs): this replica's
  // mean; DP averaging of the gradients makes it the global mean.
  const double count =
      static_cast<double>(plan_.rows_per_replica * plan_.shape.output_dim);
  return Matrix((2.0 / count) * diff);
}

absl::StatusOr<Matrix> ParallelMlpStage::Backward(int mb,
                                                  const Matrix& grad_output,
                                                  bool need_input_grad) {
  std::vector<Matrix>& saved = inputs_[mb];
  // The step's last backward makes every gradient of this stage final,
  // layer by layer.
  const bool last = ++backwards_ == plan_.options.micro_batches;
  Matrix grad = grad_output;
  for (int i = static_cast<int>(layers_.size()) - 1; i >= 0; --i) {
    const int layer = range_.begin + i;
    if (plan_.shape.has_moe(layer)) {
      absl::StatusOr<Matrix> g = MoeBackward(mb, grad);
      if (!g.ok()) return g.status();
      grad = *std::move(g);
      if (last) {
        // Each replica's loss gradient is its own mean; the experts saw
        // every replica's rows: 1/DP makes it the global mean.
        // EDP replicas of an expert saw their own EP group's rows: summed.
        std::vector<Parameter*> expert = moe_->parameters();
        absl::Status s =
            vemesh::strategies::SumExpertGradients(expert, expert_edp_.get());
        if (!s.ok()) return s;
        for (Parameter* p : expert) p->grad /= plan_.dp;
      }
    }
    if (plan_.shape.has_activation(layer)) {
      // tanh's output: the MoE block's input when there is one.
      const Matrix& t = plan_.shape.has_moe(layer) ? moe_in_[mb] : saved[i + 1];
      grad = (grad.array() * (1.0 - t.array().square())).matrix();
    }
    const bool need = i > 0 || need_input_grad;
    absl::StatusOr<Matrix> g = std::visit(
        [&](auto& l) { return l.Backward(saved[i], grad, need); }, layers_[i]);
    if (!g.ok()) return g.status();
    grad = *std::move(g);
    if (last && gradient_ready_) {
      std::vector<Parameter*> done =
          std::visit([](auto& l) { return l.parameters(); }, layers_[i]);
      for (Parameter* p : done) {
        absl::Status s = gradient_ready_(p);
        if (!s.ok()) return s;
      }
    }
  }
  if (plan_.shape.experts > 0) moe_in_[mb] = Matrix();
  saved.clear();  // this micro-batch is done
  return grad;
}

}  // namespace train_nd
