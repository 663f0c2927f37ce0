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
//   absl::StatusOr<LossCurveComparison> curve =
//       CompareLossCurve(done->losses, serial_losses);
//   if (!curve.ok()) return curve.status();
//   ElasticVerdict v = JudgeElasticRun(*done, *curve, 1e-9);
//   if (launch_rank == 0) std::printf("%s\n", v.line.c_str());
//   if (!v.pass) return absl::InternalError(v.line);
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

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_ELASTIC_VERDICT_H_
