// tests/mesh/hand_grid.h
//
// What the mesh algebra tests compare against, computed by hand: this MPI
// rank and world, the groups of a row-major grid, and a check that a
// communicator is exactly a given group (its ranks() and a real all_gather).

#ifndef TESTS_DEVICE_MESH_HAND_GRID_H_
#define TESTS_DEVICE_MESH_HAND_GRID_H_

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "vemesh/comm/communicator.h"

namespace vemesh::testing_grid {

inline int WorldRank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

inline int WorldSize() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// A row-major grid: coordinates of a rank, and the ranks of the group that
// varies `dims` (row-major over `dims` in the order given) and keeps the
// other coordinates of `of`.
struct Grid {
  std::vector<int64_t> shape;

  std::vector<int64_t> coord(int64_t rank) const {
    std::vector<int64_t> c(shape.size());
    for (size_t i = shape.size(); i-- > 0;) {
      c[i] = rank % shape[i];
      rank /= shape[i];
    }
    return c;
  }
  int64_t rank(const std::vector<int64_t>& c) const {
    int64_t r = 0;
    for (size_t i = 0; i < shape.size(); ++i) r = r * shape[i] + c[i];
    return r;
  }
  std::vector<int64_t> group(int64_t of, const std::vector<int>& dims) const {
    int64_t n = 1;
    for (int d : dims) n *= shape[d];
    std::vector<int64_t> out;
    for (int64_t k = 0; k < n; ++k) {
      std::vector<int64_t> c = coord(of);
      int64_t rest = k;
      for (size_t j = dims.size(); j-- > 0;) {
        c[dims[j]] = rest % shape[dims[j]];
        rest /= shape[dims[j]];
      }
      out.push_back(rank(c));
    }
    return out;
  }
  // The index of `of` in group(of, dims).
  int64_t index(int64_t of, const std::vector<int>& dims) const {
    const std::vector<int64_t> c = coord(of);
    int64_t i = 0;
    for (int d : dims) i = i * shape[d] + c[d];
    return i;
  }
};

// ranks() and an all_gather of global ranks over `comm` are `expected`.
inline void ExpectGroup(const std::shared_ptr<Communicator>& comm,
                        const std::vector<int64_t>& expected) {
  ASSERT_NE(comm, nullptr);
  std::vector<int64_t> ranks(comm->ranks().begin(), comm->ranks().end());
  EXPECT_EQ(ranks, expected);
  std::vector<int64_t> gathered(comm->size());
  const int64_t me = WorldRank();
  ASSERT_TRUE(
      comm->all_gather(absl::MakeConstSpan(&me, 1), absl::MakeSpan(gathered))
          .ok());
  EXPECT_EQ(gathered, expected);
}

}  // namespace vemesh::testing_grid

#endif  // TESTS_DEVICE_MESH_HAND_GRID_H_
