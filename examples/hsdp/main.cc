// hsdp: the seeds' HSDP example in C++. PyTorch's
//
//   mesh_2d = init_device_mesh("cuda", (2, 4), mesh_dim_names=("replicate",
//                                                              "shard"))
//   model = FSDP(ToyModel(), device_mesh=mesh_2d,
//                sharding_strategy=ShardingStrategy.HYBRID_SHARD)
//
// is here init_device_mesh + FullyShardedDataParallel::Create with
// kHybridShard: parameters sharded over "shard", replicated over
// "replicate". It trains on synthetic data and checks every step's loss and
// the final parameters against a serial run of the same model; the last
// line is PASS or FAIL (exit code 1).
//
//   mpirun -n 8 hsdp                       # (replicate, shard) = (2, 4)
//   torchrun --no_python --standalone --nproc_per_node=8 hsdp
//   mpirun -n 8 hsdp --mesh replicate=4,shard=2 --optimizer sgd
//   hsdp --device cuda --mesh replicate=1,shard=1
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "toy_model.h"
#include "vemesh/bootstrap/launch_session.h"
#include "vemesh/layout/mesh_spec.h"
#include "vemesh/mesh/device_mesh.h"
#include "vemesh/strategies/fully_sharded_data_parallel.h"
#include "vemesh/strategies/optimizer.h"

ABSL_FLAG(std::string, mesh, "replicate=2,shard=4",
          "the 2-D mesh: the first dimension replicates, the second shards");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");
ABSL_FLAG(std::string, optimizer, "adam", "sgd or adam (AdamW)");
ABSL_FLAG(std::string, strategy, "hybrid_shard",
          "full_shard, shard_grad_op, hybrid_shard or no_shard");
ABSL_FLAG(int, steps, 10, "training steps");
ABSL_FLAG(int, batch, 64, "global batch (divisible by replicate x shard)");
ABSL_FLAG(int, prefetch, 1, "all_gathers started ahead (0: off)");
ABSL_FLAG(bool, bf16, false, "gather parameters and reduce gradients in bf16");
ABSL_FLAG(double, tolerance, 1e-8,
          "largest relative difference from the serial run that passes");

