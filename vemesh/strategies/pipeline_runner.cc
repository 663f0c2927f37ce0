#include "vemesh/strategies/pipeline_runner.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "vemesh/api/ve_device_mesh.h"
#include "vemesh/status_macros.h"
#include "vemesh/strategies/role_group.h"

namespace vemesh::strategies {
namespace {

// The rank inside `comm` of global rank `peer` (a stage neighbour).
absl::StatusOr<int> GroupRankOf(const Communicator& comm, int64_t peer) {
  absl::Span<const int> ranks = comm.ranks();
  auto it = std::find(ranks.begin(), ranks.end(), peer);
  if (it == ranks.end()) {
    return absl::InternalError(absl::StrCat(
        "stage peer rank ", peer, " is not in this rank's PP communicator"));
  }
  return static_cast<int>(it - ranks.begin());
}

// This step's view of the pipeline, read from the registry.
struct Pipeline {
  RoleGroup pp;
  bool first = true;
  bool last = true;
  int prev = -1;  // group ranks of the neighbours, -1 if none
  int next = -1;
};

absl::StatusOr<Pipeline> CurrentPipeline() {
  Pipeline p;
  absl::StatusOr<RoleGroup> pp = RoleGroupFrom(
      VESCALE_DEVICE_MESH.get_pipeline_parallel_dim_groups(), "PP");
  if (!pp.ok()) return pp.status();
  p.pp = *std::move(pp);
  absl::StatusOr<bool> first = VESCALE_DEVICE_MESH.is_first_stage();
  if (!first.ok()) return first.status();
  absl::StatusOr<bool> last = VESCALE_DEVICE_MESH.is_last_stage();
  if (!last.ok()) return last.status();
  p.first = *first;
  p.last = *last;
  if (p.pp.size == 1) return p;

  absl::StatusOr<std::optional<int64_t>> prev =
      VESCALE_DEVICE_MESH.get_prev_stage_peer();
  if (!prev.ok()) return prev.status();
  absl::StatusOr<std::optional<int64_t>> next =
      VESCALE_DEVICE_MESH.get_next_stage_peer();
  if (!next.ok()) return next.status();
  if (prev->has_value() == p.first || next->has_value() == p.last) {
    return absl::InternalError(
        "registry's stage neighbours disagree with is_first_stage / "
        "is_last_stage");
  }
  if (prev->has_value()) {
    absl::StatusOr<int> r = GroupRankOf(*p.pp.comm, **prev);
    if (!r.ok()) return r.status();
    p.prev = *r;
  }
  if (next->has_value()) {
    VEMESH_ASSIGN_OR_RETURN(int r, GroupRankOf(*p.pp.comm, **next));
    p.next = r;
  }
  return p;
}

}  // namespace

absl::StatusOr<PipelineStats> RunPipeline(PipelineStageModel& model,
                                          const PipelineOptions& options) {
  if (options.num_micro_batches < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_micro_batches is ", options.num_micro_batches, ": expected >= 1"));
  }
  VEMESH_ASSIGN_OR_RETURN(Pipeline p, CurrentPipeline());
  const int m = options.num_micro_batches;
  PipelineStats stats;
  stats.num_stages = p.pp.size;
  stats.stage = p.pp.rank;

  // Per micro-batch: the received input, the output (kept until sent and
  // until its gradient's shape is known), the output gradient and the input
  // gradient (kept until sent).
  std::vector<Matrix> input(m), output(m), grad_output(m), grad_input(m);
  int in_flight = 0;
  using Kind = PipelineOp::Kind;
  for (const PipelineOp& op :
       BuildStageSchedule(options.schedule, p.pp.size, p.pp.rank, m)) {
    const int mb = op.micro_batch;
    absl::Status s;
    switch (op.kind) {
      case Kind::kRecvActivation:
        input[mb].resize(model.InputRows(mb), model.InputCols());
        s = p.pp.comm->recv(AsSpan(input[mb]), p.prev);
        ++stats.recvs;
        break;
      case Kind::kForward: {
        if (p.first) {
          VEMESH_ASSIGN_OR_RETURN(Matrix x, model.FirstStageInput(mb));
          input[mb] = std::move(x);
        }
        VEMESH_ASSIGN_OR_RETURN(Matrix y, model.Forward(mb, input[mb]));
        input[mb] = Matrix();
        stats.max_in_flight = std::max(stats.max_in_flight, ++in_flight);
        if (p.last) {
          absl::StatusOr<Matrix> g = model.LossGradient(mb, y);
          if (!g.ok()) return g.status();
          grad_output[mb] = *std::move(g);
        } else {
          output[mb] = std::move(y);
        }
        break;
      }
      case Kind::kSendActivation:
        s = p.pp.comm->send(AsConstSpan(output[mb]), p.next);
        ++stats.sends;
        break;
      case Kind::kRecvGradient:
        // The gradient has the shape of the activation sent down.
        grad_output[mb].resize(output[mb].rows(), output[mb].cols());
        output[mb] = Matrix();
        s = p.pp.comm->recv(AsSpan(grad_output[mb]), p.next);
        ++stats.recvs;
        break;
      case Kind::kBackward: {
        VEMESH_ASSIGN_OR_RETURN(
            Matrix g,
            model.Backward(mb, grad_output[mb], /*need_input_grad=*/!p.first));
        grad_output[mb] = Matrix();
        grad_input[mb] = std::move(g);
        --in_flight;
        break;
      }
      case Kind::kSendGradient:
        s = p.pp.comm->send(AsConstSpan(grad_input[mb]), p.prev);
        grad_input[mb] = Matrix();
        ++stats.sends;
        break;
    }
    if (!s.ok()) {
      return absl::Status(
          s.code(), absl::StrCat("pipeline stage ", p.pp.rank, " at ",
                                 PipelineOpToString(op), ": ", s.message()));
    }
  }
  return stats;
}

}  // namespace vemesh::strategies
