// vemesh/strategies/elastic_verdict.h
//
// The end of an elastic run in one line, for its logs and its tests: the
// steps this replica trained against a reference loss curve
// (loss_curve.h), the loop's end-of-job comparison of the replicas, and
// whether the loop left communicators behind (elastic_loop.h).
//
//   absl::StatusOr<ElasticLoopResult> done =
//       RunElasticLoop(el, state, {.steps = 100, .compare_replicas = true},
//                      hooks);
//   if (!done.ok()) return done.status();
//   if (done->evicted) return absl::OkStatus();
//   absl::StatusOr<ElasticVerdict> v =
//       JudgeElasticRun(*done, serial_losses, 1e-9);  // or a comparison
//   if (!v.ok()) return v.status();  // a step the reference lacks
//   if (launch_rank == 0) std::printf("%s\n", v->line.c_str());
//   if (!v->pass) return absl::InternalError(v->line);
//
// pass: the curve is within `tolerance` (some steps trained), the replicas
// are identical, and the communicator count is the one at the loop's start.
// line (one line):
//   PASS|FAIL: replica K: loss curve vs serial reference over steps A..B
//   (N steps): max relative difference D (step S) <|>= TOL; parameters
//   identical|DIFFERENT across DIM=R replicas; X recoveries; communicators
//   C (after start C0)
// (steps 1-based, 0 when none; R the last epoch's replicas; a comparison
// that could not be made adds "(not compared: STATUS)" after DIFFERENT).

#ifndef VEMESH_STRATEGIES_ELASTIC_VERDICT_H_
#define VEMESH_STRATEGIES_ELASTIC_VERDICT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "vemesh/strategies/elastic_loop.h"
#include "vemesh/strategies/loss_curve.h"

namespace vemesh::strategies {

struct ElasticVerdict {
  bool pass = false;
  std::string line;
};

ElasticVerdict JudgeElasticRun(const ElasticLoopResult& done,
                               const LossCurveComparison& curve,
                               double tolerance);
// The same against the reference curve itself (CompareLossCurve of
// done.losses first: its InvalidArgument for a step the reference lacks).
absl::StatusOr<ElasticVerdict> JudgeElasticRun(
    const ElasticLoopResult& done, absl::Span<const double> reference,
    double tolerance);

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_ELASTIC_VERDICT_H_
