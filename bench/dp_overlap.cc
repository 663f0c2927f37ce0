// bench/dp_overlap.cc
//
// What overlapping the DP gradient all_reduce with the backward pass buys:
// one data-parallel training step of a layered model, timed with
// DataParallel's overlap on (each layer's bucket starts reducing as soon as
// its backward is done) and off (every bucket reduced, blocking, after the
// backward), alternated in one mpirun job over the whole world as DP.
//
//   mpirun --oversubscribe -n 4 build/bench/dp_overlap --reps=21
//
// The "backward" of a layer is real compute (an n x n matrix product, n =
// --work) followed by writing its gradient (--elements doubles per layer).
// A sample is the slowest rank's time for one step. Each repetition takes
// one sample of each mode, in an order that alternates, plus a compute-only
// step (no DP sync: the floor) and a sync-only step (no compute: the cost
// overlap tries to hide). The table prints the medians and the median of
// the paired ratios overlap / blocking.

#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/mpi_bench.h"
#include "vemesh/registry/ve_device_mesh.h"
#include "vemesh/strategies/data_parallel.h"
#include "vemesh/strategies/dense.h"

ABSL_FLAG(int, layers, 8, "layers of the model (one parameter each)");
ABSL_FLAG(int64_t, elements, 131072, "gradient doubles per layer");
ABSL_FLAG(int, work, 192, "per-layer backward compute: an n x n matmul");
ABSL_FLAG(int64_t, bucket_elements, 131072, "DataParallel bucket size");
ABSL_FLAG(int, reps, 21, "paired samples");
ABSL_FLAG(bool, bf16, false, "communicate the gradients in bfloat16");
ABSL_FLAG(bool, smoke, false, "one small repetition: proves the program works");

namespace vemesh::bench {
namespace {

using strategies::DataParallel;
using strategies::GradientType;
using strategies::Matrix;
using strategies::Parameter;

struct Model {
  std::vector<Parameter> params;
  Matrix a, b, c;   // the compute of one layer's backward
  double sink = 0;  // keeps the compute from being optimised away

  // Layer l's backward: compute, then its gradient.
  void Backward(int l) {
    c.noalias() = a * b;
    sink += c(0, 0);
    params[l].grad.setConstant(1e-3 * (l + 1) + 1e-9 * sink);
  }
};

enum class Mode { kOverlap, kBlocking, kComputeOnly, kSyncOnly };

// Seconds of one step (the slowest rank's).
double Step(Model& m, DataParallel* dp, Mode mode) {
  std::vector<Parameter*> ptrs;
  for (Parameter& p : m.params) ptrs.push_back(&p);
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  const bool sync = mode != Mode::kComputeOnly;
  if (sync) Check(dp->PrepareGradientSync(ptrs), "PrepareGradientSync");
  for (int l = static_cast<int>(m.params.size()) - 1; l >= 0; --l) {
    if (mode != Mode::kSyncOnly) m.Backward(l);
    if (sync) Check(dp->MarkGradientReady(&m.params[l]), "MarkGradientReady");
  }
  if (sync) Check(dp->FinishGradientSync().status(), "FinishGradientSync");
  return MaxOverRanks(MPI_Wtime() - start);
}

void Run(int reps, bool smoke) {
  int world = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  auto mesh = VESCALE_DEVICE_MESH.init_device_mesh("cpu", {world}, {"DP"});
  if (!mesh.ok())
    Die(absl::StrCat("init_device_mesh: ", mesh.status().ToString()));

  const int layers = smoke ? 2 : absl::GetFlag(FLAGS_layers);
  const int64_t elements = smoke ? 1000 : absl::GetFlag(FLAGS_elements);
  const int work = smoke ? 16 : absl::GetFlag(FLAGS_work);
  const size_t bucket =
      static_cast<size_t>(smoke ? 500 : absl::GetFlag(FLAGS_bucket_elements));
  const GradientType type = absl::GetFlag(FLAGS_bf16) ? GradientType::kBFloat16
                                                      : GradientType::kFloat64;
  Model m;
  for (int l = 0; l < layers; ++l) {
    m.params.emplace_back(absl::StrCat("layer", l), Matrix::Zero(1, elements));
  }
  m.a = Matrix::Constant(work, work, 0.5);
  m.b = Matrix::Constant(work, work, 0.25);
  DataParallel overlap(
      {.bucket_elements = bucket, .overlap = true, .gradient_type = type});
  DataParallel blocking(
      {.bucket_elements = bucket, .overlap = false, .gradient_type = type});

  Step(m, &overlap, Mode::kOverlap);  // warm-up: buffers, connections
  Step(m, &blocking, Mode::kBlocking);
  std::vector<double> on, off, compute, comm, ratio;
  for (int r = 0; r < reps; ++r) {
    double t_on, t_off;
    if (r % 2 == 0) {
      t_on = Step(m, &overlap, Mode::kOverlap);
      t_off = Step(m, &blocking, Mode::kBlocking);
    } else {
      t_off = Step(m, &blocking, Mode::kBlocking);
      t_on = Step(m, &overlap, Mode::kOverlap);
    }
    on.push_back(t_on);
    off.push_back(t_off);
    ratio.push_back(t_on / t_off);
    compute.push_back(Step(m, nullptr, Mode::kComputeOnly));
    comm.push_back(Step(m, &blocking, Mode::kSyncOnly));
  }
  if (rank == 0) {
    std::printf(
        "dp_overlap: DP=%d, %d layers x %lld %s gradient values, buckets of "
        "%zu, backward %dx%d matmul per layer, %d paired samples\n",
        world, layers, static_cast<long long>(elements),
        type == GradientType::kBFloat16 ? "bf16" : "double", bucket, work, work,
        reps);
    std::printf("| step | median ms | min ms |\n|---|---:|---:|\n");
    auto row = [](const char* what, const std::vector<double>& v) {
      std::printf("| %s | %.3f | %.3f |\n", what, 1e3 * Median(v),
                  1e3 * Min(v));
    };
    row("compute only (no DP sync)", compute);
    row("DP sync only (no compute)", comm);
    row("blocking: backward, then all_reduce", off);
    row("overlap: all_reduce during backward", on);
    std::printf("median paired ratio overlap / blocking: %.3f\n",
                Median(ratio));
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
