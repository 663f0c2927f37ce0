// bench/fsdp_bench.cc
//
// Fully sharded data parallelism against DDP on one MLP (examples/hsdp's
// model, --layers units of --width x --width), in one mpirun job over the
// whole world:
//   1. per-rank state memory (parameters + gradients + AdamW state) at
//      shard 2, 4, 8 (replicated over the rest) against DDP's, with the goal
//      1/S of DDP plus one unit's gathered parameters;
//   2. step time (forward, backward, gradient sync, AdamW step) of FSDP
//      (FULL_SHARD over the world), HSDP (HYBRID_SHARD, shard = --shard) and
//      DDP (DataParallel::AverageGradients after the backward), with FSDP's
//      prefetch on (1) and off (0), samples alternated;
//   3. bytes sent per rank per step, as FSDP counts them (padding included)
//      against the closed form: FSDP 2 all_gathers + 1 reduce_scatter of the
//      parameters, (S - 1) / S each; DDP one ring all_reduce, 2 (P - 1) / P.
//
//   mpirun --oversubscribe -n 8 build/release/bench/fsdp_bench --reps=9
//
// A sample is the slowest rank's time for one step; the table prints the
// median and the minimum.

#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/mpi_bench.h"
#include "toy_model.h"
#include "vemesh/registry/ve_device_mesh.h"
#include "vemesh/strategies/data_parallel.h"
#include "vemesh/strategies/fully_sharded_data_parallel.h"
#include "vemesh/strategies/optimizer.h"

ABSL_FLAG(int, layers, 8, "Linear layers (one FSDP unit each)");
ABSL_FLAG(int64_t, width, 256, "features of every layer");
ABSL_FLAG(int, batch, 256, "global batch (divisible by the world size)");
ABSL_FLAG(int, shard, 4, "HSDP's shard group size (divides the world)");
ABSL_FLAG(int, reps, 9, "samples of each mode");
ABSL_FLAG(bool, smoke, false, "one small repetition: proves the program works");

