// examples/train_nd/serial_mlp.h
//
// The reference: the example's MLP trained in one process on the whole
// batch, with no parallelism at all. The distributed run must reproduce its
// loss curve.
//
//   SerialMlp mlp(shape, seed);
//   for (int step = 0; step < steps; ++step)
//     losses.push_back(mlp.TrainStep(MakeBatch(seed, step, shape, batch), lr));
//
// With `shape.experts`, the MoE block is computed here in full: every
// expert in this process, row i of the batch routed as the distributed run
// routes its global row i.

#ifndef EXAMPLES_TRAIN_ND_SERIAL_MLP_H_
#define EXAMPLES_TRAIN_ND_SERIAL_MLP_H_

#include <cstdint>
#include <vector>

#include "mlp_shape.h"
#include "synthetic_data.h"
#include "vemesh/strategies/linear.h"

namespace train_nd {

class SerialMlp {
 public:
  // Weights as data-parallel replica 0 initialises them.
  SerialMlp(const MlpShape& shape, uint64_t seed);

  // One SGD step on the whole batch; returns the loss before the update:
  // mean over every sample and output of (prediction - target)^2.
  double TrainStep(const Batch& batch, double learning_rate);

 private:
  MlpShape shape_;
  uint64_t seed_;
  std::vector<vemesh::strategies::Linear> layers_;
  std::vector<vemesh::strategies::Linear> experts_;  // the MoE block's
};

}  // namespace train_nd

#endif  // EXAMPLES_TRAIN_ND_SERIAL_MLP_H_
