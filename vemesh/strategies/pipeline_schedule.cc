#include "vemesh/strategies/pipeline_schedule.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace vemesh::strategies {
namespace {

using Kind = PipelineOp::Kind;

// Appends ops while dropping the ones a first or last stage does not have.
class OpList {
 public:
  OpList(bool first, bool last) : first_(first), last_(last) {}

  void Add(Kind kind, int mb) {
    if (first_ &&
        (kind == Kind::kRecvActivation || kind == Kind::kSendGradient))
      return;
    if (last_ && (kind == Kind::kSendActivation || kind == Kind::kRecvGradient))
      return;
    ops_.push_back({kind, mb});
  }
  // A send and a receive with the same neighbour, back to back: even stages
  // send first, odd stages receive first, so the neighbour (of the other
  // parity) always posts the matching op.
  void AddPair(bool even, PipelineOp send, PipelineOp recv) {
    if (even) {
      Add(send.kind, send.micro_batch);
      Add(recv.kind, recv.micro_batch);
    } else {
      Add(recv.kind, recv.micro_batch);
      Add(send.kind, send.micro_batch);
    }
  }
  std::vector<PipelineOp> Take() { return std::move(ops_); }

 private:
  bool first_;
  bool last_;
  std::vector<PipelineOp> ops_;
};

}  // namespace

absl::StatusOr<PipelineSchedule> ParsePipelineSchedule(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "gpipe") return PipelineSchedule::kGPipe;
  if (lower == "1f1b") return PipelineSchedule::k1F1B;
  return absl::InvalidArgumentError(absl::StrCat(
      "pipeline schedule '", text, "' is unknown: expected gpipe or 1f1b"));
}

absl::string_view PipelineScheduleName(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::kGPipe ? "gpipe" : "1f1b";
}

absl::string_view PipelineOpKindName(PipelineOp::Kind kind) {
  switch (kind) {
    case Kind::kRecvActivation:
      return "recv-act";
    case Kind::kForward:
      return "fwd";
    case Kind::kSendActivation:
      return "send-act";
    case Kind::kRecvGradient:
      return "recv-grad";
    case Kind::kBackward:
      return "bwd";
    case Kind::kSendGradient:
      return "send-grad";
  }
  return "?";
}

std::string PipelineOpToString(const PipelineOp& op) {
  return absl::StrCat(PipelineOpKindName(op.kind), " ", op.micro_batch);
}

std::vector<PipelineOp> BuildStageSchedule(PipelineSchedule schedule,
                                           int num_stages, int stage,
                                           int num_micro_batches) {
  if (num_stages < 1 || stage < 0 || stage >= num_stages ||
      num_micro_batches < 1) {
    return {};
  }
  const int m = num_micro_batches;
  OpList ops(stage == 0, stage == num_stages - 1);

  if (schedule == PipelineSchedule::kGPipe) {
    for (int i = 0; i < m; ++i) {
      ops.Add(Kind::kRecvActivation, i);
      ops.Add(Kind::kForward, i);
      ops.Add(Kind::kSendActivation, i);
    }
    for (int i = 0; i < m; ++i) {
      ops.Add(Kind::kRecvGradient, i);
      ops.Add(Kind::kBackward, i);
      ops.Add(Kind::kSendGradient, i);
    }
    return ops.Take();
  }

  // 1F1B. Warm-up: enough forwards to fill the stages below this one.
  const bool even = stage % 2 == 0;
  const int warmup = std::min(num_stages - stage - 1, m);
  const int steady = m - warmup;
  for (int i = 0; i < warmup; ++i) {
    ops.Add(Kind::kRecvActivation, i);
    ops.Add(Kind::kForward, i);
    ops.Add(Kind::kSendActivation, i);
  }
  // Steady state: forward micro-batch warmup + k, backward micro-batch k.
  // Each send is paired with the next receive from the same neighbour.
  if (steady > 0) ops.Add(Kind::kRecvActivation, warmup);
  for (int k = 0; k < steady; ++k) {
    const int fwd = warmup + k;
    ops.Add(Kind::kForward, fwd);
    ops.AddPair(even, {Kind::kSendActivation, fwd}, {Kind::kRecvGradient, k});
    ops.Add(Kind::kBackward, k);
    if (k + 1 < steady) {
      ops.AddPair(even, {Kind::kSendGradient, k},
                  {Kind::kRecvActivation, fwd + 1});
    } else {
      ops.Add(Kind::kSendGradient, k);
    }
  }
  // Cool-down: the backwards of the warm-up micro-batches.
  for (int i = steady; i < m; ++i) {
    ops.Add(Kind::kRecvGradient, i);
    ops.Add(Kind::kBackward, i);
    ops.Add(Kind::kSendGradient, i);
  }
  return ops.Take();
}

}  // namespace vemesh::strategies
