// bench/mpi_bench.h
//
// What the MPI timing programs (bench/init, collectives, mpi_ops, backends,
// dp_overlap) share: mesh shapes on the command line, the default meshes of
// a world, row-major coordinates by hand (the baselines must not lean on
// vemesh), the statistics every table reports, and the paired sampling of
// one call against another.
//
// A sample is the time the slowest rank took: each rank times its own part
// after a common barrier, and the maximum over ranks is what a job waits for.

#ifndef VEMESH_BENCH_MPI_BENCH_H_
#define VEMESH_BENCH_MPI_BENCH_H_

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
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
// Die()s with `what` and the status when it is not OK.
void Check(const absl::Status& status, const char* what);

// Mean seconds per call of the slowest rank: `batch` calls of `call` after
// a barrier of the world.
template <typename F>
double Sample(int batch, F&& call) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  for (int i = 0; i < batch; ++i) call();
  return MaxOverRanks((MPI_Wtime() - start) / batch);
}

// A paired comparison of call A with call B. After one untimed Sample() of
// each, every repetition takes three samples in an order rotated by the
// repetition: A, B, and B again. `paired` holds the ratios A/B of each
// repetition, `control` the ratios B/B: how far from 1 noise alone moves a
// ratio on this machine.
struct Paired {
  std::vector<double> a, b, paired, control;
};
template <typename A, typename B>
Paired SamplePaired(int reps, int batch, A&& a, B&& b) {
  Sample(batch, a);  // warm-up, untimed
  Sample(batch, b);
  Paired out;
  for (int r = 0; r < reps; ++r) {
    double t[3];
    for (int i = 0; i < 3; ++i) {
      const int which = (i + r) % 3;
      t[which] = which == 0 ? Sample(batch, a) : Sample(batch, b);
    }
    out.a.push_back(t[0]);
    out.b.push_back(t[1]);
    out.paired.push_back(t[0] / t[1]);
    out.control.push_back(t[2] / t[1]);
  }
  return out;
}

}  // namespace vemesh::bench

#endif  // VEMESH_BENCH_MPI_BENCH_H_
