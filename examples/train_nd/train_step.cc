#include "train_step.h"

#include "serial_mlp.h"
#include "synthetic_data.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/registry/ve_device_mesh.h"
#include "vemesh/strategies/pipeline_runner.h"
#include "vemesh/strategies/role_group.h"

namespace train_nd {

using vemesh::strategies::RoleGroup;
using vemesh::strategies::RoleGroupFrom;

absl::StatusOr<double> PipelineSquaredError(double squared_error) {
  absl::StatusOr<bool> last = VESCALE_DEVICE_MESH.is_last_stage();
  if (!last.ok()) return last.status();
  double sse = *last ? squared_error : 0.0;
  absl::StatusOr<RoleGroup> pp = RoleGroupFrom(
      VESCALE_DEVICE_MESH.get_pipeline_parallel_dim_groups(), "PP");
  if (!pp.ok()) return pp.status();
  if (pp->size > 1) {
    // RoleGroupFrom checked that group rank == PP rank: the last stage is
    // group rank size - 1.
    absl::Status s = pp->comm->broadcast(absl::MakeSpan(&sse, 1), pp->size - 1);
    if (!s.ok()) return s;
  }
  return sse;
}

absl::StatusOr<double> SumOver(
    const std::shared_ptr<vemesh::Communicator>& group, double value) {
  if (group != nullptr && group->size() > 1) {
    VEMESH_RETURN_IF_ERROR(
        group->all_reduce(absl::MakeSpan(&value, 1), vemesh::ReduceOp::kSum));
  }
  return value;
}

namespace {

double Normalised(const TrainPlan& plan, double squared_error) {
  return squared_error /
         static_cast<double>(plan.options.batch * plan.shape.output_dim);
}

}  // namespace

absl::StatusOr<double> DataParallelLoss(const TrainPlan& plan,
                                        double replica_squared_error) {
  VEMESH_ASSIGN_OR_RETURN(
      RoleGroup dp,
      RoleGroupFrom(VESCALE_DEVICE_MESH.get_data_parallel_dim_groups(), "DP"));
  VEMESH_ASSIGN_OR_RETURN(double sse, SumOver(dp.comm, replica_squared_error));
  return Normalised(plan, sse);
}

absl::StatusOr<double> GlobalLoss(const TrainPlan& plan, double squared_error) {
  VEMESH_ASSIGN_OR_RETURN(double sse, PipelineSquaredError(squared_error));
  return DataParallelLoss(plan, sse);
}

absl::StatusOr<double> GlobalLoss(
    const TrainPlan& plan, double squared_error,
    const std::shared_ptr<vemesh::Communicator>& shard,
    const std::shared_ptr<vemesh::Communicator>& replicate) {
  VEMESH_ASSIGN_OR_RETURN(double sse, PipelineSquaredError(squared_error));
  VEMESH_ASSIGN_OR_RETURN(sse, SumOver(shard, sse));
  VEMESH_ASSIGN_OR_RETURN(sse, SumOver(replicate, sse));
  return Normalised(plan, sse);
}

absl::StatusOr<std::vector<double>> SerialLosses(const TrainPlan& plan) {
  SerialMlp mlp(plan.shape, plan.options.seed, plan.optimizer);
  std::vector<double> losses;
  for (int step = 0; step < plan.options.steps; ++step) {
    absl::StatusOr<double> loss = mlp.TrainStep(
        MakeBatch(plan.options.seed, step, plan.shape, plan.options.batch));
    if (!loss.ok()) return loss.status();
    losses.push_back(*loss);
  }
  return losses;
}

absl::StatusOr<double> ElasticStep(
    const TrainPlan& plan, ParallelMlpStage& stage,
    vemesh::strategies::DataParallelTrainer& trainer, int64_t step,
    const std::function<void(const char*)>& fault) {
  (void)stage.TakeSquaredError();  // a failed step may have left it
  stage.SetBatch(MakeBatch(plan.options.seed, static_cast<int>(step),
                           plan.shape, plan.options.batch));
  fault("tp");
  if (absl::Status s = trainer.BeginStep(); !s.ok()) return s;
  auto ran = vemesh::strategies::RunPipeline(
      stage, {plan.schedule, plan.options.micro_batches});
  if (!ran.ok()) return ran.status();
  if (absl::Status s = trainer.AfterBackward(); !s.ok()) return s;
  VEMESH_ASSIGN_OR_RETURN(double sse,
                          PipelineSquaredError(stage.TakeSquaredError()));
  VEMESH_ASSIGN_OR_RETURN(sse, SumOver(trainer.shard_group(), sse));
  fault("dp");
  fault("stop");
  VEMESH_RETURN_IF_ERROR(trainer.Step());
  if (trainer.replicate_group() == nullptr) return DataParallelLoss(plan, sse);
  VEMESH_ASSIGN_OR_RETURN(sse, SumOver(trainer.replicate_group(), sse));
  return Normalised(plan, sse);
}

}  // namespace train_nd
