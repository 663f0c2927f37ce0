// bench/zero_bench.cc
//
// The distributed optimizer (ZeRO-1/2) against DDP (DataParallel, then the
// same optimizer on every rank) at DP = 2, 4 and 8 in one mpirun job: the
// per-rank training state (parameters + gradients + optimizer state kept
// across steps, from DistributedOptimizer::memory() and
// ReplicatedStateBytes) and the time of one gradient sync + optimizer step.
//
//   mpirun --oversubscribe -n 8 build/release/bench/zero_bench --reps=9
//
// For DP = P the mesh is (8 / P, P) named ("REPLICA", "DP"): every DP group
// runs at once, as in a job with other dimensions. A sample is the slowest
// rank's time from the gradients being ready to the parameters updated on
// every rank; the modes rotate within each repetition.

#include <mpi.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/mpi_bench.h"
#include "vemesh/registry/ve_device_mesh.h"
#include "vemesh/strategies/data_parallel.h"
#include "vemesh/strategies/distributed_optimizer.h"
#include "vemesh/strategies/optimizer.h"

ABSL_FLAG(int, layers, 8, "parameters of the model");
ABSL_FLAG(int64_t, elements, 65537,
          "doubles per parameter (odd: the shards need padding)");
ABSL_FLAG(int, reps, 9, "samples of each mode per DP size");
ABSL_FLAG(bool, smoke, false, "one small repetition: proves the program works");

