#include "elastic_loop.h"

#include <cstdio>

#include "checkpoint_state.h"
#include "fault_injection.h"
#include "train_step.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/registry/ve_device_mesh.h"
#include "vemesh/strategies/elastic_verdict.h"

namespace train_nd {
namespace {

namespace vs = vemesh::strategies;

// This replica's part of the job: 0 PASS, 1 FAIL, 3 evicted (launch it again
// to rejoin), or the error that ended it.
absl::StatusOr<int> Run(const TrainPlan& plan0, const ElasticSettings& settings,
                        int launch_rank) {
  VEMESH_ASSIGN_OR_RETURN(const FaultInjection fault,
                          FaultInjection::Parse(settings.fault, launch_rank));
  vemesh::InitOptions init;
  vemesh::ElasticOptions& el = init.elastic.emplace(settings.options);
  // HSDP: the replicas are DP_REPLICATE's; DP_SHARD lives in each launch.
  if (plan0.fsdp()) el.replica_dim = "DP_REPLICATE";
  el.descriptor = JobDescriptor(plan0);
  el.fault_hook = fault.library_hook();
  auto mesh = VESCALE_DEVICE_MESH.init_device_mesh("cpu", plan0.mesh.shape,
                                                   plan0.mesh.names, init);
  VEMESH_RETURN_IF_ERROR(mesh);
  vemesh::ElasticMesh& elastic = *VESCALE_DEVICE_MESH.elastic();
  VEMESH_ASSIGN_OR_RETURN(
      auto plan, ReplanReplicas(plan0, elastic.last_recovery().dp_size));
  // The model and how it trains, built once on the elastic mesh's groups
  // (the same objects in every epoch), named before HSDP frees the values.
  VEMESH_ASSIGN_OR_RETURN(auto stage, ParallelMlpStage::Create(plan));
  vs::TrainingState state;
  VEMESH_RETURN_IF_ERROR(stage->NameParameters(&state));
  auto trainer = vs::DataParallelTrainer::Create(*mesh, stage->fsdp_units(),
                                                 TrainerOptions(plan));
  mesh = absl::CancelledError("not kept: the registry has each epoch's");
  VEMESH_RETURN_IF_ERROR(trainer);
  VEMESH_RETURN_IF_ERROR((*trainer)->AddTo(state));
  const TrainOptions& o = plan0.options;
  vs::ElasticLoopOptions loop{.steps = o.steps,
                              .log = launch_rank == 0 ? stdout : nullptr,
                              .pace = settings.pace,
                              .compare_replicas = true};
  if (!o.checkpoint_dir.empty()) {  // over the replica's own ranks
    loop.periodic_checkpoint = {.dir = o.checkpoint_dir,
                                .every = o.checkpoint_every,
                                .keep_last = o.checkpoint_keep,
                                .identity = CheckpointIdentity(plan0)};
  }
  vs::ElasticLoopHooks hooks;
  hooks.step = [&](int64_t step) {
    return ElasticStep(plan, *stage, **trainer, step,
                       [&](const char* where) { fault.At(where, step); });
  };
  hooks.on_recovery = [&](const vemesh::Recovery& r) -> absl::Status {
    VEMESH_ASSIGN_OR_RETURN(plan, ReplanReplicas(plan0, r.dp_size));
    return stage->Rebind(plan);  // the data slice follows DP's size
  };
  fault.Wrap(hooks, state);
  VEMESH_ASSIGN_OR_RETURN(auto done,
                          vs::RunElasticLoop(elastic, state, loop, hooks));
  if (done.evicted) return 3;
  VEMESH_ASSIGN_OR_RETURN(auto serial, SerialLosses(plan0));
  VEMESH_ASSIGN_OR_RETURN(auto verdict,
                          vs::JudgeElasticRun(done, serial, o.tolerance));
  if (launch_rank == 0) std::printf("%s\n", verdict.line.c_str());
  return verdict.pass ? 0 : 1;
}

}  // namespace

int RunElastic(const TrainPlan& plan, const ElasticSettings& settings,
               int launch_rank) {
  absl::StatusOr<int> code = Run(plan, settings, launch_rank);
  std::fflush(stdout);
  VESCALE_DEVICE_MESH.reset();
  if (code.ok()) return *code;
  std::fprintf(stderr, "[replica %d rank %d] train_nd: %s\n",
               settings.options.replica, launch_rank,
               code.status().ToString().c_str());
  return 1;
}

}  // namespace train_nd
