#include "elastic_loop.h"

#include <cstdio>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint_state.h"
#include "fault_injection.h"
#include "train_step.h"
#include "vemesh/comm/mpi/mpi_communicator.h"
#include "vemesh/registry/ve_device_mesh.h"
#include "vemesh/strategies/elastic_verdict.h"

namespace train_nd {
namespace {

namespace vs = vemesh::strategies;

// The model and how it trains, built once on the elastic mesh's groups (the
// same objects in every epoch); `state` names both for the library.
struct Replica {
  std::unique_ptr<ParallelMlpStage> stage;
  std::unique_ptr<vs::DataParallelTrainer> trainer;
  vs::TrainingState state;
};

absl::StatusOr<std::unique_ptr<Replica>> BuildReplica(const TrainPlan& plan) {
  auto r = std::make_unique<Replica>();
  auto stage = ParallelMlpStage::Create(plan);
  if (!stage.ok()) return stage.status();
  r->stage = *std::move(stage);
  absl::StatusOr<vemesh::DeviceMesh> mesh = VESCALE_DEVICE_MESH.get();
  if (!mesh.ok()) return mesh.status();
  std::vector<vs::FsdpUnit> units;
  int l = r->stage->first_layer();
  for (std::vector<vs::Parameter*>& ps : r->stage->layer_parameters()) {
    units.push_back({absl::StrCat("layer", l++), std::move(ps)});
  }
  // The model named before HSDP frees the parameters, then how it trains.
  absl::Status s =
      NameTrainingState(plan, {.stage = r->stage.get()}, &r->state);
  if (!s.ok()) return s;
  auto trainer = vs::DataParallelTrainer::Create(*mesh, std::move(units),
                                                 TrainerOptions(plan));
  if (!trainer.ok()) return trainer.status();
  r->trainer = *std::move(trainer);
  s = r->trainer->AddTo(r->state);
  if (!s.ok()) return s;
  return r;
}

}  // namespace

int RunElastic(const TrainPlan& plan0, const ElasticSettings& settings,
               int launch_rank) {
  const int replica = settings.options.replica;
  auto fail = [&](const char* what, const absl::Status& status) {
    std::fprintf(stderr, "[replica %d rank %d] train_nd: %s: %s\n", replica,
                 launch_rank, what, status.ToString().c_str());
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
  // The epoch-1 mesh is not kept: the registry hands out each epoch's.
  if (absl::Status s =
          VESCALE_DEVICE_MESH
              .init_device_mesh("cpu", plan0.mesh.shape, plan0.mesh.names, init)
              .status();
      !s.ok()) {
    return fail("init_device_mesh", s);
  }
  vemesh::ElasticMesh* elastic = VESCALE_DEVICE_MESH.elastic();
  auto plan = ReplanReplicas(plan0, elastic->last_recovery().dp_size);
  if (!plan.ok()) return fail("error", plan.status());
  auto built = BuildReplica(*plan);
  if (!built.ok()) return fail("model", built.status());
  Replica& rep = **built;
  const TrainOptions& o = plan0.options;
  vs::ElasticLoopOptions loop{.steps = o.steps,
                              .log = launch_rank == 0 ? stdout : nullptr,
                              .pace = settings.pace,
                              .compare_replicas = true};
  if (!o.checkpoint_dir.empty()) {  // over the replica's own ranks
    auto world = vemesh::MpiCommunicator::World();
    if (!world.ok()) return fail("checkpoint", world.status());
    loop.checkpoint_world = *world;
    loop.periodic_checkpoint = {.dir = o.checkpoint_dir,
                                .every = o.checkpoint_every,
                                .keep_last = o.checkpoint_keep,
                                .identity = CheckpointIdentity(plan0)};
  }
  vs::ElasticLoopHooks hooks;
  hooks.step = [&](int64_t step) {
    return ElasticStep(*plan, *rep.stage, *rep.trainer, step,
                       [&](const char* where) { fault->At(where, step); });
  };
  hooks.on_recovery = [&](const vemesh::Recovery& r) -> absl::Status {
    plan = ReplanReplicas(plan0, r.dp_size);
    if (!plan.ok()) return plan.status();
    return rep.stage->Rebind(*plan);  // the data slice follows DP's size
  };
  fault->Wrap(hooks, rep.state);
  auto done = vs::RunElasticLoop(*elastic, rep.state, loop, hooks);
  if (!done.ok()) return fail("elastic", done.status());
  if (done->evicted) {
    VESCALE_DEVICE_MESH.reset();
    return 3;
  }
  absl::StatusOr<std::vector<double>> serial = SerialLosses(plan0);
  if (!serial.ok()) return fail("serial", serial.status());
  auto curve = vs::CompareLossCurve(done->losses, *serial);
  if (!curve.ok()) return fail("serial", curve.status());
  vs::ElasticVerdict verdict = vs::JudgeElasticRun(*done, *curve, o.tolerance);
  if (launch_rank == 0) {
    std::printf("%s\n", verdict.line.c_str());
    std::fflush(stdout);
  }
  VESCALE_DEVICE_MESH.reset();
  return verdict.pass ? 0 : 1;
}

}  // namespace train_nd