namespace hsdp {
namespace {

using vemesh::strategies::FsdpOptions;
using vemesh::strategies::FullyShardedDataParallel;
using vemesh::strategies::MixedPrecision;
using vemesh::strategies::Optimizer;
using vemesh::strategies::OptimizerOptions;

// `rank` is -1 before the mesh exists.
int Fail(int rank, const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "%shsdp: %s: %s\n",
               rank < 0 ? "" : absl::StrCat("[rank ", rank, "] ").c_str(),
               what.c_str(), std::string(s.message()).c_str());
  std::printf("FAIL %s: %s\n", what.c_str(), std::string(s.message()).c_str());
  std::fflush(stdout);
  return 1;
}

absl::StatusOr<OptimizerOptions> OptimizerFromFlag() {
  const std::string name = absl::GetFlag(FLAGS_optimizer);
  if (name == "sgd") return OptimizerOptions::Sgd(0.05);
  if (name == "adam" || name == "adamw") return OptimizerOptions::AdamW(0.01);
  return absl::InvalidArgumentError(absl::StrCat(
      "--optimizer '", name, "' is unknown; expected sgd or adam"));
}

// |a - b| / max|b| over all elements (0 for equal).
double RelativeDifference(const Matrix& a, const Matrix& b) {
  const double scale = std::max(b.cwiseAbs().maxCoeff(), 1e-300);
  return (a - b).cwiseAbs().maxCoeff() / scale;
}

int Run() {
  const std::vector<int64_t> dims = {10, 10, 5};  // the seeds' ToyModel
  absl::StatusOr<vemesh::MeshSpec> spec =
      vemesh::ParseMeshSpec(absl::GetFlag(FLAGS_mesh));
  if (!spec.ok()) return Fail(-1, "--mesh", spec.status());
  if (spec->shape.size() != 2) {
    return Fail(
        -1, "--mesh",
        absl::InvalidArgumentError(absl::StrCat(
            "--mesh '", absl::GetFlag(FLAGS_mesh), "' has ", spec->shape.size(),
            " dimensions; expected 2 (replicate=R,shard=S)")));
  }
  absl::StatusOr<OptimizerOptions> opt = OptimizerFromFlag();
  if (!opt.ok()) return Fail(-1, "--optimizer", opt.status());
  absl::StatusOr<vemesh::strategies::ShardingStrategy> strategy =
      vemesh::strategies::ParseShardingStrategy(absl::GetFlag(FLAGS_strategy));
  if (!strategy.ok()) return Fail(-1, "--strategy", strategy.status());

  absl::StatusOr<vemesh::DeviceMesh> mesh = vemesh::init_device_mesh(
      absl::GetFlag(FLAGS_device), spec->shape, spec->names);
  if (!mesh.ok()) return Fail(-1, "init_device_mesh", mesh.status());
  const int rank = static_cast<int>(mesh->global_rank());
  const bool print = rank == 0;
  const int dp = static_cast<int>(spec->shape[0] * spec->shape[1]);
  const int batch = absl::GetFlag(FLAGS_batch);
  if (batch < dp || batch % dp != 0) {
    return Fail(rank, "--batch",
                absl::InvalidArgumentError(absl::StrCat(
                    "--batch=", batch, " is not a positive multiple of ",
                    "replicate x shard = ", dp)));
  }

  ToyModel model = MakeToyModel(dims);
  FsdpOptions options;
  options.sharding_strategy = *strategy;
  options.prefetch = absl::GetFlag(FLAGS_prefetch);
  if (absl::GetFlag(FLAGS_bf16)) {
    options.mixed_precision = MixedPrecision::kBFloat16;
  }
  absl::StatusOr<FullyShardedDataParallel> fsdp =
      FullyShardedDataParallel::Create(*mesh, model.Units(), options);
  if (!fsdp.ok()) return Fail(rank, "FSDP", fsdp.status());
  if (absl::Status s = fsdp->SetOptimizer(*opt); !s.ok()) {
    return Fail(rank, "optimizer", s);
  }
  // The data-parallel group, to average the loss for the curve.
  absl::StatusOr<std::shared_ptr<vemesh::Communicator>> all =
      mesh->flatten(spec->names);
  if (!all.ok()) return Fail(rank, "flatten", all.status());
  if (print) {
    std::printf("hsdp: %s\n", mesh->ToString().c_str());
    std::printf(
        "hsdp: ToyModel Linear(10,10) -> ReLU -> Linear(10,5), %s over %s "
        "(shard %d x replicate %d), %s, %d steps, batch %d, prefetch %d%s\n",
        std::string(ShardingStrategyName(*strategy)).c_str(),
        vemesh::FormatMeshSpec(*spec).c_str(), fsdp->shard_size(),
        fsdp->replicate_size(), absl::GetFlag(FLAGS_optimizer).c_str(),
        absl::GetFlag(FLAGS_steps), batch, options.prefetch,
        absl::GetFlag(FLAGS_bf16) ? ", bf16" : "");
    std::fflush(stdout);
  }

  const int steps = absl::GetFlag(FLAGS_steps);
  const int64_t rows = batch / dp;
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    const Batch b = SyntheticBatch(model, step, batch);
    absl::StatusOr<double> loss = ForwardBackward(
        model, &*fsdp, b.x.middleRows(fsdp->dp_rank() * rows, rows),
        b.y.middleRows(fsdp->dp_rank() * rows, rows));
    absl::Status s = loss.status();
    if (s.ok()) s = fsdp->FinishBackward();
    if (s.ok()) s = fsdp->OptimizerStep();
    if (!s.ok()) return Fail(rank, absl::StrCat("step ", step + 1), s);
    fsdp->ZeroGrad();
    double global = *loss / dp;
    if ((*all)->size() > 1) {
      s = (*all)->all_reduce(absl::MakeSpan(&global, 1),
                             vemesh::ReduceOp::kSum);
      if (!s.ok()) return Fail(rank, "loss all_reduce", s);
    }
    losses.push_back(global);
  }

