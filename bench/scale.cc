// bench/scale.cc
//
// Memory and planning time at scale, for meta meshes (layout only, no MPI) of
// 8 to 2^24 ranks:
//   * bytes a default (row-major) layout holds: MeshLayout::memory_bytes(),
//     and the heap it really keeps (counted by this program's operator new);
//   * the same for a layout given an explicit rank list, the contrast;
//   * bytes the registry keeps after init_device_mesh("meta", ...), and the
//     time that init takes;
//   * time to list every group of a dimension (O(world) by nature).
//
//   build/bench/scale --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true
//   build/bench/scale --max_world_log2=16 ...   (smaller worlds only)
//
// Counters: layout_bytes (memory_bytes()), heap_bytes (heap still held once
// the object is built, measured), groups (how many were listed).

#include <benchmark/benchmark.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "bench/bench_worlds.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/registry/ve_device_mesh.h"

// -- Heap accounting
// ------------------------------------------------------------- Every
// allocation of this program goes through here, so the heap an object keeps is
// "live bytes after it is built" minus "live bytes before". Sizes are malloc's
// usable sizes, counted the same way on allocation and release.

namespace {
std::atomic<int64_t> g_live_bytes{0};

void* Allocate(size_t size) {
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  g_live_bytes.fetch_add(static_cast<int64_t>(malloc_usable_size(p)),
                         std::memory_order_relaxed);
  return p;
}

void* AllocateAligned(size_t size, std::align_val_t align) {
  const size_t a = static_cast<size_t>(align);
  void* p = std::aligned_alloc(a, (size + a - 1) / a * a);
  if (p == nullptr) throw std::bad_alloc();
  g_live_bytes.fetch_add(static_cast<int64_t>(malloc_usable_size(p)),
                         std::memory_order_relaxed);
  return p;
}

void Release(void* p) {
  if (p == nullptr) return;
  g_live_bytes.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)),
                         std::memory_order_relaxed);
  std::free(p);
}
}  // namespace

