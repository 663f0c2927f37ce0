// examples/train_nd/mlp_shape.h
//
// The shape of the example's MLP and how it is cut for N-D parallelism.
//
//   input (in) -> L0 -> tanh -> L1 -> tanh -> ... -> L{L-1} -> output (out)
//
// Every hidden width is `hidden`. Layers alternate, Megatron style, between
// column-parallel (even index: weight split by output features) and
// row-parallel (odd index: split by input features), so a column layer's
// split output feeds the row layer after it with no communication. A
// column layer that ends the model gathers its output (the loss needs it
// whole). Stage s of S holds a contiguous run of layers, the first L % S
// stages one more than the rest. When a stage boundary falls between a
// column and a row layer, the split activation goes to the next stage's peer,
// which holds the same TP position and so needs exactly that split.

#ifndef EXAMPLES_TRAIN_ND_MLP_SHAPE_H_
#define EXAMPLES_TRAIN_ND_MLP_SHAPE_H_

#include <cstdint>

namespace train_nd {

struct MlpShape {
  int64_t input_dim = 16;
  int64_t hidden = 64;
  int64_t output_dim = 8;
  int layers = 4;
  // Experts of the MoE block (0: none). The block follows layer
  // kMoeLayer, a row-parallel layer whose output is whole on every TP rank:
  // h -> h + expert_e(h)(h), one expert per row (vemesh/strategies/
  // expert_parallel.h), routed by the row's index in the global batch.
  int experts = 0;
  static constexpr int kMoeLayer = 1;
  bool has_moe(int layer) const { return experts > 0 && layer == kMoeLayer; }

  int64_t in_features(int layer) const;
  int64_t out_features(int layer) const;
  static bool column_parallel(int layer) { return layer % 2 == 0; }
  // tanh after every layer but the model's last.
  bool has_activation(int layer) const { return layer + 1 < layers; }
  // The features the TP group splits: output for column, input for row.
  int64_t split_features(int layer) const;

  // Layers [begin, end) of stage `stage` of `stages`.
  struct Range {
    int begin;
    int end;
  };
  Range stage_layers(int stage, int stages) const;
};

}  // namespace train_nd

#endif  // EXAMPLES_TRAIN_ND_MLP_SHAPE_H_