  // The serial run: the same model, the whole batch, the same optimizer.
  ToyModel serial = MakeToyModel(dims);
  absl::StatusOr<Optimizer> serial_opt =
      Optimizer::Create(*opt, serial.parameters());
  if (!serial_opt.ok()) return Fail(rank, "serial", serial_opt.status());
  double worst = 0;
  int worst_step = 0;
  for (int step = 0; step < steps; ++step) {
    const Batch b = SyntheticBatch(serial, step, batch);
    absl::StatusOr<double> loss = ForwardBackward(serial, nullptr, b.x, b.y);
    if (!loss.ok()) return Fail(rank, "serial", loss.status());
    if (absl::Status s = serial_opt->Step(); !s.ok()) {
      return Fail(rank, "serial", s);
    }
    serial_opt->ZeroGrad();
    const double rel =
        std::abs(losses[step] - *loss) / std::max(std::abs(*loss), 1e-300);
    if (!(rel <= worst)) {  // NaN too
      worst = rel;
      worst_step = step + 1;
    }
  }
  double worst_param = 0;
  for (size_t u = 0; u < fsdp->num_units(); ++u) {
    absl::StatusOr<std::vector<Matrix>> full = fsdp->FullParameters(u);
    if (!full.ok()) return Fail(rank, "FullParameters", full.status());
    const std::vector<vemesh::strategies::Parameter*> want =
        serial.layers[u].parameters();
    for (size_t k = 0; k < want.size(); ++k) {
      const double rel = RelativeDifference((*full)[k], want[k]->value);
      if (!(rel <= worst_param)) worst_param = rel;
    }
  }

  const vemesh::strategies::FsdpMemory mem = fsdp->MemoryUsage();
  size_t numel = 0;
  for (vemesh::strategies::Parameter* p : serial.parameters()) {
    numel += static_cast<size_t>(p->value.size());
  }
  const size_t replicated =
      2 * numel * sizeof(double) + serial_opt->state_bytes();
  const double tolerance = absl::GetFlag(FLAGS_tolerance);
  const bool pass = worst < tolerance && worst_param < tolerance;
  if (print) {
    std::printf(
        "hsdp: memory: %zu bytes of parameters+gradients+optimizer state per "
        "rank (replicated: %zu); gathered at most %zu\n",
        mem.state(), replicated, mem.gathered_peak);
    std::printf(
        "%s: loss curve and parameters vs serial over %d steps: loss %.3g "
        "(step %d), parameters %.3g, %s %.0e; final loss %.6g\n",
        pass ? "PASS" : "FAIL", steps, worst, worst_step, worst_param,
        pass ? "<" : ">=", tolerance, losses.empty() ? 0.0 : losses.back());
    std::fflush(stdout);
  }
  return pass ? 0 : 1;
}

}  // namespace
}  // namespace hsdp

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "The seeds' HSDP example: ToyModel under HYBRID_SHARD on a (replicate, "
      "shard) mesh, checked against a serial run.\n  mpirun -n 8 hsdp\n"
      "  torchrun --no_python --standalone --redirects 1 --tee 1 "
      "--nproc_per_node=8 hsdp");
  absl::ParseCommandLine(argc, argv);
  // MPI only when an MPI launcher started the job (or none did: a single
  // process); torchrun / env:// jobs run on Gloo and never start MPI
  // (vemesh/bootstrap/launch_session.h).
  vemesh::LaunchSession launch(&argc, &argv);
  if (!launch.status().ok()) {
    const std::string message(launch.status().message());
    std::fprintf(stderr, "hsdp: %s\n", message.c_str());
    std::printf("FAIL launch: %s\n", message.c_str());
    return launch.launch().reason.empty() ? 2 : 1;
  }
  return hsdp::Run();
}