void* operator new(size_t size) { return Allocate(size); }
void* operator new[](size_t size) { return Allocate(size); }
void* operator new(size_t size, std::align_val_t a) {
  return AllocateAligned(size, a);
}
void* operator new[](size_t size, std::align_val_t a) {
  return AllocateAligned(size, a);
}
void operator delete(void* p) noexcept { Release(p); }
void operator delete[](void* p) noexcept { Release(p); }
void operator delete(void* p, size_t) noexcept { Release(p); }
void operator delete[](void* p, size_t) noexcept { Release(p); }
void operator delete(void* p, std::align_val_t) noexcept { Release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { Release(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { Release(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept {
  Release(p);
}

namespace vemesh::bench {
namespace {

int g_max_world_log2 = 24;

int64_t LiveBytes() { return g_live_bytes.load(std::memory_order_relaxed); }

void Worlds(benchmark::internal::Benchmark* b, int max_log2) {
  b->ArgName("world");
  for (int k : {3, 12, 16, 20, 24}) {
    if (k <= std::min(max_log2, g_max_world_log2)) b->Arg(int64_t{1} << k);
  }
}
void AllWorlds(benchmark::internal::Benchmark* b) { Worlds(b, 24); }
// An explicit rank table costs O(world) memory and time: stop at 2^20.
void TableWorlds(benchmark::internal::Benchmark* b) { Worlds(b, 20); }

// Time: MeshLayout::Create of a default layout. Counters: what it holds.
void BM_Layout_CreateDefault(benchmark::State& state) {
  const std::vector<int64_t> shape = ShapeOf(state.range(0));
  for (auto _ : state) {
    benchmark::DoNotOptimize(MeshLayout::Create(shape, MeshNames()));
  }
  const int64_t before = LiveBytes();
  auto layout = MeshLayout::Create(shape, MeshNames());
  state.counters["heap_bytes"] = static_cast<double>(LiveBytes() - before);
  state.counters["layout_bytes"] = static_cast<double>(layout->memory_bytes());
}

// The contrast: the same mesh given as an explicit rank list (the rank list
// itself is built outside the timing and the counting).
void BM_Layout_CreateExplicit(benchmark::State& state) {
  const std::vector<int64_t> shape = ShapeOf(state.range(0));
  std::vector<int64_t> ranks(state.range(0));
  for (size_t i = 0; i < ranks.size(); ++i) {
    ranks[i] = static_cast<int64_t>(ranks.size() - 1 - i);  // reversed
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(MeshLayout::Create(shape, MeshNames(), ranks));
  }
  const int64_t before = LiveBytes();
  auto layout = MeshLayout::Create(shape, MeshNames(), ranks);
  state.counters["heap_bytes"] = static_cast<double>(LiveBytes() - before);
  state.counters["layout_bytes"] = static_cast<double>(layout->memory_bytes());
}

// Time: init_device_mesh("meta", ...) replacing the previous mesh. Counter:
// the heap the registry keeps for that mesh (registry reset before, measured
// after, with this thread's cached state included).
void BM_Registry_InitMeta(benchmark::State& state) {
  const std::vector<int64_t> shape = ShapeOf(state.range(0));
  for (auto _ : state) {
    auto mesh =
        VESCALE_DEVICE_MESH.init_device_mesh("meta", shape, MeshNames());
    if (!mesh.ok()) {
      state.SkipWithError(std::string(mesh.status().message()).c_str());
      return;
    }
  }
  VESCALE_DEVICE_MESH.reset();
  const int64_t before = LiveBytes();
  {
    auto mesh =
        VESCALE_DEVICE_MESH.init_device_mesh("meta", shape, MeshNames());
    benchmark::DoNotOptimize(VESCALE_DEVICE_MESH.lookup_rank("TP"));
  }
  state.counters["heap_bytes"] = static_cast<double>(LiveBytes() - before);
  VESCALE_DEVICE_MESH.reset();
}

// Time: every group along one dimension, as rank lists (O(world)).
void ListGroups(benchmark::State& state, const std::string& dim) {
  auto layout = MeshLayout::Create(ShapeOf(state.range(0)), MeshNames());
  size_t groups = 0;
  for (auto _ : state) {
    auto listed = layout->groups({dim});
    if (!listed.ok()) {
      state.SkipWithError(std::string(listed.status().message()).c_str());
      break;
    }
    groups = listed->size();
    benchmark::DoNotOptimize(listed);
  }
  state.counters["groups"] = static_cast<double>(groups);
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
void BM_Layout_GroupsTP(benchmark::State& state) { ListGroups(state, "TP"); }
void BM_Layout_GroupsDP(benchmark::State& state) { ListGroups(state, "DP"); }

// Time: the registry's list of every TP mesh (one DeviceMesh per group).
void BM_Registry_GlobalTensorParallelMeshes(benchmark::State& state) {
  auto mesh = VESCALE_DEVICE_MESH.init_device_mesh(
      "meta", ShapeOf(state.range(0)), MeshNames());
  if (!mesh.ok()) {
    state.SkipWithError(std::string(mesh.status().message()).c_str());
    return;
  }
  size_t groups = 0;
  for (auto _ : state) {
    auto meshes = VESCALE_DEVICE_MESH.get_global_tensor_parallel_meshes();
    if (!meshes.ok()) {
      state.SkipWithError(std::string(meshes.status().message()).c_str());
      break;
    }
    groups = meshes->size();
    benchmark::DoNotOptimize(meshes);
  }
  state.counters["groups"] = static_cast<double>(groups);
  state.SetItemsProcessed(state.iterations() * state.range(0));
  VESCALE_DEVICE_MESH.reset();
}

// 2^20 ranks is 2^17 TP groups of 8, past the registry's bound of 2^16
// meshes per list (ResourceExhausted, docs/RELIABILITY.md #28). The largest
// list it builds at 2^20 ranks: TP 16, 2^16 groups (range: log2 of world).
void BM_Registry_GlobalTensorParallelMeshesAtBound(benchmark::State& state) {
  const int64_t world = int64_t{1} << state.range(0);
  auto mesh = VESCALE_DEVICE_MESH.init_device_mesh(
      "meta", {64, world / (64 * 16), 16}, MeshNames());
  if (!mesh.ok()) {
    state.SkipWithError(std::string(mesh.status().message()).c_str());
    return;
  }
  size_t groups = 0;
  for (auto _ : state) {
    auto meshes = VESCALE_DEVICE_MESH.get_global_tensor_parallel_meshes();
    if (!meshes.ok()) {
      state.SkipWithError(std::string(meshes.status().message()).c_str());
      break;
    }
    groups = meshes->size();
    benchmark::DoNotOptimize(meshes);
  }
  state.counters["groups"] = static_cast<double>(groups);
  state.counters["ns_per_mesh"] =
      benchmark::Counter(static_cast<double>(groups) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate |
                             benchmark::Counter::kInvert);
  VESCALE_DEVICE_MESH.reset();
}

void Register() {
  BENCHMARK(BM_Layout_CreateDefault)->Apply(AllWorlds);
  BENCHMARK(BM_Layout_CreateExplicit)
      ->Apply(TableWorlds)
      ->Unit(benchmark::kMicrosecond);
  BENCHMARK(BM_Registry_InitMeta)
      ->Apply(AllWorlds)
      ->Unit(benchmark::kMicrosecond);
  BENCHMARK(BM_Layout_GroupsTP)
      ->Apply(AllWorlds)
      ->Unit(benchmark::kMillisecond);
  BENCHMARK(BM_Layout_GroupsDP)
      ->Apply(AllWorlds)
      ->Unit(benchmark::kMillisecond);
  // One DeviceMesh per TP group: 2^21 of them at 2^24 would be GBs; stop at
  // 2^20.
  BENCHMARK(BM_Registry_GlobalTensorParallelMeshes)
      ->Apply(TableWorlds)
      ->Unit(benchmark::kMillisecond);
  BENCHMARK(BM_Registry_GlobalTensorParallelMeshesAtBound)
      ->Arg(20)
      ->ArgName("world_log2")
      ->Unit(benchmark::kMillisecond);
}

}  // namespace
}  // namespace vemesh::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  // Our own flag, once Google Benchmark has taken its own.
  for (int i = 1; i < argc; ++i) {
    constexpr char kFlag[] = "--max_world_log2=";
    if (std::strncmp(argv[i], kFlag, sizeof(kFlag) - 1) == 0) {
      vemesh::bench::g_max_world_log2 = std::atoi(argv[i] + sizeof(kFlag) - 1);
    } else {
      std::fprintf(stderr, "scale: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  vemesh::bench::Register();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
