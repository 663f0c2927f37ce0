// bench/queries.cc
//
// Nanoseconds per call of the registry's per-rank queries and of the layout's
// rank <-> coordinate maps, on "meta" meshes (layout only, no MPI) of 8, 4,096
// and 1,048,576 ranks. Beside them, in the same binary and the same run, the
// baseline users know: veScale finds a rank's coordinate by scanning the
// mesh's rank tensor (`(mesh == rank).nonzero()`), which grows with the world.
//
//   build/bench/queries --benchmark_enable_random_interleaving=true
//       --benchmark_repetitions=10 --benchmark_report_aggregates_only=true
//
// Every query is asked about ranks spread over the world (ProbeRanks), never
// one rank over and over. bench/report.py turns the JSON output into the
// table of bench/RESULTS.md (under 10 ns? flat across worlds?).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_worlds.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace vemesh::bench {
namespace {

constexpr size_t kProbes = 1024;  // a power of two: the index is a mask
const int64_t kWorlds[] = {8, 4096, 1048576};

const MeshLayout& LayoutOf(int64_t world) {
  static auto* cache = new std::vector<std::pair<int64_t, MeshLayout>>();
  for (const auto& [w, layout] : *cache) {
    if (w == world) return layout;
  }
  cache->emplace_back(world, *MeshLayout::Create(ShapeOf(world), MeshNames()));
  return cache->back().second;
}

// Makes the registry hold a meta mesh of `world` ranks. False (and the
// benchmark skipped with the reason) when init fails.
bool InitRegistry(benchmark::State& state, int64_t world) {
  auto mesh =
      VESCALE_DEVICE_MESH.init_device_mesh("meta", ShapeOf(world), MeshNames());
  if (!mesh.ok()) {
    state.SkipWithError(std::string(mesh.status().message()).c_str());
    return false;
  }
  return true;
}

// -- The baseline: veScale's O(world) scan
// --------------------------------------

// The coordinate of `rank` found as veScale finds it: walk the row-major rank
// tensor until the rank turns up, then unravel the flat index. (veScale's
// `nonzero()` always walks the whole tensor; stopping early is the generous
// version of the baseline.)
Coordinate ScanCoordinate(const std::vector<int64_t>& mesh,
                          const std::vector<int64_t>& shape, int64_t rank) {
  size_t flat = 0;
  while (flat < mesh.size() && mesh[flat] != rank) ++flat;
  Coordinate coordinate(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    coordinate[d] = static_cast<int64_t>(flat) % shape[d];
    flat /= static_cast<size_t>(shape[d]);
  }
  return coordinate;
}

void BM_Baseline_ScanCoordinate(benchmark::State& state) {
  const int64_t world = state.range(0);
  const std::vector<int64_t> mesh = LayoutOf(world).ranks();
  const std::vector<int64_t> shape = ShapeOf(world);
  const std::vector<int64_t> probes = ProbeRanks(world, kProbes);
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        ScanCoordinate(mesh, shape, probes[i++ & (kProbes - 1)]));
  }
}

// -- The layout
// ------------------------------------------------------------------

void BM_Layout_CoordinateOf(benchmark::State& state) {
  const MeshLayout& layout = LayoutOf(state.range(0));
  const std::vector<int64_t> probes = ProbeRanks(state.range(0), kProbes);
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(layout.coordinate_of(probes[i++ & (kProbes - 1)]));
  }
}

void BM_Layout_CoordinateOfSpan(benchmark::State& state) {
  const MeshLayout& layout = LayoutOf(state.range(0));
  const std::vector<int64_t> probes = ProbeRanks(state.range(0), kProbes);
  int64_t coord[MeshLayout::kMaxDims];
  const absl::Span<int64_t> out(coord, static_cast<size_t>(layout.ndim()));
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        layout.coordinate_of(probes[i++ & (kProbes - 1)], out));
    benchmark::DoNotOptimize(coord);
  }
}

void BM_Layout_RankAt(benchmark::State& state) {
  const MeshLayout& layout = LayoutOf(state.range(0));
  std::vector<Coordinate> coordinates;
  for (int64_t r : ProbeRanks(state.range(0), kProbes)) {
    coordinates.push_back(*layout.coordinate_of(r));
  }
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(layout.rank_at(coordinates[i++ & (kProbes - 1)]));
  }
}

// -- The registry (VESCALE_DEVICE_MESH)
// -----------------------------------------

