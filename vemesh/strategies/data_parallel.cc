#include "vemesh/strategies/data_parallel.h"

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/half.h"
#include "vemesh/registry/ve_device_mesh.h"
#include "vemesh/strategies/role_group.h"

namespace vemesh::strategies {
namespace {

// Which tensor of a Parameter a bucketed operation works on.
using Field = Matrix Parameter::*;

// Walks the concatenation of `field` over `params` in buckets of at most
// `bucket` doubles: copies a bucket in, runs `op` on it, copies it back.
// Returns the number of buckets.
absl::StatusOr<int> ForEachBucket(
    absl::Span<Parameter* const> params, Field field, size_t bucket,
    const std::function<absl::Status(absl::Span<double>)>& op) {
  std::vector<double> staging;
  staging.reserve(bucket);
  // Where each staged run of doubles came from, to copy it back.
  struct Run {
    double* data;
    size_t count;
  };
  std::vector<Run> runs;
  int buckets = 0;
  auto flush = [&]() -> absl::Status {
    if (staging.empty()) return absl::OkStatus();
    absl::Status s = op(absl::MakeSpan(staging));
    if (!s.ok()) return s;
    size_t offset = 0;
    for (const Run& run : runs) {
      std::copy_n(staging.data() + offset, run.count, run.data);
      offset += run.count;
    }
    staging.clear();
    runs.clear();
    ++buckets;
    return absl::OkStatus();
  };
  for (Parameter* p : params) {
    Matrix& m = p->*field;
    double* data = m.data();
    size_t left = static_cast<size_t>(m.size());
    while (left > 0) {
      const size_t take = std::min(left, bucket - staging.size());
      staging.insert(staging.end(), data, data + take);
      runs.push_back({data, take});
      data += take;
      left -= take;
      if (staging.size() == bucket) {
        VEMESH_RETURN_IF_ERROR(flush());
      }
    }
  }
  VEMESH_RETURN_IF_ERROR(flush());
  return buckets;
}

size_t TotalElements(absl::Span<Parameter* const> params, Field field) {
  size_t n = 0;
  for (const Parameter* p : params)
    n += static_cast<size_t>((p->*field).size());
  return n;
}

}  // namespace

// One step's gradient synchronisation: the bucket layout, which parameters
// are ready, and the reductions in flight.
struct DataParallel::Sync {
  // `count` gradient values of params[param] from element `offset` on.
  struct Piece {
    size_t param;
    size_t offset;
    size_t count;
  };
  struct Bucket {
    std::vector<Piece> pieces;
    size_t size = 0;
    int unready = 0;  // parameters with a piece here not yet marked ready
    // The staging buffer of the reduction: one of the two, by gradient type.
    std::vector<double> f64;
    std::vector<BFloat16> bf16;
    std::shared_ptr<Work> work;  // set once started asynchronously
    bool reduced = false;        // started (or, without overlap, done)

    // Copies this bucket's pieces of the gradients of `params` into the
    // staging buffer of `type`.
    void Stage(const std::vector<Parameter*>& params, GradientType type) {
      if (type == GradientType::kBFloat16) {
        bf16.clear();
        bf16.reserve(size);
      } else {
        f64.clear();
        f64.reserve(size);
      }
      for (const Piece& p : pieces) {
        const double* g = params[p.param]->grad.data() + p.offset;
        if (type == GradientType::kBFloat16) {
          for (size_t j = 0; j < p.count; ++j) {
            bf16.push_back(BFloat16(static_cast<float>(g[j])));
          }
        } else {
          f64.insert(f64.end(), g, g + p.count);
        }
      }
    }
  };

