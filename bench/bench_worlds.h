// bench/bench_worlds.h
//
// The worlds the benchmarks plan, shared so that every table speaks of the
// same meshes: a world size and the (PP, DP, TP) shape that stands for it.
// TP stays 8 (one host of GPUs), PP grows a little, DP takes the rest, as a
// large training job would be laid out.

#ifndef VEMESH_BENCH_BENCH_WORLDS_H_
#define VEMESH_BENCH_BENCH_WORLDS_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace vemesh::bench {

inline const std::vector<std::string>& MeshNames() {
  static const std::vector<std::string> names = {"PP", "DP", "TP"};
  return names;
}

// The (PP, DP, TP) shape of a world of 2^k ranks, k >= 3.
inline std::vector<int64_t> ShapeOf(int64_t world) {
  if (world == 8) return {2, 2, 2};
  if (world == 4096) return {8, 64, 8};
  if (world == 65536) return {8, 1024, 8};
  if (world == 1048576) return {64, 2048, 8};
  if (world == 16777216) return {64, 32768, 8};
  // Any other power of two: TP 8, PP 4, DP the rest (PP 1 below 32 ranks).
  const int64_t pp = world >= 32 ? 4 : 1;
  return {pp, world / (pp * 8), 8};
}

// Ranks spread over the whole world, the same sequence for every benchmark
// of one world: a query never gets to repeat one rank (or one cache line),
// and the scan baseline walks, on average, half the world.
inline std::vector<int64_t> ProbeRanks(int64_t world, size_t count) {
  std::mt19937_64 rng(0x5eed + static_cast<uint64_t>(world));
  std::uniform_int_distribution<int64_t> pick(0, world - 1);
  std::vector<int64_t> out(count);
  for (int64_t& r : out) r = pick(rng);
  return out;
}

}  // namespace vemesh::bench

#endif  // VEMESH_BENCH_BENCH_WORLDS_H_
