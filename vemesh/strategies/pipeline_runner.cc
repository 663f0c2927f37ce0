#include "vemesh/strategies/pipeline_runner.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/registry/ve_device_mesh.h"
#include "vemesh/strategies/role_group.h"

namespace vemesh::strategies {
namespace {

// This step's view of the pipeline, read from the registry.
struct Pipeline {
  RoleGroup pp;
  bool first = true;
  bool last = true;
  // Global ranks of the neighbours (the registry's answer, which the
  // communicator addresses directly), -1 if none.
  int64_t prev = -1;
  int64_t next = -1;
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
  p.prev = prev->value_or(-1);
  p.next = next->value_or(-1);
  return p;
}

// The sends of one step still in flight, each with the buffer it reads.
class PendingSends {
 public:
  explicit PendingSends(std::shared_ptr<Communicator> comm)
      : comm_(std::move(comm)) {}
  PendingSends(const PendingSends&) = delete;
  PendingSends& operator=(const PendingSends&) = delete;
  // On an error path: a send may still read its buffer. Stop the
  // communicator (the link's message order is broken anyway) and keep the
  // buffers of unfinished sends for the life of the process, as work.h
  // asks after an abort.
  ~PendingSends() {
    bool in_flight = false;
    for (Entry& e : entries_) {
      in_flight |= e.work != nullptr && !e.work->test();
    }
    if (!in_flight) return;
    comm_->abort("a pipeline step failed with sends in flight");
    static auto* kept = new std::vector<std::unique_ptr<Matrix>>();
    static std::mutex kept_mu;
    std::lock_guard<std::mutex> lock(kept_mu);
    for (Entry& e : entries_) {
      if (e.work != nullptr && !e.work->is_completed()) {
        kept->push_back(std::move(e.buffer));
      }
    }
  }

  // Starts sending `data` to global rank `peer`; the slot keeps the buffer
  // until the send completed. One slot per (micro-batch, direction).
  absl::Status Start(int slot, Matrix data, int64_t peer) {
    if (static_cast<size_t>(slot) >= entries_.size()) entries_.resize(slot + 1);
    Entry& e = entries_[slot];
    VEMESH_RETURN_IF_ERROR(Wait(slot));  // a slot holds one send at a time
    e.buffer = std::make_unique<Matrix>(std::move(data));
    VEMESH_ASSIGN_OR_RETURN(
        e.work,
        comm_->isend(e.buffer->data(), static_cast<size_t>(e.buffer->size()),
                     DataType::kFloat64, GlobalRank(peer)));
    // Nudges the send along (MPI progresses inside calls) without blocking.
    e.work->test();
    return absl::OkStatus();
  }
  // Waits for the send of `slot` (if any) and frees its buffer.
  absl::Status Wait(int slot) {
    if (static_cast<size_t>(slot) >= entries_.size()) return absl::OkStatus();
    Entry& e = entries_[slot];
    if (e.work == nullptr) return absl::OkStatus();
    VEMESH_RETURN_IF_ERROR(e.work->wait(absl::Now() + comm_->timeout()));
    e.work = nullptr;
    e.buffer = nullptr;
    return absl::OkStatus();
  }
  absl::Status WaitAll() {
    for (size_t i = 0; i < entries_.size(); ++i) {
      VEMESH_RETURN_IF_ERROR(Wait(static_cast<int>(i)));
    }
    return absl::OkStatus();
  }

 private:
  struct Entry {
    std::unique_ptr<Matrix> buffer;  // stable address while the send runs
    std::shared_ptr<Work> work;
  };
  std::shared_ptr<Communicator> comm_;
  std::vector<Entry> entries_;
};

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

  // Per micro-batch: the received input, the output (until sent), its shape
  // (the gradient coming back has it), the output gradient and the input
  // gradient (until sent).
  std::vector<Matrix> input(m), output(m), grad_output(m), grad_input(m);
  std::vector<std::pair<int64_t, int64_t>> output_shape(m);
  // Slots 2 mb (activation of mb) and 2 mb + 1 (gradient of mb).
  std::optional<PendingSends> pending;
  if (p.pp.comm != nullptr) pending.emplace(p.pp.comm);
  int in_flight = 0;
  using Kind = PipelineOp::Kind;
  for (const PipelineOp& op :
       BuildStageSchedule(options.schedule, p.pp.size, p.pp.rank, m)) {
    const int mb = op.micro_batch;
    absl::Status s;
    switch (op.kind) {
      case Kind::kRecvActivation:
        input[mb].resize(model.InputRows(mb), model.InputCols());
        s = p.pp.comm->recv(AsSpan(input[mb]), GlobalRank(p.prev));
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
          output_shape[mb] = {y.rows(), y.cols()};
          output[mb] = std::move(y);
        }
        break;
      }
      case Kind::kSendActivation:
        if (options.overlap_sends) {
          // The next micro-batch computes while this one travels.
          s = pending->Start(2 * mb, std::move(output[mb]), p.next);
          output[mb] = Matrix();
        } else {
          s = p.pp.comm->send(AsConstSpan(output[mb]), GlobalRank(p.next));
          output[mb] = Matrix();
        }
        ++stats.sends;
        break;
      case Kind::kRecvGradient:
        grad_output[mb].resize(output_shape[mb].first, output_shape[mb].second);
        s = p.pp.comm->recv(AsSpan(grad_output[mb]), GlobalRank(p.next));
        // The peer answered with this micro-batch's gradient, so it has
        // the activation: its send is done (or finishes at once).
        if (s.ok() && options.overlap_sends) s = pending->Wait(2 * mb);
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
        if (options.overlap_sends) {
          s = pending->Start(2 * mb + 1, std::move(grad_input[mb]), p.prev);
        } else {
          s = p.pp.comm->send(AsConstSpan(grad_input[mb]), GlobalRank(p.prev));
        }
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
  if (pending.has_value()) {
    absl::Status s = pending->WaitAll();
    if (!s.ok()) {
      return absl::Status(
          s.code(), absl::StrCat("pipeline stage ", p.pp.rank,
                                 " waiting for its last sends: ", s.message()));
    }
  }
  return stats;
}

}  // namespace vemesh::strategies
