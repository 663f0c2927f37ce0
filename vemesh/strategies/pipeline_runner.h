// vemesh/strategies/pipeline_runner.h
//
// Runs one training step of a pipeline stage: its micro-batches' forwards
// and backwards in schedule order (GPipe or 1F1B), sending activations to
// the next stage and gradients back to the previous one.
//
//   absl::StatusOr<PipelineStats> st = RunPipeline(
//       stage_model, {.schedule = PipelineSchedule::k1F1B,
//                     .num_micro_batches = 4});
//
// Everything about the pipeline comes from VESCALE_DEVICE_MESH when the step
// starts (nothing is cached between steps):
//   - the number of stages and this stage: the PP size and PP rank;
//   - first / last stage: is_first_stage() / is_last_stage();
//   - the neighbours: get_prev_stage_peer() / get_next_stage_peer(), the
//     global rank in the neighbouring stage that holds this rank's (DP, TP,
//     ...) position;
//   - the channel: the PP communicator (get_pipeline_parallel_dim_groups()),
//     addressed by the neighbour's global rank (`GlobalRank(peer)`: the
//     communicator finds its group rank). Using the PP group rather than
//     the world keeps pipeline traffic on the communicator made for it,
//     which is also what an NCCL backend needs.
// A mesh without PP is a one-stage pipeline: no communication at all.
//
// Sends overlap with compute (`overlap_sends`, on by default): an
// activation or gradient is handed to `isend` and the stage goes on with
// the next micro-batch; the buffer is kept (one per micro-batch and
// direction) until its send completed: the activation's when its gradient
// comes back, the rest at the end of the step. Receives block: the next
// operation needs their data.
//
// Messages carry no tag; both neighbours walk schedules built by
// BuildStageSchedule from the same (stages, micro-batches), so the n-th
// message on a link is the same micro-batch on both sides, and the schedule
// is deadlock-free even with unbuffered sends. Collective over the PP
// group; every stage must call it with the same options.

#ifndef VEMESH_STRATEGIES_PIPELINE_RUNNER_H_
#define VEMESH_STRATEGIES_PIPELINE_RUNNER_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "vemesh/strategies/pipeline_schedule.h"
#include "vemesh/strategies/pipeline_stage_model.h"

namespace vemesh::strategies {

struct PipelineOptions {
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  int num_micro_batches = 1;
  // isend and go on (true), or send and wait (false: the baseline).
  bool overlap_sends = true;
};

struct PipelineStats {
  int num_stages = 1;
  int stage = 0;
  int sends = 0;
  int recvs = 0;
  // Most micro-batches whose activations this stage held at once.
  int max_in_flight = 0;
};

absl::StatusOr<PipelineStats> RunPipeline(PipelineStageModel& model,
                                          const PipelineOptions& options);

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_PIPELINE_RUNNER_H_
