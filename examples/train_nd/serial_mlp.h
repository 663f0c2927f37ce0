// examples/train_nd/serial_mlp.h
//
// The reference: the example's MLP trained in one process on the whole
// batch, with no parallelism at all. The distributed run must reproduce its
// loss curve.
//
//   SerialMlp mlp(shape, seed, OptimizerOptions::AdamW(0.01));
//   for (int step = 0; step < steps; ++step)
//     losses.push_back(*mlp.TrainStep(MakeBatch(seed, step, shape, batch)));
//
// With `shape.experts`, the MoE block is computed here in full: every
// expert in this process, row i of the batch routed as the distributed run
// routes its global row i.

#ifndef EXAMPLES_TRAIN_ND_SERIAL_MLP_H_
#define EXAMPLES_TRAIN_ND_SERIAL_MLP_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"

#include "mlp_shape.h"
#include "synthetic_data.h"
#include "vemesh/strategies/linear.h"
#include "vemesh/strategies/optimizer.h"

namespace train_nd {

class SerialMlp {
 public:
  // Weights as data-parallel replica 0 initialises them; every parameter
  // is stepped by `optimizer` (SGD or AdamW).
  SerialMlp(const MlpShape& shape, uint64_t seed,
            const vemesh::strategies::OptimizerOptions& optimizer);
  SerialMlp(const SerialMlp&) = delete;
  SerialMlp& operator=(const SerialMlp&) = delete;

  // One optimizer step on the whole batch; returns the loss before the
  // update: mean over every sample and output of (prediction - target)^2.
  // InvalidArgument for optimizer options out of range.
  absl::StatusOr<double> TrainStep(const Batch& batch);

 private:
  MlpShape shape_;
  uint64_t seed_;
  std::vector<vemesh::strategies::Linear> layers_;
  std::vector<vemesh::strategies::Linear> experts_;  // the MoE block's
  vemesh::strategies::OptimizerOptions optimizer_options_;
  // Made on the first step, over experts_ then layers_.
  std::optional<vemesh::strategies::Optimizer> optimizer_;
};

}  // namespace train_nd

#endif  // EXAMPLES_TRAIN_ND_SERIAL_MLP_H_
