// examples/hsdp/toy_model.h
//
// The seeds' ToyModel (Linear(10, 10) -> ReLU -> Linear(10, 5)), or any
// chain of Linear layers with ReLU between, one FSDP unit per layer, and
// one training step through FullyShardedDataParallel's hooks or serially.
//
//   ToyModel model = MakeToyModel({10, 10, 5});
//   auto fsdp = FullyShardedDataParallel::Create(mesh, model.Units(), o);
//   Batch b = SyntheticBatch(model, step, /*rows=*/64);
//   double loss = *ForwardBackward(model, &*fsdp, b.x, b.y);  // local rows
//
// Parameters and data are deterministic (seeded), so every rank and the
// serial reference start from the same model and see the same batches.

#ifndef EXAMPLES_HSDP_TOY_MODEL_H_
#define EXAMPLES_HSDP_TOY_MODEL_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "vemesh/strategies/fully_sharded_data_parallel.h"
#include "vemesh/strategies/linear.h"

namespace hsdp {

using vemesh::strategies::Matrix;

struct ToyModel {
  std::vector<int64_t> dims;  // in, hidden..., out
  std::vector<vemesh::strategies::Linear> layers;
  // One unit per layer ("net1", "net2", ...), in forward order.
  std::vector<vemesh::strategies::FsdpUnit> Units();
  std::vector<vemesh::strategies::Parameter*> parameters();
};

// Layers dims[i] -> dims[i + 1], weights uniform in +-1/sqrt(fan_in) (as
// torch.nn.Linear) from a fixed seed.
ToyModel MakeToyModel(const std::vector<int64_t>& dims, uint64_t seed = 1);

struct Batch {
  Matrix x;  // rows x dims.front()
  Matrix y;  // rows x dims.back(): a fixed random linear map of x, plus noise
};
// The global batch of step `step` (the same on every process).
Batch SyntheticBatch(const ToyModel& model, int step, int64_t rows);

// Mean squared error of x -> y, forward and backward, accumulating the
// layers' gradients; with `fsdp`, each layer between its hooks. The loss.
absl::StatusOr<double> ForwardBackward(
    ToyModel& model, vemesh::strategies::FullyShardedDataParallel* fsdp,
    const Matrix& x, const Matrix& y);

}  // namespace hsdp

#endif  // EXAMPLES_HSDP_TOY_MODEL_H_
