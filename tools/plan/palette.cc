#include "tools/plan/palette.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace vemesh::plan {
namespace {

// HSL (h in degrees, s and l in [0, 1]) to an 8-bit channel value.
int Channel(double h, double s, double l, double n) {
  const double k = std::fmod(n + h / 30.0, 12.0);
  const double a = s * std::min(l, 1.0 - l);
  const double v = l - a * std::max(-1.0, std::min({k - 3.0, 9.0 - k, 1.0}));
  return static_cast<int>(std::lround(v * 255.0));
}

}  // namespace

std::string GroupColor(int64_t index) {
  constexpr double kGoldenAngle = 137.50776405;
  const double hue =
      std::fmod(20.0 + static_cast<double>(index % 360) * kGoldenAngle, 360.0);
  // Alternate two lightness levels so hues that land close still differ.
  const double light = index % 2 == 0 ? 0.80 : 0.72;
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", Channel(hue, 0.65, light, 0),
                Channel(hue, 0.65, light, 8), Channel(hue, 0.65, light, 4));
  return buf;
}

}  // namespace vemesh::plan