// Not a query of the list: the registry's fixed cost (find the
// current state, wrap the answer in a StatusOr), to read the others against.
void BM_Registry_GetRank(benchmark::State& state) {
  if (!InitRegistry(state, state.range(0))) return;
  for (auto _ : state) {
    benchmark::DoNotOptimize(VESCALE_DEVICE_MESH.get_rank());
  }
}

void BM_Registry_GetStrategySize(benchmark::State& state) {
  if (!InitRegistry(state, state.range(0))) return;
  for (auto _ : state) {
    benchmark::DoNotOptimize(VESCALE_DEVICE_MESH.get_strategy_size("TP"));
  }
}

void BM_Registry_LookupRank(benchmark::State& state) {
  if (!InitRegistry(state, state.range(0))) return;
  for (auto _ : state) {
    benchmark::DoNotOptimize(VESCALE_DEVICE_MESH.lookup_rank("TP"));
  }
}

// The same by dimension index: the name lookup's share of lookup_rank.
void BM_Registry_LookupRankByIndex(benchmark::State& state) {
  if (!InitRegistry(state, state.range(0))) return;
  for (auto _ : state) {
    benchmark::DoNotOptimize(VESCALE_DEVICE_MESH.lookup_rank(int64_t{2}));
  }
}

void BM_Registry_GetStrategyCoordinate(benchmark::State& state) {
  if (!InitRegistry(state, state.range(0))) return;
  const std::vector<int64_t> probes = ProbeRanks(state.range(0), kProbes);
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(VESCALE_DEVICE_MESH.get_strategy_coordinate(
        probes[i++ & (kProbes - 1)]));
  }
}

void BM_Registry_GetStrategyCoordinateSpan(benchmark::State& state) {
  if (!InitRegistry(state, state.range(0))) return;
  const std::vector<int64_t> probes = ProbeRanks(state.range(0), kProbes);
  int64_t coord[3];
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(VESCALE_DEVICE_MESH.get_strategy_coordinate(
        probes[i++ & (kProbes - 1)], absl::MakeSpan(coord)));
    benchmark::DoNotOptimize(coord);
  }
}

void BM_Registry_GetGlobalRank(benchmark::State& state) {
  if (!InitRegistry(state, state.range(0))) return;
  const MeshLayout& layout = LayoutOf(state.range(0));
  std::vector<Coordinate> coordinates;
  for (int64_t r : ProbeRanks(state.range(0), kProbes)) {
    coordinates.push_back(*layout.coordinate_of(r));
  }
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        VESCALE_DEVICE_MESH.get_global_rank(coordinates[i++ & (kProbes - 1)]));
  }
}

void BM_Registry_GetNextStagePeer(benchmark::State& state) {
  if (!InitRegistry(state, state.range(0))) return;
  // Only a rank with a next stage answers with a peer; say so if it is not.
  auto peer = VESCALE_DEVICE_MESH.get_next_stage_peer();
  if (!peer.ok() || !peer->has_value()) {
    state.SkipWithError("this rank has no next pipeline stage");
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(VESCALE_DEVICE_MESH.get_next_stage_peer());
  }
}

void BM_Registry_SubscriptTP(benchmark::State& state) {
  if (!InitRegistry(state, state.range(0))) return;
  for (auto _ : state) {
    benchmark::DoNotOptimize(VESCALE_DEVICE_MESH["TP"]);
  }
}

void Worlds(benchmark::internal::Benchmark* b) {
  b->ArgName("world");
  for (int64_t w : kWorlds) b->Arg(w);
}

BENCHMARK(BM_Layout_CoordinateOf)->Apply(Worlds);
BENCHMARK(BM_Layout_CoordinateOfSpan)->Apply(Worlds);
BENCHMARK(BM_Layout_RankAt)->Apply(Worlds);
BENCHMARK(BM_Registry_GetRank)->Apply(Worlds);
BENCHMARK(BM_Registry_GetStrategySize)->Apply(Worlds);
BENCHMARK(BM_Registry_LookupRank)->Apply(Worlds);
BENCHMARK(BM_Registry_LookupRankByIndex)->Apply(Worlds);
BENCHMARK(BM_Registry_GetStrategyCoordinate)->Apply(Worlds);
BENCHMARK(BM_Registry_GetStrategyCoordinateSpan)->Apply(Worlds);
BENCHMARK(BM_Registry_GetGlobalRank)->Apply(Worlds);
BENCHMARK(BM_Registry_GetNextStagePeer)->Apply(Worlds);
BENCHMARK(BM_Registry_SubscriptTP)->Apply(Worlds);
BENCHMARK(BM_Baseline_ScanCoordinate)->Apply(Worlds);

}  // namespace
}  // namespace vemesh::bench

BENCHMARK_MAIN();
