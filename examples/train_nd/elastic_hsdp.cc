#include "elastic_hsdp.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "synthetic_data.h"
#include "train_step.h"
#include "vemesh/registry/ve_device_mesh.h"
#include "vemesh/strategies/pipeline_runner.h"

namespace train_nd {

using vemesh::strategies::FullyShardedDataParallel;
using vemesh::strategies::Parameter;

absl::StatusOr<std::unique_ptr<ElasticHsdp>> ElasticHsdp::Create(
    const TrainPlan& plan, ParallelMlpStage* stage) {
  if (plan.dp_replicate == 0 || plan.dp_shard == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--mesh=", plan.options.mesh,
                     ": an elastic HSDP job needs DP_REPLICATE and DP_SHARD"));
  }
  std::unique_ptr<ElasticHsdp> h(new ElasticHsdp(stage));
  for (const std::vector<Parameter*>& unit : stage->layer_parameters()) {
    auto& shapes = h->shapes_.emplace_back();
    for (const Parameter* p : unit) {
      shapes.emplace_back(p->value.rows(), p->value.cols());
    }
  }
  if (absl::Status s = h->Build(nullptr); !s.ok()) return s;
  return h;
}

absl::Status ElasticHsdp::Build(const Shards* carry) {
  fsdp_.reset();
  absl::StatusOr<vemesh::DeviceMesh> mesh = VESCALE_DEVICE_MESH.get();
  if (!mesh.ok()) return mesh.status();
  absl::StatusOr<std::shared_ptr<vemesh::Communicator>> r =
      mesh->get_group("DP_REPLICATE");
  if (!r.ok()) return r.status();
  absl::StatusOr<std::shared_ptr<vemesh::Communicator>> s =
      mesh->get_group("DP_SHARD");
  if (!s.ok()) return s.status();
  replicate_ = *r;
  shard_ = *s;
  // The replica's own DP_SHARD mesh: Create agrees over it alone, so a
  // rebuild involves no other replica.
  absl::StatusOr<vemesh::DeviceMesh> shard_mesh =
      mesh->slice(std::vector<std::string>{"DP_SHARD"});
  if (!shard_mesh.ok()) return shard_mesh.status();
  std::vector<vemesh::strategies::FsdpUnit> units;
  std::vector<std::vector<Parameter*>> layers = stage_->layer_parameters();
  for (size_t u = 0; u < layers.size(); ++u) {
    if (carry != nullptr) {
      // Any values of the right shapes: the carried shards replace them.
      for (size_t k = 0; k < layers[u].size(); ++k) {
        layers[u][k]->value =
            Matrix::Zero(shapes_[u][k].first, shapes_[u][k].second);
      }
    }
    units.push_back({absl::StrCat("unit", u), std::move(layers[u])});
  }
  absl::StatusOr<FullyShardedDataParallel> f = FullyShardedDataParallel::Create(
      *shard_mesh, std::move(units),
      {.sharding_strategy = vemesh::strategies::ShardingStrategy::kFullShard,
       .shard_dims = {"DP_SHARD"}});
  if (!f.ok()) return f.status();
  fsdp_.emplace(*std::move(f));
  if (carry != nullptr) RestoreShards(*carry);
  return absl::OkStatus();
}

absl::Status ElasticHsdp::Rebuild(const TrainPlan& plan) {
  (void)plan;
  const Shards carry = SaveShards();
  return Build(&carry);
}

