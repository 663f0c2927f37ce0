#include "elastic_loop.h"

#include <cstdio>

#include "checkpoint_state.h"
#include "fault_injection.h"
#include "train_step.h"
#include "vemesh/registry/ve_device_mesh.h"
#include "vemesh/strategies/elastic_verdict.h"

namespace train_nd {

namespace vs = vemesh::strategies;

int RunElastic(const TrainPlan& plan0, const ElasticSettings& settings,
               int launch_rank) {
  auto fail = [&](const char* what, const absl::Status& status) {
    std::fprintf(stderr, "[replica %d rank %d] train_nd: %s: %s\n",
                 settings.options.replica, launch_rank, what,
                 status.ToString().c_str());
    return 1;
  };
  auto fault = FaultInjection::Parse(settings.fault, launch_rank);
  if (!fault.ok()) return fail("error", fault.status());
  vemesh::InitOptions init;
  vemesh::ElasticOptions& el = init.elastic.emplace(settings.options);
  // HSDP: the replicas are DP_REPLICATE's; DP_SHARD lives in each launch.
  if (plan0.fsdp()) el.replica_dim = "DP_REPLICATE";
  el.descriptor = JobDescriptor(plan0);
  el.fault_hook = fault->library_hook();
  auto mesh = VESCALE_DEVICE_MESH.init_device_mesh("cpu", plan0.mesh.shape,
                                                   plan0.mesh.names, init);
  if (!mesh.ok()) return fail("init_device_mesh", mesh.status());
  vemesh::ElasticMesh& elastic = *VESCALE_DEVICE_MESH.elastic();
  auto plan = ReplanReplicas(plan0, elastic.last_recovery().dp_size);
  if (!plan.ok()) return fail("error", plan.status());
  // The model and how it trains, built once on the elastic mesh's groups
  // (the same objects in every epoch), named before HSDP frees the values.
  auto stage = ParallelMlpStage::Create(*plan);
  if (!stage.ok()) return fail("model", stage.status());
  vs::TrainingState state;
  if (absl::Status s = (*stage)->NameParameters(&state); !s.ok()) {
    return fail("model", s);
  }
  auto trainer = vs::DataParallelTrainer::Create(
      *mesh, (*stage)->fsdp_units(), TrainerOptions(*plan));
  mesh = absl::CancelledError("not kept: the registry has each epoch's");
  if (!trainer.ok()) return fail("model", trainer.status());
  if (absl::Status s = (*trainer)->AddTo(state); !s.ok()) {
    return fail("model", s);
  }
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
    return ElasticStep(*plan, **stage, **trainer, step,
                       [&](const char* where) { fault->At(where, step); });
  };
  hooks.on_recovery = [&](const vemesh::Recovery& r) -> absl::Status {
    plan = ReplanReplicas(plan0, r.dp_size);
    if (!plan.ok()) return plan.status();
    return (*stage)->Rebind(*plan);  // the data slice follows DP's size
  };
  fault->Wrap(hooks, state);
  auto done = vs::RunElasticLoop(elastic, state, loop, hooks);
  if (!done.ok()) return fail("elastic", done.status());
  if (done->evicted) {
    VESCALE_DEVICE_MESH.reset();
    return 3;
  }
  auto serial = SerialLosses(plan0);
  if (!serial.ok()) return fail("serial", serial.status());
  auto verdict = vs::JudgeElasticRun(*done, *serial, o.tolerance);
  if (!verdict.ok()) return fail("serial", verdict.status());
  if (launch_rank == 0) {
    std::printf("%s\n", verdict->line.c_str());
    std::fflush(stdout);
  }
  VESCALE_DEVICE_MESH.reset();
  return verdict->pass ? 0 : 1;
}

}  // namespace train_nd
