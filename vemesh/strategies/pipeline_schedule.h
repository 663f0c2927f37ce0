// vemesh/strategies/pipeline_schedule.h
//
// The order in which one pipeline stage runs its micro-batches: pure logic,
// no communication, so it can be checked exhaustively in a unit test.
//
//   std::vector<PipelineOp> ops = BuildStageSchedule(
//       PipelineSchedule::k1F1B, /*num_stages=*/4, /*stage=*/1,
//       /*num_micro_batches=*/8);
//   // recv-act 0, fwd 0, send-act 0, recv-act 1, fwd 1, ...
//
// Two schedules:
//  - GPipe: every forward, then every backward (in micro-batch order).
//    Simple; keeps all M micro-batches' activations alive.
//  - 1F1B (PipeDream-flush, Megatron's default): stage s runs
//    min(S - s - 1, M) warm-up forwards, then alternates one forward and one
//    backward, then drains the remaining backwards. At most S - s
//    micro-batches are in flight on stage s, whatever M is.
//
// Safe with blocking, unbuffered send/recv (MPI's rendezvous protocol): the
// lists of all stages, run together, never leave two neighbours both sending
// or both receiving. In 1F1B's steady state a stage sends an activation
// down and receives a gradient from the same neighbour back to back, while
// that neighbour does the opposite pair; the pair is ordered by stage parity
// (even stages send first, odd stages receive first) so the two always meet.
// tests/strategies/pipeline_schedule_test.cc simulates every stage count and
// micro-batch count up to 8 x 12 under rendezvous semantics.
//
// The first stage has no activation to receive and no gradient to send; the
// last stage has no activation to send and no gradient to receive (its
// gradient comes from the loss). Those ops are left out of their lists.

#ifndef VEMESH_STRATEGIES_PIPELINE_SCHEDULE_H_
#define VEMESH_STRATEGIES_PIPELINE_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vemesh::strategies {

enum class PipelineSchedule { kGPipe, k1F1B };

// "gpipe" or "1f1b"; InvalidArgument naming the text otherwise.
absl::StatusOr<PipelineSchedule> ParsePipelineSchedule(absl::string_view text);
absl::string_view PipelineScheduleName(PipelineSchedule schedule);

struct PipelineOp {
  enum class Kind {
    kRecvActivation,  // from the previous stage
    kForward,
    kSendActivation,  // to the next stage
    kRecvGradient,    // from the next stage
    kBackward,
    kSendGradient,  // to the previous stage
  };
  Kind kind;
  int micro_batch;

  bool operator==(const PipelineOp&) const = default;
};

absl::string_view PipelineOpKindName(PipelineOp::Kind kind);
// "fwd 3", "send-act 3", ...
std::string PipelineOpToString(const PipelineOp& op);

// The ops of `stage` (0-based) in a pipeline of `num_stages` stages running
// `num_micro_batches` micro-batches. Each micro-batch's forward and backward
// appear exactly once, the forward first. Requires 0 <= stage < num_stages
// and num_micro_batches >= 1 (checked by the caller; an empty list otherwise).
std::vector<PipelineOp> BuildStageSchedule(PipelineSchedule schedule,
                                           int num_stages, int stage,
                                           int num_micro_batches);

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_PIPELINE_SCHEDULE_H_
