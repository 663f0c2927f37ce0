// bench/nccl_init.cc
//
// One-rank timings of the NCCL path on a GPU machine, each beside a
// baseline in the same process:
//   * creating a "cuda" mesh (1, 1, 1): NCCL world + 3 ncclCommSplit
//     against creating the same "cpu" mesh (host communicators only);
//   * all_reduce of 64 MiB float32 on device memory through vemesh against
//     the same all_reduce through the raw ncclComm_t (native_handle());
//   * the three dimensions' NCCL communicators made one split at a time
//     (the default) against one grouped split_many (every ncclCommSplit in
//     one ncclGroupStart/End, NcclOptions::group_splits, NCCL >= 2.27) and
//     with splitShare = 1, alone on an existing NCCL communicator and as
//     part of creating a (1, 1, 1) cuda mesh; failures are counted per
//     variant (grouped splits failed intermittently on NCCL 2.28.9).
//
//   build/release/bench/nccl_init --reps=10 [--verbose]
//
// Without a GPU it says so and exits 0 (nothing to time).

#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "vemesh/bootstrap/launch.h"
#include "vemesh/comm/mpi/mpi_environment.h"
#include "vemesh/comm/nccl/nccl_communicator.h"
#include "vemesh/mesh/device_mesh.h"

#ifdef VEMESH_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

ABSL_FLAG(int, reps, 10, "repetitions of each measurement (median)");
ABSL_FLAG(bool, verbose, false,
          "print each repetition's creation and tear-down");

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto gpus = vemesh::CudaDeviceCount();
  if (!gpus.ok()) {
    std::printf("nccl_init: no GPU, nothing to time: %s\n",
                gpus.status().ToString().c_str());
    return 0;
  }
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  std::vector<double> cuda_ms, cpu_ms;
  for (int i = 0; i < reps; ++i) {
    for (const char* device : {"cuda", "cpu"}) {
      const absl::Time start = absl::Now();
      auto mesh =
          vemesh::init_device_mesh(device, {1, 1, 1}, {"PP", "DP", "TP"});
      const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
      if (!mesh.ok()) {
        std::printf("nccl_init: %s mesh failed: %s\n", device,
                    mesh.status().ToString().c_str());
        return 1;
      }
      if (i == 0 && device[1] == 'u')
        std::printf("%s\n", mesh->ToString().c_str());
      (device[1] == 'u' ? cuda_ms : cpu_ms).push_back(ms);
      // Tear-down is timed too: a slow destroy once hid behind creation.
      const absl::Time end_start = absl::Now();
      mesh = absl::CancelledError("released");
      if (absl::GetFlag(FLAGS_verbose))
        std::printf("rep %d %s: create %.2f ms, destroy %.2f ms\n", i, device,
                    ms, absl::ToDoubleMilliseconds(absl::Now() - end_start));
      std::fflush(stdout);
    }
  }
  std::printf("| what | median | baseline | ratio |\n|---|---:|---:|---:|\n");
  std::printf(
      "| create (1,1,1) cuda vs cpu mesh | %.2f ms | %.2f ms | %.1f |\n",
      Median(cuda_ms), Median(cpu_ms), Median(cuda_ms) / Median(cpu_ms));
#ifdef VEMESH_HAVE_NCCL
  auto mesh = vemesh::init_device_mesh("cuda", {1}, {"DP"});
  if (!mesh.ok()) return 1;
  auto dp = *mesh->get_group("DP");
  const size_t n = size_t{16} << 20;  // 64 MiB of float32
  float* x = nullptr;
  if (cudaMalloc(&x, n * sizeof(float)) != cudaSuccess) return 1;
  cudaStream_t stream = nullptr;
  cudaStreamCreate(&stream);
  auto raw = static_cast<ncclComm_t>(dp->native_handle().handle);
  std::vector<double> ours, theirs;
  for (int i = 0; i < reps + 1; ++i) {
    absl::Time start = absl::Now();
    if (!dp->all_reduce(x, x, n, vemesh::DataType::kFloat32,
                        vemesh::ReduceOp::kSum)
             .ok())
      return 1;
    const double a = absl::ToDoubleMicroseconds(absl::Now() - start);
    start = absl::Now();
    ncclAllReduce(x, x, n, ncclFloat32, ncclSum, raw, stream);
    cudaStreamSynchronize(stream);
    const double b = absl::ToDoubleMicroseconds(absl::Now() - start);
    if (i > 0) {  // the first is warm-up
      ours.push_back(a);
      theirs.push_back(b);
    }
  }
  std::printf(
      "| all_reduce 64 MiB f32, vemesh vs raw NCCL | %.1f us | %.1f us | %.2f "
      "|\n",
      Median(ours), Median(theirs), Median(ours) / Median(theirs));
  cudaFree(x);
  cudaStreamDestroy(stream);
