#include "vemesh/strategies/elastic_verdict.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace vemesh::strategies {

ElasticVerdict JudgeElasticRun(const ElasticLoopResult& done,
                               const LossCurveComparison& curve,
                               double tolerance) {
  ElasticVerdict v;
  v.pass = curve.Within(tolerance) && done.identical &&
           done.communicators_at_end == done.communicators_at_start;
  std::string parameters = done.identical ? "identical" : "DIFFERENT";
  if (!done.comparison.ok()) {
    absl::StrAppend(&parameters, " (not compared: ", done.comparison.ToString(),
                    ")");
  }
  v.line = absl::StrFormat(
      "%s: replica %d: loss curve vs serial reference over steps %d..%d "
      "(%d steps): max relative difference %.3g (step %d) %s %.0e; "
      "parameters %s across %s=%d replicas; %d recoveries; communicators "
      "%d (after start %d)",
      v.pass ? "PASS" : "FAIL", done.replica, curve.first_step + 1,
      curve.last_step + 1, curve.steps, curve.max_relative_difference,
      curve.worst_step + 1,
      curve.max_relative_difference < tolerance ? "<" : ">=", tolerance,
      parameters, done.replica_dim, done.replicas, done.recoveries,
      done.communicators_at_end, done.communicators_at_start);
  return v;
}

absl::StatusOr<ElasticVerdict> JudgeElasticRun(
    const ElasticLoopResult& done, absl::Span<const double> reference,
    double tolerance) {
  absl::StatusOr<LossCurveComparison> curve =
      CompareLossCurve(done.losses, reference);
  if (!curve.ok()) return curve.status();
  return JudgeElasticRun(done, *curve, tolerance);
}

}  // namespace vemesh::strategies