namespace vemesh::bench {
namespace {

using strategies::DataParallel;
using strategies::DistributedOptimizer;
using strategies::Matrix;
using strategies::Optimizer;
using strategies::OptimizerOptions;
using strategies::Parameter;
using strategies::TrainingStateBytes;
using strategies::ZeroStage;

std::vector<Parameter> MakeModel(int layers, int64_t elements) {
  std::vector<Parameter> ps;
  for (int l = 0; l < layers; ++l) {
    ps.emplace_back(absl::StrCat("layer", l),
                    Matrix::Constant(1, elements, 0.01 * (l + 1)));
  }
  return ps;
}

std::vector<Parameter*> Pointers(std::vector<Parameter>& ps) {
  std::vector<Parameter*> out;
  for (Parameter& p : ps) out.push_back(&p);
  return out;
}

void FillGrads(std::vector<Parameter>& ps, int rank) {
  for (size_t l = 0; l < ps.size(); ++l) {
    ps[l].grad.setConstant(1e-3 * (rank + 1) + 1e-4 * l);
  }
}

// One training step's optimizer half, timed on the slowest rank.
template <typename F>
double Timed(F&& step) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  step();
  return MaxOverRanks(MPI_Wtime() - start);
}

void Run(int reps, bool smoke) {
  int world = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int layers = smoke ? 2 : absl::GetFlag(FLAGS_layers);
  const int64_t elements = smoke ? 101 : absl::GetFlag(FLAGS_elements);
  const size_t n = static_cast<size_t>(layers * elements);
  const OptimizerOptions adam = OptimizerOptions::AdamW(1e-3);
  const OptimizerOptions sgd = OptimizerOptions::Sgd(0.1);

  if (rank == 0) {
    std::printf(
        "zero_bench: %d ranks, %d parameters x %lld doubles = %zu values "
        "(%zu bytes), %d samples per mode\n",
        world, layers, static_cast<long long>(elements), n, 8 * n, reps);
    std::printf(
        "\n| DP | optimizer | DDP bytes/rank | ZeRO-1 bytes/rank | ZeRO-1 / "
        "DDP | ZeRO-2 bytes/rank | ZeRO-2 / DDP |\n"
        "|---:|---|---:|---:|---:|---:|---:|\n");
  }
  struct Times {
    int dp;
    std::vector<double> ddp, zero1, zero2;
  };
  std::vector<Times> times;
  for (int p = 2; p <= world; p *= 2) {
    if (world % p != 0) continue;
    auto mesh = VESCALE_DEVICE_MESH.init_device_mesh("cpu", {world / p, p},
                                                     {"REPLICA", "DP"});
    if (!mesh.ok())
      Die(absl::StrCat("init_device_mesh: ", mesh.status().ToString()));
    const int dp_rank =
        static_cast<int>(*VESCALE_DEVICE_MESH.get_data_parallel_rank());

    // Memory, for both optimizers.
    for (const OptimizerOptions* o : {&sgd, &adam}) {
      std::vector<Parameter> ps = MakeModel(layers, elements);
      auto z1 = DistributedOptimizer::Create(
          {.optimizer = *o, .stage = ZeroStage::kOne}, Pointers(ps));
      Check(z1.status(), "DistributedOptimizer::Create");
      auto z2 = DistributedOptimizer::Create(
          {.optimizer = *o, .stage = ZeroStage::kTwo}, Pointers(ps));
      Check(z2.status(), "DistributedOptimizer::Create");
      const TrainingStateBytes ddp = strategies::ReplicatedStateBytes(*o, n);
      const size_t m1 = (*z1)->memory().total();
      const size_t m2 = (*z2)->memory().total();
      if (rank == 0) {
        std::printf("| %d | %s | %zu | %zu | %.3f | %zu | %.3f |\n", p,
                    std::string(strategies::OptimizerKindName(o->kind)).c_str(),
                    ddp.total(), m1, static_cast<double>(m1) / ddp.total(), m2,
                    static_cast<double>(m2) / ddp.total());
      }
    }

    // Step time with AdamW: DDP, ZeRO-1, ZeRO-2, each on its own model.
    std::vector<Parameter> m_ddp = MakeModel(layers, elements);
    std::vector<Parameter> m_z1 = MakeModel(layers, elements);
    std::vector<Parameter> m_z2 = MakeModel(layers, elements);
    DataParallel dp({.bucket_elements = size_t{1} << 20, .overlap = false});
    auto local = Optimizer::Create(adam, Pointers(m_ddp));
    Check(local.status(), "Optimizer::Create");
    auto z1 = DistributedOptimizer::Create(
        {.optimizer = adam, .stage = ZeroStage::kOne}, Pointers(m_z1));
    Check(z1.status(), "DistributedOptimizer::Create");
    auto z2 = DistributedOptimizer::Create(
        {.optimizer = adam, .stage = ZeroStage::kTwo}, Pointers(m_z2));
    Check(z2.status(), "DistributedOptimizer::Create");
    auto ddp_step = [&] {
      Check(dp.AverageGradients(Pointers(m_ddp)).status(), "AverageGradients");
      Check(local->Step(), "Optimizer::Step");
    };
    auto z1_step = [&] { Check((*z1)->Step().status(), "ZeRO-1 Step"); };
    auto z2_step = [&] { Check((*z2)->Step().status(), "ZeRO-2 Step"); };
    Times t{p, {}, {}, {}};
    for (int r = -1; r < reps; ++r) {  // r = -1: warm-up, not recorded
      FillGrads(m_ddp, dp_rank);
      (*z1)->ZeroGrad();
      (*z2)->ZeroGrad();
      FillGrads(m_z1, dp_rank);
      FillGrads(m_z2, dp_rank);
      double a = 0, b = 0, c = 0;
      switch ((r + 3) % 3) {
        case 0:
          a = Timed(ddp_step), b = Timed(z1_step), c = Timed(z2_step);
          break;
        case 1:
          b = Timed(z1_step), c = Timed(z2_step), a = Timed(ddp_step);
          break;
        default:
          c = Timed(z2_step), a = Timed(ddp_step), b = Timed(z1_step);
      }
      if (r < 0) continue;
      t.ddp.push_back(a);
      t.zero1.push_back(b);
      t.zero2.push_back(c);
    }
    // The three must agree: the same gradients, the same rule.
    const double diff1 = (m_ddp[0].value - m_z1[0].value).cwiseAbs().maxCoeff();
    const double diff2 = (m_ddp[0].value - m_z2[0].value).cwiseAbs().maxCoeff();
    if (diff1 > 1e-12 || diff2 > 1e-12) {
      Die(absl::StrCat("ZeRO and DDP disagree: ", diff1, ", ", diff2));
    }
    times.push_back(std::move(t));
  }
  if (rank == 0) {
    std::printf(
        "\nAdamW gradient sync + step, median / min ms (slowest rank); bytes "
        "sent per rank by ring algorithms, B = %zu:\n\n"
        "| DP | DDP (all_reduce + step) | ZeRO-1 (all_reduce + shard step + "
        "all_gather) | ZeRO-2 (reduce_scatter + shard step + all_gather) | "
        "DDP, ZeRO-2 bytes 2(P-1)/P B | ZeRO-1 bytes 3(P-1)/P B |\n"
        "|---:|---:|---:|---:|---:|---:|\n",
        8 * n);
    for (const Times& t : times) {
      const double b = 8.0 * n * (t.dp - 1) / t.dp;
      std::printf(
          "| %d | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f | %.0f | %.0f |\n",
          t.dp, 1e3 * Median(t.ddp), 1e3 * Min(t.ddp), 1e3 * Median(t.zero1),
          1e3 * Min(t.zero1), 1e3 * Median(t.zero2), 1e3 * Min(t.zero2), 2 * b,
          3 * b);
    }
    std::fflush(stdout);
  }
  VESCALE_DEVICE_MESH.reset();
}

}  // namespace
}  // namespace vemesh::bench

int main(int argc, char** argv) {
  using namespace vemesh::bench;
  MPI_Init(&argc, &argv);
  absl::ParseCommandLine(argc, argv);
  const bool smoke = absl::GetFlag(FLAGS_smoke);
  Run(smoke ? 1 : absl::GetFlag(FLAGS_reps), smoke);
  MPI_Finalize();
  return 0;
}
