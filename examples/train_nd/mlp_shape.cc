#include "mlp_shape.h"

namespace train_nd {

int64_t MlpShape::in_features(int layer) const {
  return layer == 0 ? input_dim : hidden;
}

int64_t MlpShape::out_features(int layer) const {
  return layer + 1 == layers ? output_dim : hidden;
}

int64_t MlpShape::split_features(int layer) const {
  return column_parallel(layer) ? out_features(layer) : in_features(layer);
}

MlpShape::Range MlpShape::stage_layers(int stage, int stages) const {
  const int base = layers / stages;
  const int extra = layers % stages;
  const int begin = stage * base + (stage < extra ? stage : extra);
  return {begin, begin + base + (stage < extra ? 1 : 0)};
}

}  // namespace train_nd