absl::StatusOr<double> ElasticHsdp::Step(
    const TrainPlan& plan, int step,
    const std::function<void(const char*)>& fault) {
  FullyShardedDataParallel& f = *fsdp_;
  f.ZeroGrad();
  // A failed step may have left its loss sum behind.
  (void)stage_->TakeSquaredError();
  stage_->SetBatch(
      MakeBatch(plan.options.seed, step, plan.shape, plan.options.batch));
  fault("tp");
  // Every unit gathered for the whole step (the pipeline interleaves
  // micro-batches), as the static FSDP path does.
  for (size_t u = f.num_units(); u-- > 0;) {
    if (absl::Status s = f.PreBackward(u); !s.ok()) return s;
  }
  auto ran = vemesh::strategies::RunPipeline(
      *stage_, {plan.schedule, plan.options.micro_batches});
  if (!ran.ok()) return ran.status();
  for (size_t u = f.num_units(); u-- > 0;) {
    if (absl::Status s = f.PostBackward(u); !s.ok()) return s;
  }
  // Gradient shards averaged over DP_SHARD (the module's only group).
  if (absl::Status s = f.FinishBackward(); !s.ok()) return s;
  auto sse = PipelineSquaredError(stage_->TakeSquaredError());
  if (!sse.ok()) return sse.status();
  double replica_sse = *sse;
  if (shard_->size() > 1) {
    if (absl::Status s = shard_->all_reduce(absl::MakeSpan(&replica_sse, 1),
                                            vemesh::ReduceOp::kSum);
        !s.ok()) {
      return s;
    }
  }
  // The only operation over DP_REPLICATE: every gradient shard and the
  // loss, summed in one all_reduce.
  fault("dp");
  fault("stop");
  std::vector<double> sum;
  for (size_t u = 0; u < f.num_units(); ++u) {
    absl::Span<const double> g = f.local_grad_shard(u);
    sum.insert(sum.end(), g.begin(), g.end());
  }
  sum.push_back(replica_sse);
  if (replicate_->size() > 1) {
    if (absl::Status s =
            replicate_->all_reduce(absl::MakeSpan(sum), vemesh::ReduceOp::kSum);
        !s.ok()) {
      return s;
    }
  }
  const double lr = plan.options.lr;
  const double scale = 1.0 / static_cast<double>(replicate_->size());
  size_t at = 0;
  absl::Status stepped =
      f.Step([&](size_t, absl::Span<double> value, absl::Span<const double>) {
        for (double& v : value) v -= lr * sum[at++] * scale;
        return absl::OkStatus();
      });
  if (!stepped.ok()) return stepped;
  f.ZeroGrad();
  return sum.back() /
         static_cast<double>(plan.options.batch * plan.shape.output_dim);
}

ElasticHsdp::Shards ElasticHsdp::SaveShards() const {
  Shards out;
  for (size_t u = 0; u < fsdp_->num_units(); ++u) {
    absl::Span<const double> s = fsdp_->local_shard(u);
    out.emplace_back(s.begin(), s.end());
  }
  return out;
}

void ElasticHsdp::RestoreShards(const Shards& saved) {
  for (size_t u = 0; u < fsdp_->num_units() && u < saved.size(); ++u) {
    absl::Span<double> s = fsdp_->mutable_local_shard(u);
    for (size_t i = 0; i < s.size() && i < saved[u].size(); ++i) {
      s[i] = saved[u][i];
    }
  }
}

std::string ElasticHsdp::State() const {
  std::string bytes;
  for (size_t u = 0; u < fsdp_->num_units(); ++u) {
    absl::Span<const double> s = fsdp_->local_shard(u);
    bytes.append(reinterpret_cast<const char*>(s.data()),
                 s.size() * sizeof(double));
  }
  return bytes;
}

absl::Status ElasticHsdp::LoadState(absl::string_view bytes) {
  size_t total = 0;
  for (size_t u = 0; u < fsdp_->num_units(); ++u) {
    total += fsdp_->local_shard(u).size() * sizeof(double);
  }
  if (bytes.size() != total) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter shards: ", bytes.size(), " bytes, expected ", total));
  }
  size_t at = 0;
  for (size_t u = 0; u < fsdp_->num_units(); ++u) {
    absl::Span<double> s = fsdp_->mutable_local_shard(u);
    std::memcpy(s.data(), bytes.data() + at, s.size() * sizeof(double));
    at += s.size() * sizeof(double);
  }
  return absl::OkStatus();
}

absl::Span<char> ElasticHsdp::ShardBytes(size_t u) {
  if (!fsdp_.has_value() || u >= fsdp_->num_units()) return {};
  absl::Span<double> s = fsdp_->mutable_local_shard(u);
  return absl::MakeSpan(reinterpret_cast<char*>(s.data()),
                        s.size() * sizeof(double));
}

void ElasticHsdp::Corrupt(double delta) {
  for (size_t u = 0; u < fsdp_->num_units(); ++u) {
    absl::Span<double> s = fsdp_->mutable_local_shard(u);
    if (!s.empty()) {
      s[0] += delta;
      return;
    }
  }
}

int64_t ElasticHsdp::Digest() const {
  uint64_t h = 1469598103934665603ull;
  const std::string bytes = State();
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return static_cast<int64_t>(h >> 1);
}

}  // namespace train_nd
