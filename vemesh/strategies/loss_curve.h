// vemesh/strategies/loss_curve.h
//
// A distributed run's loss curve against a reference run's (the same model
// trained serially, or on another mesh): the check every parallel training
// job's correctness test makes, with the steps the run actually trained
// (a relaunched elastic replica trains only the steps after it joined).
//
//   // losses: step -> loss of the steps trained (ElasticLoopResult::losses)
//   absl::StatusOr<LossCurveComparison> c = CompareLossCurve(losses, serial);
//   if (!c.ok()) return c.status();  // a step the reference lacks
//   if (!c->Within(1e-9)) {          // none trained, or one too far off
//     return absl::InternalError(absl::StrCat("step ", c->worst_step));
//   }
//
// Steps are 0-based indexes into `reference`. The relative difference of a
// step is |loss - reference| / max(|reference|, 1e-300); a NaN loss is the
// worst step (never within any tolerance).
// Errors: InvalidArgument naming the first step outside the reference.

#ifndef VEMESH_STRATEGIES_LOSS_CURVE_H_
#define VEMESH_STRATEGIES_LOSS_CURVE_H_

#include <cstddef>
#include <cstdint>
#include <map>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace vemesh::strategies {

struct LossCurveComparison {
  size_t steps = 0;         // compared
  int64_t first_step = -1;  // the first and last compared (-1: none)
  int64_t last_step = -1;
  double max_relative_difference = 0;
  int64_t worst_step = -1;  // where it is (-1: none)
  // Some steps were compared and every one is closer than `tolerance`.
  bool Within(double tolerance) const {
    return steps > 0 && max_relative_difference < tolerance;
  }
};

absl::StatusOr<LossCurveComparison> CompareLossCurve(
    const std::map<int64_t, double>& losses,
    absl::Span<const double> reference);

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_LOSS_CURVE_H_
