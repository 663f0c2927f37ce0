// Expected answers for a row-major mesh, computed here by hand from the
// definition (rank = sum of coordinate[i] * product of the later sizes), so
// that the registry's answers are checked against arithmetic of the test's
// own, not against MeshLayout.
#ifndef VEMESH_TESTS_API_REGISTRY_EXPECTATIONS_H_
#define VEMESH_TESTS_API_REGISTRY_EXPECTATIONS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace vemesh::testing {

class RowMajor {
 public:
  RowMajor(std::vector<int64_t> shape, std::vector<std::string> names)
      : shape_(std::move(shape)), names_(std::move(names)) {}

  int64_t size() const {
    int64_t n = 1;
    for (int64_t s : shape_) n *= s;
    return n;
  }
  int64_t dim(const std::string& name) const {
    for (size_t i = 0; i < names_.size(); ++i) {
      if (names_[i] == name) return static_cast<int64_t>(i);
    }
    return -1;
  }
  std::vector<int64_t> coord(int64_t rank) const {
    std::vector<int64_t> c(shape_.size());
    for (size_t i = shape_.size(); i-- > 0;) {
      c[i] = rank % shape_[i];
      rank /= shape_[i];
    }
    return c;
  }
  int64_t rank(const std::vector<int64_t>& c) const {
    int64_t r = 0;
    for (size_t i = 0; i < shape_.size(); ++i) r = r * shape_[i] + c[i];
    return r;
  }
  // Ranks that differ from `rank` only along `d`, in index order.
  std::vector<int64_t> group(int64_t rank, int64_t d) const {
    std::vector<int64_t> c = coord(rank), out;
    for (int64_t i = 0; i < shape_[d]; ++i) {
      c[d] = i;
      out.push_back(this->rank(c));
    }
    return out;
  }
  // Ranks whose index along `d` is `index`, in rank order.
  std::vector<int64_t> slab(int64_t d, int64_t index) const {
    std::vector<int64_t> out;
    for (int64_t r = 0; r < size(); ++r) {
      if (coord(r)[d] == index) out.push_back(r);
    }
    return out;
  }
  // All groups along `d`, ordered by their smallest member's coordinate on
  // the other dimensions (row-major).
  std::vector<std::vector<int64_t>> all_groups(int64_t d) const {
    std::vector<std::vector<int64_t>> out;
    for (int64_t r = 0; r < size(); ++r) {
      if (coord(r)[d] == 0) out.push_back(group(r, d));
    }
    return out;
  }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<std::string>& names() const { return names_; }

 private:
  std::vector<int64_t> shape_;
  std::vector<std::string> names_;
};

}  // namespace vemesh::testing

#endif  // VEMESH_TESTS_API_REGISTRY_EXPECTATIONS_H_
