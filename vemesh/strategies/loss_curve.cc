#include "vemesh/strategies/loss_curve.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace vemesh::strategies {

absl::StatusOr<LossCurveComparison> CompareLossCurve(
    const std::map<int64_t, double>& losses,
    absl::Span<const double> reference) {
  LossCurveComparison c;
  for (const auto& [step, loss] : losses) {
    if (step < 0 || static_cast<size_t>(step) >= reference.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CompareLossCurve: step ", step, " is outside the reference's ",
          reference.size(), " steps; expected 0 <= step < ", reference.size()));
    }
    const double want = reference[step];
    const double rel = std::abs(loss - want) / std::max(std::abs(want), 1e-300);
    // A NaN takes the worst place and keeps it.
    if (!std::isnan(c.max_relative_difference) &&
        (std::isnan(rel) || rel > c.max_relative_difference)) {
      c.max_relative_difference = rel;
      c.worst_step = step;
    }
    if (c.steps++ == 0) c.first_step = step;
    c.last_step = step;
  }
  return c;
}

}  // namespace vemesh::strategies
