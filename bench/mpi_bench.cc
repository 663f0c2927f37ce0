#include "bench/mpi_bench.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace vemesh::bench {

absl::StatusOr<std::vector<int64_t>> ParseShape(absl::string_view text) {
  std::vector<int64_t> shape;
  for (absl::string_view part : absl::StrSplit(text, 'x')) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh shape '", text,
                       "': expected sizes >= 1 joined by 'x', "
                       "such as 2x4x2"));
    }
    shape.push_back(n);
  }
  if (shape.empty() || shape.size() > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("mesh shape '", text, "': expected 1 to 3 dimensions"));
  }
  return shape;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrJoin(shape, "x");
}

std::vector<std::string> RoleNames(size_t ndim) {
  const std::vector<std::string> all = {"PP", "DP", "TP"};
  return std::vector<std::string>(all.end() - static_cast<long>(ndim),
                                  all.end());
}

HandMesh::HandMesh(std::vector<int64_t> s)
    : shape(std::move(s)), stride(shape.size(), 1) {
  for (size_t d = shape.size() - 1; d-- > 0;) {
    stride[d] = stride[d + 1] * shape[d + 1];
  }
}

int64_t HandMesh::size() const { return stride[0] * shape[0]; }

std::vector<int64_t> HandMesh::coordinate(int64_t rank) const {
  std::vector<int64_t> c(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) c[d] = rank / stride[d] % shape[d];
  return c;
}

int HandMesh::color(int64_t rank, size_t dim) const {
  const std::vector<int64_t> c = coordinate(rank);
  int64_t color = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d != dim) color = color * shape[d] + c[d];
  }
  return static_cast<int>(color);
}

int HandMesh::key(int64_t rank, size_t dim) const {
  return static_cast<int>(coordinate(rank)[dim]);
}

std::vector<std::vector<int>> HandMesh::groups(size_t dim) const {
  // A group's first member has index 0 along `dim`; the others follow at
  // `stride[dim]`. First members in increasing order are row-major over the
  // other dimensions.
  std::vector<std::vector<int>> out;
  out.reserve(size() / shape[dim]);
  for (int64_t base = 0; base < size(); ++base) {
    if (base / stride[dim] % shape[dim] != 0) continue;
    std::vector<int> group(shape[dim]);
    for (int64_t i = 0; i < shape[dim]; ++i) {
      group[i] = static_cast<int>(base + i * stride[dim]);
    }
    out.push_back(std::move(group));
  }
  return out;
}

std::vector<int> WorldRanksOf(MPI_Comm comm) {
  MPI_Group group, world;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  int n = 0;
  MPI_Group_size(group, &n);
  std::vector<int> mine(n), out(n);
  for (int i = 0; i < n; ++i) mine[i] = i;
  MPI_Group_translate_ranks(group, n, mine.data(), world, out.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return out;
}

double MaxOverRanks(double value) {
  double out = 0;
  MPI_Allreduce(&value, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double Min(const std::vector<double>& values) {
  return values.empty() ? 0 : *std::min_element(values.begin(), values.end());
}

void Die(const std::string& message) {
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "rank %d: %s\n", rank, message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

void Check(const absl::Status& status, const char* what) {
  if (!status.ok()) Die(absl::StrCat(what, ": ", status.ToString()));
}

}  // namespace vemesh::bench
