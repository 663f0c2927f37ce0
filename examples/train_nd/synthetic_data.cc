#include "synthetic_data.h"

#include <cmath>
#include <random>

namespace train_nd {
namespace {

// One reproducible stream per (seed, purpose, index, replica). The mixing
// is splitmix64; the draw is the top 53 bits of mt19937_64, which (unlike
// std::uniform_real_distribution) is specified exactly by the standard.
class Stream {
 public:
  Stream(uint64_t seed, uint64_t purpose, uint64_t index, uint64_t replica)
      : gen_(Mix(Mix(Mix(seed) ^ purpose) ^ (index * 0x9E37u)) ^ replica) {}

  // Uniform in [-scale, scale].
  double Uniform(double scale) {
    const double u = static_cast<double>(gen_() >> 11) * 0x1.0p-53;
    return (2.0 * u - 1.0) * scale;
  }
  Matrix Fill(int64_t rows, int64_t cols, double scale) {
    Matrix m(rows, cols);
    for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = Uniform(scale);
    return m;
  }

 private:
  static uint64_t Mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::mt19937_64 gen_;
};

enum Purpose : uint64_t {
  kData = 1,
  kTeacher = 2,
  kWeight = 3,
  kBias = 4,
  kExpertWeight = 5,
  kExpertBias = 6,
};

}  // namespace

Batch MakeBatch(uint64_t seed, int step, const MlpShape& shape, int64_t rows) {
  Batch b;
  b.x = Stream(seed, kData, static_cast<uint64_t>(step), 0)
            .Fill(rows, shape.input_dim, 1.0);
  const Matrix teacher = Stream(seed, kTeacher, 0, 0)
                             .Fill(shape.input_dim, shape.output_dim,
                                   2.0 / std::sqrt(double(shape.input_dim)));
  b.y = (b.x * teacher).array().sin().matrix();
  return b;
}

Matrix InitialWeight(uint64_t seed, int layer, const MlpShape& shape,
                     int64_t replica) {
  const double scale = 1.0 / std::sqrt(double(shape.in_features(layer)));
  return Stream(seed, kWeight, static_cast<uint64_t>(layer),
                static_cast<uint64_t>(replica))
      .Fill(shape.in_features(layer), shape.out_features(layer), scale);
}

Matrix InitialBias(uint64_t seed, int layer, const MlpShape& shape,
                   int64_t replica) {
  const double scale = 1.0 / std::sqrt(double(shape.in_features(layer)));
  return Stream(seed, kBias, static_cast<uint64_t>(layer),
                static_cast<uint64_t>(replica))
      .Fill(1, shape.out_features(layer), scale);
}

// Smaller than a layer's: the block is residual (h + expert(h)).
Matrix InitialExpertWeight(uint64_t seed, int expert, int64_t width) {
  return Stream(seed, kExpertWeight, static_cast<uint64_t>(expert), 0)
      .Fill(width, width, 0.5 / std::sqrt(double(width)));
}

Matrix InitialExpertBias(uint64_t seed, int expert, int64_t width) {
  return Stream(seed, kExpertBias, static_cast<uint64_t>(expert), 0)
      .Fill(1, width, 0.5 / std::sqrt(double(width)));
}

}  // namespace train_nd