#endif
  // Grouped against one-by-one splits, and with resource sharing. A failed
  // split aborts its parent: the variant gets a new one, the failure is
  // counted, and the others go on (a flaky NCCL path shows as a count).
  struct Variant {
    const char* what;
    vemesh::NcclOptions nccl;
  };
  vemesh::NcclOptions grouped;
  grouped.group_splits = true;
  vemesh::NcclOptions one_by_one;
  one_by_one.group_splits = false;
  vemesh::NcclOptions shared;
  shared.split_share = true;
  const std::vector<Variant> variants = {
      {"one by one", one_by_one}, {"grouped", grouped}, {"splitShare", shared}};
  const std::vector<vemesh::SplitRequest> requests = {
      {0, 0, "PP"}, {0, 0, "DP"}, {0, 0, "TP"}};
  auto make_parent = [](const vemesh::NcclOptions& nccl)
      -> absl::StatusOr<std::shared_ptr<vemesh::Communicator>> {
    vemesh::MeshOptions options;
    options.nccl = nccl;
    auto parent = vemesh::init_device_mesh("cuda", {1}, {"W"}, options);
    if (!parent.ok()) return parent.status();
    return parent->get_group("W");
  };
  std::vector<std::shared_ptr<vemesh::Communicator>> parents(variants.size());
  std::vector<std::vector<double>> split_ms(variants.size()),
      mesh_ms(variants.size());
  std::vector<int> failures(variants.size(), 0);
  for (int i = 0; i < reps + 1; ++i) {
    for (size_t v = 0; v < variants.size(); ++v) {  // interleaved: same noise
      if (parents[v] == nullptr) {
        auto parent = make_parent(variants[v].nccl);
        if (!parent.ok()) {
          std::printf("nccl_init: parent (%s) failed: %s\n", variants[v].what,
                      parent.status().ToString().c_str());
          ++failures[v];
          continue;
        }
        parents[v] = *std::move(parent);
      }
      absl::Time start = absl::Now();
      auto children = parents[v]->split_many(requests);
      const double split = absl::ToDoubleMilliseconds(absl::Now() - start);
      if (!children.ok()) {
        std::printf("nccl_init: rep %d split_many (%s) failed: %s\n", i,
                    variants[v].what, children.status().ToString().c_str());
        ++failures[v];
        parents[v] = nullptr;
        continue;
      }
      children->clear();
      vemesh::MeshOptions options;
      options.nccl = variants[v].nccl;
      start = absl::Now();
      auto mesh = vemesh::init_device_mesh("cuda", {1, 1, 1},
                                           {"PP", "DP", "TP"}, options);
      const double whole = absl::ToDoubleMilliseconds(absl::Now() - start);
      if (!mesh.ok()) {
        std::printf("nccl_init: rep %d cuda mesh (%s) failed: %s\n", i,
                    variants[v].what, mesh.status().ToString().c_str());
        ++failures[v];
        continue;
      }
      if (absl::GetFlag(FLAGS_verbose)) {
        std::printf("rep %d %s: split_many %.2f ms, mesh %.2f ms\n", i,
                    variants[v].what, split, whole);
        std::fflush(stdout);
      }
      if (i > 0) {  // the first round is warm-up
        split_ms[v].push_back(split);
        mesh_ms[v].push_back(whole);
      }
    }
  }
  int failed = 0;
  for (size_t v = 0; v < variants.size(); ++v) {
    failed += failures[v];
    std::printf("| %s: failed split_many or mesh | %d of %d |\n",
                variants[v].what, failures[v], reps + 1);
  }
  for (size_t v = 1; v < variants.size(); ++v) {
    if (split_ms[0].empty() || split_ms[v].empty()) continue;
    std::printf(
        "| 3 ncclCommSplit (split_many), %s vs %s | %.2f ms | %.2f ms | %.2f "
        "|\n",
        variants[0].what, variants[v].what, Median(split_ms[0]),
        Median(split_ms[v]), Median(split_ms[0]) / Median(split_ms[v]));
    std::printf(
        "| create (1,1,1) cuda mesh, %s vs %s | %.2f ms | %.2f ms | %.2f |\n",
        variants[0].what, variants[v].what, Median(mesh_ms[0]),
        Median(mesh_ms[v]), Median(mesh_ms[0]) / Median(mesh_ms[v]));
  }
  return failed == 0 ? 0 : 1;
}