  RoleGroup dp;
  std::vector<Parameter*> params;
  absl::flat_hash_map<const Parameter*, size_t> index;
  std::vector<bool> ready;
  std::vector<std::vector<size_t>> buckets_of;  // per parameter
  std::vector<Bucket> buckets;
  size_t next = 0;  // the first bucket not started
  BucketStats stats;
};

DataParallel::DataParallel(DataParallelOptions options) : options_(options) {
  options_.bucket_elements = std::max<size_t>(options_.bucket_elements, 1);
}

DataParallel::~DataParallel() = default;

absl::StatusOr<BucketStats> DataParallel::BroadcastParameters(
    absl::Span<Parameter* const> params, int root) const {
  VEMESH_ASSIGN_OR_RETURN(RoleGroup dp, CurrentDataParallelGroup());
  if (root < 0 || root >= dp.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("BroadcastParameters root ", root,
                     ": expected a DP rank in [0, ", dp.size, ")"));
  }
  BucketStats stats{dp.size, TotalElements(params, &Parameter::value), 0};
  if (dp.size == 1) return stats;
  VEMESH_ASSIGN_OR_RETURN(
      int n, ForEachBucket(params, &Parameter::value, options_.bucket_elements,
                           [&](absl::Span<double> bucket) {
                             return dp.comm->broadcast(bucket, root);
                           }));
  stats.collectives = n;
  return stats;
}

absl::StatusOr<BucketStats> DataParallel::AverageGradients(
    absl::Span<Parameter* const> params) {
  VEMESH_RETURN_IF_ERROR(PrepareGradientSync(params));
  return FinishGradientSync();
}

absl::Status DataParallel::PrepareGradientSync(
    absl::Span<Parameter* const> params) {
  if (sync_ != nullptr) {
    return absl::FailedPreconditionError(
        "PrepareGradientSync: a gradient synchronisation is already open; "
        "call FinishGradientSync first");
  }
  VEMESH_ASSIGN_OR_RETURN(RoleGroup dp, CurrentDataParallelGroup());
  auto sync = std::make_unique<Sync>();
  sync->dp = std::move(dp);
  sync->params.assign(params.begin(), params.end());
  sync->ready.assign(params.size(), false);
  sync->buckets_of.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("PrepareGradientSync: parameter ", i, " is null"));
    }
    if (!sync->index.emplace(params[i], i).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("PrepareGradientSync: parameter ", i, " ('",
                       params[i]->name, "') is listed twice"));
    }
  }
  sync->stats = {sync->dp.size, TotalElements(params, &Parameter::grad), 0, 0};
  // Reverse order: the last layer's gradients are final first.
  const size_t cap = options_.bucket_elements;
  for (size_t k = params.size(); k-- > 0;) {
    const size_t n = static_cast<size_t>(params[k]->grad.size());
    for (size_t offset = 0; offset < n;) {
      if (sync->buckets.empty() || sync->buckets.back().size == cap) {
        sync->buckets.emplace_back();
      }
      Sync::Bucket& b = sync->buckets.back();
      const size_t take = std::min(n - offset, cap - b.size);
      b.pieces.push_back({k, offset, take});
      b.size += take;
      offset += take;
      if (sync->buckets_of[k].empty() ||
          sync->buckets_of[k].back() != sync->buckets.size() - 1) {
        sync->buckets_of[k].push_back(sync->buckets.size() - 1);
        ++b.unready;
      }
    }
  }
  sync_ = std::move(sync);
  return absl::OkStatus();
}

absl::Status DataParallel::MarkGradientReady(const Parameter* param) {
  if (sync_ == nullptr) {
    return absl::FailedPreconditionError(
        "MarkGradientReady: no gradient synchronisation is open; call "
        "PrepareGradientSync before the backward pass");
  }
  auto it = sync_->index.find(param);
  if (it == sync_->index.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("MarkGradientReady: parameter '",
                     param == nullptr ? std::string("(null)") : param->name,
                     "' is not one of the ", sync_->params.size(),
                     " parameters given to PrepareGradientSync"));
  }
  const size_t i = it->second;
  if (sync_->ready[i]) {
    return absl::InvalidArgumentError(
        absl::StrCat("MarkGradientReady: parameter '", param->name,
                     "' was already marked ready in this step"));
  }
  sync_->ready[i] = true;
  for (size_t b : sync_->buckets_of[i]) --sync_->buckets[b].unready;
  if (!options_.overlap || sync_->dp.size == 1) return absl::OkStatus();
  return StartReadyBuckets(*sync_);
}

