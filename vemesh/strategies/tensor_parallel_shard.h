// vemesh/strategies/tensor_parallel_shard.h
//
// Which slice of a dimension this rank holds in a tensor-parallel layer, and
// the TP group to use with it.
//
//   absl::StatusOr<TensorParallelShard> shard =
//       TensorParallelShard::Create("fc1.weight output features", 64);
//   shard->begin();  shard->size();     // rank 1 of TP=4: 16, 16
//   absl::StatusOr<RoleGroup> tp = shard->CurrentGroup();
//
// The TP size and rank come from VESCALE_DEVICE_MESH when the shard is made.
// `CurrentGroup` asks the registry again on every call (no communicator is
// cached), and refuses with FailedPrecondition when the registry has been
// re-initialised with a different TP size or rank: the weights this layer
// holds would be the wrong slice, and summing them would be silently wrong.

#ifndef VEMESH_STRATEGIES_TENSOR_PARALLEL_SHARD_H_
#define VEMESH_STRATEGIES_TENSOR_PARALLEL_SHARD_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "vemesh/strategies/role_group.h"

namespace vemesh::strategies {

class TensorParallelShard {
 public:
  // `what` names the split dimension in errors; `total` must divide evenly
  // by the TP size (InvalidArgument naming both otherwise).
  static absl::StatusOr<TensorParallelShard> Create(absl::string_view what,
                                                    int64_t total);

  int64_t begin() const { return begin_; }
  int64_t size() const { return size_; }
  int64_t total() const { return total_; }
  int tp_size() const { return tp_size_; }
  int tp_rank() const { return tp_rank_; }

  // The registry's TP group now; FailedPrecondition if it no longer matches
  // the TP size and rank this shard was cut for.
  absl::StatusOr<RoleGroup> CurrentGroup() const;

 private:
  std::string what_;
  int64_t total_ = 0;
  int64_t begin_ = 0;
  int64_t size_ = 0;
  int tp_size_ = 1;
  int tp_rank_ = 0;
};

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_TENSOR_PARALLEL_SHARD_H_