namespace vemesh::bench {
namespace {

using hsdp::Batch;
using hsdp::ToyModel;
using strategies::DataParallel;
using strategies::FsdpOptions;
using strategies::FullyShardedDataParallel;
using strategies::Optimizer;
using strategies::OptimizerOptions;
using strategies::ShardingStrategy;

const OptimizerOptions kAdam = OptimizerOptions::AdamW(1e-3);

std::vector<int64_t> Dims(int layers, int64_t width) {
  return std::vector<int64_t>(static_cast<size_t>(layers) + 1, width);
}

size_t Elements(ToyModel& m) {
  size_t n = 0;
  for (strategies::Parameter* p : m.parameters()) {
    n += static_cast<size_t>(p->value.size());
  }
  return n;
}

struct Fsdp {
  std::string name;
  ToyModel model;
  std::unique_ptr<FullyShardedDataParallel> fsdp;
};

Fsdp MakeFsdp(const std::string& name, const DeviceMesh& mesh,
              const std::vector<int64_t>& dims, FsdpOptions options) {
  Fsdp f{name, hsdp::MakeToyModel(dims), nullptr};
  auto made = FullyShardedDataParallel::Create(mesh, f.model.Units(), options);
  Check(made.status(), "FullyShardedDataParallel::Create");
  f.fsdp = std::make_unique<FullyShardedDataParallel>(*std::move(made));
  Check(f.fsdp->SetOptimizer(kAdam), "SetOptimizer");
  return f;
}

double FsdpStep(Fsdp& f, const Batch& b) {
  const int64_t rows = b.x.rows() / f.fsdp->dp_size();
  const int64_t first = f.fsdp->dp_rank() * rows;
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  Check(
      hsdp::ForwardBackward(f.model, f.fsdp.get(), b.x.middleRows(first, rows),
                            b.y.middleRows(first, rows))
          .status(),
      "ForwardBackward");
  Check(f.fsdp->FinishBackward(), "FinishBackward");
  Check(f.fsdp->OptimizerStep(), "OptimizerStep");
  f.fsdp->ZeroGrad();
  return MaxOverRanks(MPI_Wtime() - start);
}

struct Ddp {
  ToyModel model;
  std::unique_ptr<DataParallel> dp;
  std::unique_ptr<Optimizer> opt;
};

double DdpStep(Ddp& d, const Batch& b, int world, int rank) {
  const int64_t rows = b.x.rows() / world;
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  Check(
      hsdp::ForwardBackward(d.model, nullptr, b.x.middleRows(rank * rows, rows),
                            b.y.middleRows(rank * rows, rows))
          .status(),
      "ForwardBackward");
  Check(d.dp->AverageGradients(d.model.parameters()).status(),
        "AverageGradients");
  Check(d.opt->Step(), "Optimizer::Step");
  d.opt->ZeroGrad();
  return MaxOverRanks(MPI_Wtime() - start);
}

void Run(bool smoke) {
  int world = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int layers = smoke ? 2 : absl::GetFlag(FLAGS_layers);
  const int64_t width = smoke ? 16 : absl::GetFlag(FLAGS_width);
  const int batch = smoke ? 8 * world : absl::GetFlag(FLAGS_batch);
  const int reps = smoke ? 1 : absl::GetFlag(FLAGS_reps);
  int shard = absl::GetFlag(FLAGS_shard);
  if (shard > world || world % shard != 0) shard = world;
  if (batch % world != 0) Die("--batch must be divisible by the world size");
  const std::vector<int64_t> dims = Dims(layers, width);
  const bool print = rank == 0;

  // DDP through the registry (DataParallel asks it for DP).
  auto dp_mesh = VESCALE_DEVICE_MESH.init_device_mesh("cpu", {world}, {"DP"});
  Check(dp_mesh.status(), "init_device_mesh DP");
  Ddp ddp{hsdp::MakeToyModel(dims), std::make_unique<DataParallel>(), nullptr};
  {
    auto opt = Optimizer::Create(kAdam, ddp.model.parameters());
    Check(opt.status(), "Optimizer::Create");
    ddp.opt = std::make_unique<Optimizer>(*std::move(opt));
  }
  const size_t numel = Elements(ddp.model);
  const size_t ddp_bytes = 2 * numel * sizeof(double) + ddp.opt->state_bytes();
  const size_t unit_bytes =
      static_cast<size_t>(width * width + width) * sizeof(double);

  // 1. Memory at shard 2, 4, 8 (HYBRID_SHARD over (world / S, S)).
  if (print) {
    std::printf(
        "fsdp_bench: %d ranks, %d units of %lldx%lld (+bias), %zu parameters "
        "(%zu bytes), AdamW, global batch %d\n",
        world, layers, static_cast<long long>(width),
        static_cast<long long>(width), numel, numel * sizeof(double), batch);
    std::printf(
        "\n| shard S | state bytes/rank | DDP bytes/rank | state / DDP | "
        "state + gathered peak | goal: DDP/S + 1 unit's params and grads |"
        "\n|---:|---:|---:|---:|---:|---:|\n");
  }
  for (int s : {2, 4, 8}) {
    if (s > world || world % s != 0) continue;
    auto mesh = init_device_mesh("cpu", {world / s, s}, {"replicate", "shard"});
    Check(mesh.status(), "init_device_mesh");
    Fsdp f = MakeFsdp("hsdp", *mesh, dims,
                      {.sharding_strategy = ShardingStrategy::kHybridShard});
    const strategies::FsdpMemory m = f.fsdp->MemoryUsage();
    if (print) {
      std::printf("| %d | %zu | %zu | %.3f | %zu | %zu |\n", s, m.state(),
                  ddp_bytes, static_cast<double>(m.state()) / ddp_bytes,
                  m.state() + m.gathered_peak, ddp_bytes / s + 2 * unit_bytes);
    }
  }

  // 2. and 3. Step time and bytes.
  auto flat = init_device_mesh("cpu", {world}, {"dp"});
  Check(flat.status(), "init_device_mesh dp");
  auto two_d =
      init_device_mesh("cpu", {world / shard, shard}, {"replicate", "shard"});
  Check(two_d.status(), "init_device_mesh 2-D");
  std::vector<Fsdp> modes;
  for (int prefetch : {0, 1}) {
    modes.push_back(MakeFsdp(
        absl::StrCat("FSDP FULL_SHARD S=", world, ", prefetch ", prefetch),
        *flat, dims, {.prefetch = prefetch}));
    modes.push_back(
        MakeFsdp(absl::StrCat("HSDP (", world / shard, ", ", shard,
                              "), prefetch ", prefetch),
                 *two_d, dims,
                 {.sharding_strategy = ShardingStrategy::kHybridShard,
                  .prefetch = prefetch}));
  }
  std::vector<std::vector<double>> times(modes.size() + 1);
  const Batch b = hsdp::SyntheticBatch(ddp.model, 0, batch);
  // Warm-up: buffers, connections.
  for (Fsdp& f : modes) FsdpStep(f, b);
  DdpStep(ddp, b, world, rank);
  std::vector<int64_t> bytes_before;
  for (Fsdp& f : modes) bytes_before.push_back(f.fsdp->counters().bytes_sent);
  for (int r = 0; r < reps; ++r) {
    // Rotate the order so no mode always runs first.
    const size_t n = modes.size() + 1;
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (k + r) % n;
      times[i].push_back(i == modes.size() ? DdpStep(ddp, b, world, rank)
                                           : FsdpStep(modes[i], b));
    }
  }
  if (print) {
    std::printf("\n| step | median ms | min ms |\n|---|---:|---:|\n");
    for (size_t i = 0; i < modes.size(); ++i) {
      std::printf("| %s | %.3f | %.3f |\n", modes[i].name.c_str(),
                  1e3 * Median(times[i]), 1e3 * Min(times[i]));
    }
    std::printf(
        "| DDP (DataParallel, all_reduce after backward) | %.3f | "
        "%.3f |\n",
        1e3 * Median(times.back()), 1e3 * Min(times.back()));
    const double p = static_cast<double>(numel * sizeof(double));
    std::printf(
        "\n| bytes sent per rank per step | counted | theory |\n|---|---:|---:|"
        "\n");
    for (size_t i = 0; i < 2; ++i) {  // the prefetch 0 FSDP and HSDP
      const FullyShardedDataParallel& f = *modes[i].fsdp;
      const double sent =
          static_cast<double>(f.counters().bytes_sent - bytes_before[i]) / reps;
      const double s = f.shard_size(), rr = f.replicate_size();
      const double theory = 3 * (s - 1) / s * p + 2 * (rr - 1) / rr * p / s;
      std::printf("| %s | %.0f | %.0f |\n",
                  i == 0 ? "FSDP: 2 all_gather + reduce_scatter"
                         : "HSDP: + all_reduce of the shard over replicate",
                  sent, theory);
    }
    std::printf("| DDP: one ring all_reduce | - | %.0f |\n",
                2.0 * (world - 1) / world * p);
    std::fflush(stdout);
  }
  modes.clear();
  VESCALE_DEVICE_MESH.reset();
}

}  // namespace
}  // namespace vemesh::bench

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  absl::ParseCommandLine(argc, argv);
  vemesh::bench::Run(absl::GetFlag(FLAGS_smoke));
  MPI_Finalize();
  return 0;
}
