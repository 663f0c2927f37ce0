#include "vemesh/strategies/data_parallel.h"

#include <algorithm>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "vemesh/api/ve_device_mesh.h"
#include "vemesh/status_macros.h"
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

absl::StatusOr<RoleGroup> CurrentDpGroup() {
  return RoleGroupFrom(VESCALE_DEVICE_MESH.get_data_parallel_dim_groups(),
                       "DP");
}

size_t TotalElements(absl::Span<Parameter* const> params, Field field) {
  size_t n = 0;
  for (const Parameter* p : params) n += static_cast<size_t>((p->*field).size());
  return n;
}

}  // namespace

DataParallel::DataParallel(DataParallelOptions options) : options_(options) {
  options_.bucket_elements = std::max<size_t>(options_.bucket_elements, 1);
}

absl::StatusOr<BucketStats> DataParallel::BroadcastParameters(
    absl::Span<Parameter* const> params, int root) const {
  VEMESH_ASSIGN_OR_RETURN(RoleGroup dp, CurrentDpGroup());
  if (root < 0 || root >= dp.size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BroadcastParameters root ", root, ": expected a DP rank in [0, ",
        dp.size, ")"));
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
    absl::Span<Parameter* const> params) const {
  VEMESH_ASSIGN_OR_RETURN(RoleGroup dp, CurrentDpGroup());
  BucketStats stats{dp.size, TotalElements(params, &Parameter::grad), 0};
  if (dp.size == 1) return stats;
  const double scale = 1.0 / dp.size;
  absl::StatusOr<int> n = ForEachBucket(
      params, &Parameter::grad, options_.bucket_elements,
      [&](absl::Span<double> bucket) {
        absl::Status s = dp.comm->all_reduce(bucket, ReduceOp::kSum);
        for (double& v : bucket) v *= scale;
        return s;
      });
  if (!n.ok()) return n.status();
  stats.collectives = *n;
  return stats;
}

}  // namespace vemesh::strategies