// Starts, in bucket order, every bucket whose parameters are all ready.
absl::Status DataParallel::StartReadyBuckets(Sync& s) {
  // A look at what is in flight lets a backend without a progress thread
  // (MPI) move it on while the backward pass computes.
  for (size_t b = 0; b < s.next; ++b) {
    if (s.buckets[b].work != nullptr && !s.buckets[b].work->is_completed()) {
      s.buckets[b].work->test();
    }
  }
  while (s.next < s.buckets.size() && s.buckets[s.next].unready == 0) {
    Sync::Bucket& b = s.buckets[s.next];
    b.Stage(s.params, options_.gradient_type);
    Communicator::WorkOr w =
        options_.gradient_type == GradientType::kBFloat16
            ? s.dp.comm->iall_reduce(absl::MakeSpan(b.bf16), ReduceOp::kSum)
            : s.dp.comm->iall_reduce(absl::MakeSpan(b.f64), ReduceOp::kSum);
    if (!w.ok()) return w.status();
    b.work = *std::move(w);
    b.reduced = true;
    ++s.next;
  }
  return absl::OkStatus();
}

absl::StatusOr<BucketStats> DataParallel::FinishGradientSync() {
  if (sync_ == nullptr) {
    return absl::FailedPreconditionError(
        "FinishGradientSync: no gradient synchronisation is open; call "
        "PrepareGradientSync first");
  }
  std::unique_ptr<Sync> sync = std::move(sync_);
  Sync& s = *sync;
  if (s.dp.size == 1) return s.stats;
  s.stats.started_early = static_cast<int>(s.next);
  const absl::Time deadline = absl::Now() + s.dp.comm->timeout();

  absl::Status status;
  if (options_.overlap) {
    // Whatever the model did not announce is final now.
    for (size_t i = 0; i < s.params.size(); ++i) {
      if (s.ready[i]) continue;
      s.ready[i] = true;
      for (size_t b : s.buckets_of[i]) --s.buckets[b].unready;
    }
    status = StartReadyBuckets(s);
    for (size_t b = 0; status.ok() && b < s.buckets.size(); ++b) {
      status = s.buckets[b].work->wait(deadline);
    }
  } else {
    // The baseline: one blocking all_reduce per bucket, after the backward.
    for (Sync::Bucket& b : s.buckets) {
      if (!status.ok()) break;
      b.Stage(s.params, options_.gradient_type);
      status =
          options_.gradient_type == GradientType::kBFloat16
              ? s.dp.comm->all_reduce(absl::MakeSpan(b.bf16), ReduceOp::kSum)
              : s.dp.comm->all_reduce(absl::MakeSpan(b.f64), ReduceOp::kSum);
    }
  }
  if (!status.ok()) {
    // A bucket still in flight may write its staging buffer until the
    // backend lets go of it: stop the DP communicator (its later
    // collectives would pair with the wrong messages anyway) and keep the
    // buffers for as long as this object lives.
    bool in_flight = false;
    for (const Sync::Bucket& b : s.buckets) {
      in_flight |= b.work != nullptr && !b.work->is_completed();
    }
    if (in_flight) {
      s.dp.comm->abort(absl::StrCat("DataParallel gradient sync failed: ",
                                    status.message()));
      abandoned_.push_back(std::move(sync));
    }
    return status;
  }

  const double scale = 1.0 / s.dp.size;
  for (const Sync::Bucket& b : s.buckets) {
    size_t at = 0;
    for (const Sync::Piece& p : b.pieces) {
      double* g = s.params[p.param]->grad.data() + p.offset;
      for (size_t j = 0; j < p.count; ++j, ++at) {
        const double sum =
            options_.gradient_type == GradientType::kBFloat16
                ? static_cast<double>(static_cast<float>(b.bf16[at]))
                : b.f64[at];
        g[j] = sum * scale;
      }
    }
  }
  s.stats.collectives = static_cast<int>(s.buckets.size());
  return s.stats;
}

}  // namespace vemesh::strategies
