// bench/mpi_bench.h
//
// What the MPI timing programs (bench/init, bench/collectives) share: mesh
// shapes on the command line, the default meshes of a world, row-major
// coordinates by hand (the baselines must not lean on vemesh), and the
// statistics every table reports.
//
// A sample is the time the slowest rank took: each rank times its own part
// after a common barrier, and the maximum over ranks is what a job waits for.

#ifndef VEMESH_BENCH_MPI_BENCH_H_
#define VEMESH_BENCH_MPI_BENCH_H_

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vemesh::bench {

// "2x4x2" -> {2, 4, 2}; InvalidArgument naming the text otherwise.
absl::StatusOr<std::vector<int64_t>> ParseShape(absl::string_view text);
std::string ShapeText(const std::vector<int64_t>& shape);
// The last n of {"PP", "DP", "TP"}.
std::vector<std::string> RoleNames(size_t ndim);

// A row-major mesh by hand: coordinates, and for one dimension the split's
// color (row-major index over the other dimensions) and key.
struct HandMesh {
  explicit HandMesh(std::vector<int64_t> shape);
  int64_t size() const;
  std::vector<int64_t> coordinate(int64_t rank) const;
  int color(int64_t rank, size_t dim) const;
  int key(int64_t rank, size_t dim) const;
  // Every group along `dim`, row-major over the other dimensions.
  std::vector<std::vector<int>> groups(size_t dim) const;

  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
};

// The world ranks of a communicator's members, in its rank order.
std::vector<int> WorldRanksOf(MPI_Comm comm);

// Maximum of `value` over the ranks of MPI_COMM_WORLD (on every rank).
double MaxOverRanks(double value);
double Median(std::vector<double> values);
double Min(const std::vector<double>& values);

// Stops the whole job with a message (from any rank).
[[noreturn]] void Die(const std::string& message);

}  // namespace vemesh::bench

#endif  // VEMESH_BENCH_MPI_BENCH_H_
