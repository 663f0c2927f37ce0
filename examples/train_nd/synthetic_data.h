// examples/train_nd/synthetic_data.h
//
// Deterministic data and weights for the example: the same seed gives the
// same numbers in every process, so the distributed run and the serial
// reference see identical batches, and every TP rank of a replica cuts its
// slice out of the same full weight.
//
//   Batch b = MakeBatch(seed, step, shape, /*rows=*/32);
//   // b.x: 32 x input_dim in [-1, 1]; b.y = sin(b.x * A), A fixed by seed.
//   Matrix w = InitialWeight(seed, layer, shape, /*replica=*/0);
//
// `replica` perturbs the initial weights of data-parallel replicas other
// than 0 on purpose: only the DP broadcast makes them agree, so a broken
// broadcast shows up as a loss mismatch instead of passing silently.

#ifndef EXAMPLES_TRAIN_ND_SYNTHETIC_DATA_H_
#define EXAMPLES_TRAIN_ND_SYNTHETIC_DATA_H_

#include <cstdint>

#include "mlp_shape.h"
#include "vemesh/strategies/dense.h"

namespace train_nd {

using vemesh::strategies::Matrix;

struct Batch {
  Matrix x;  // rows x input_dim
  Matrix y;  // rows x output_dim
};

// The whole batch of `step` (every process builds the same one and takes
// its rows).
Batch MakeBatch(uint64_t seed, int step, const MlpShape& shape, int64_t rows);

// Full (unsplit) initial weight (in x out) and bias (1 x out) of `layer`.
Matrix InitialWeight(uint64_t seed, int layer, const MlpShape& shape,
                     int64_t replica);
Matrix InitialBias(uint64_t seed, int layer, const MlpShape& shape,
                   int64_t replica);

// Expert `expert` of the MoE block (width x width weight, 1 x width bias):
// the same in every process, as experts are not replicated.
Matrix InitialExpertWeight(uint64_t seed, int expert, int64_t width);
Matrix InitialExpertBias(uint64_t seed, int expert, int64_t width);

}  // namespace train_nd

#endif  // EXAMPLES_TRAIN_ND_SYNTHETIC_DATA_H_
