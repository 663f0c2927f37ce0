// vemesh/layout/mesh_layout.h
//
// MeshLayout is the pure geometry of an N-D device mesh: a shape, one name per
// dimension and the map between coordinates and global ranks. It does no
// communication and holds no globals, so it can plan a world of millions of
// ranks inside one process.
//
//   absl::StatusOr<MeshLayout> layout =
//       MeshLayout::Create({2, 2, 2}, {"PP", "DP", "TP"});
//   layout->coordinate_of(5);          // [1, 0, 1]
//   layout->rank_at({1, 0, 1});        // 5
//   layout->submesh({"TP"}, 5);        // the TP group of rank 5: ranks [4, 5]
//   layout->groups({"DP"});            // [[0,2], [1,3], [4,6], [5,7]]
//   layout->group_members(1, 3);       // [5, 7]: DP group 3 alone
//   layout->find_role("tp");           // 2 (roles ignore case)
//   layout->neighbor("PP", 5, -1);     // rank 1 (the previous pipeline stage)
//   layout->flatten({"DP", "TP"}, "DPTP");
//
// Ranks are laid out row-major: the last dimension varies fastest. An explicit
// rank list (the `mesh` tensor of PyTorch's DeviceMesh) may replace the default
// `arange`; it is then the row-major listing of the mesh's global ranks.
//
// Cost: every per-rank query is O(ndim) arithmetic; nothing scans the world.
// A default layout stores O(ndim) words whatever its size. Only `groups()`
// and `ranks()`, which return O(world) data, take O(world) time.
//
// Representation. Every layout is a view over a *root* row-major grid (the
// shape it was created with). Each of its dimensions lists the root
// dimensions it spans (one for a plain dimension, several once flattened);
// root dimensions it does not span are pinned to an anchor coordinate (a
// sub-mesh pins the dimensions that were sliced away). Sub-meshes, flattening
// and groups are all derived from that one description, and copies share the
// optional rank table.

#ifndef VEMESH_LAYOUT_MESH_LAYOUT_H_
#define VEMESH_LAYOUT_MESH_LAYOUT_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "vemesh/layout/fast_divider.h"

namespace vemesh {

// A coordinate in a mesh: one index per dimension. Inline up to 6 dimensions,
// so queries do not allocate. It compares with the std::vector<int64_t> that
// shape() and mesh() return (and with a braced list through either type):
//   Coordinate c = *mesh.get_coordinate();
//   if (c == std::vector<int64_t>{1, 0, 1}) ...
//   std::vector<int64_t> v = c.to_vector();   // or {c.begin(), c.end()}
class Coordinate : public absl::InlinedVector<int64_t, 6> {
 public:
  using Base = absl::InlinedVector<int64_t, 6>;
  using Base::Base;
  Coordinate() = default;
  Coordinate(const Base& other) : Base(other) {}        // NOLINT: implicit
  Coordinate(Base&& other) : Base(std::move(other)) {}  // NOLINT: implicit
  explicit Coordinate(absl::Span<const int64_t> values)
      : Base(values.begin(), values.end()) {}

  std::vector<int64_t> to_vector() const { return {begin(), end()}; }

  friend bool operator==(const Coordinate& a, const Coordinate& b) {
    return static_cast<const Base&>(a) == static_cast<const Base&>(b);
  }
  friend bool operator==(const Coordinate& a, const std::vector<int64_t>& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend bool operator==(const Coordinate& a, absl::Span<const int64_t> b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
};

// The names used when the caller gives none: the last n of {"PP","DP","TP"}.
// Fails for n > 3 (such meshes need explicit names) or n < 1.
absl::StatusOr<std::vector<std::string>> DefaultDimNames(size_t ndim);

class MeshLayout {
 public:
  static constexpr size_t kMaxDims = 32;

  // Validates and builds a layout. `names` empty means DefaultDimNames;
  // `ranks` empty means row-major arange(0, product(shape)).
  // Errors (InvalidArgument, naming the bad value): empty shape, more than
  // kMaxDims dimensions, a size < 1, a
  // product that overflows int64, names whose count differs from the shape,
  // empty or duplicate names, a rank list of the wrong length, with a
  // negative or a duplicate rank.
  static absl::StatusOr<MeshLayout> Create(
      absl::Span<const int64_t> shape, absl::Span<const std::string> names = {},
      absl::Span<const int64_t> ranks = {});

  // -- Shape -----------------------------------------------------------------
  int64_t size() const { return size_; }
  int64_t ndim() const { return static_cast<int64_t>(dims_.size()); }
  std::vector<int64_t> shape() const;
  std::vector<std::string> dim_names() const;
  // Size of one dimension; OutOfRange / NotFound for a bad index or name.
  absl::StatusOr<int64_t> dim_size(int64_t dim) const;
  absl::StatusOr<int64_t> dim_size(absl::string_view name) const;
  // Index of a dimension by name: NotFound naming the name and the known ones.
  absl::StatusOr<int64_t> dim_index(absl::string_view name) const;
  std::optional<int64_t> find_dim(absl::string_view name) const {
    const uint64_t key = NameKey(name);
    for (size_t i = 0; i < dims_.size(); ++i) {
      if (key != 0 ? dims_[i].key == key : dims_[i].name == name) {
        return static_cast<int64_t>(i);
      }
    }
    return std::nullopt;
  }
  const std::string& dim_name(int64_t dim) const { return dims_[dim].name; }
  // The dimension that plays `role` (the registry's roles, the planner's
  // --latency-sensitive names): the one named exactly `role`, else the one
  // whose name equals it ignoring ASCII case ("tp" plays "TP"). NotFound
  // when none does; InvalidArgument naming both when two dimensions differ
  // from `role` only by case (and neither matches exactly). O(ndim).
  absl::StatusOr<int64_t> find_role(absl::string_view role) const;
  // The root dimensions (of the shape the layout was created with) that
  // dimension `dim` spans, outermost first: one for a plain dimension, the
  // flattened ones, in the order its index runs over them, for a flattened
  // one. `dim` must be in range.
  std::vector<int64_t> root_dims(int64_t dim) const {
    return std::vector<int64_t>(dims_[dim].roots.begin(),
                                dims_[dim].roots.end());
  }

  // True when the layout carries an explicit rank list.
  bool has_rank_table() const { return table_ != nullptr; }
  // True when every rank is the row-major index of its coordinate in this
  // layout's own shape: the layout Create makes without a rank list (a
  // sub-mesh or a flattened layout may be one too). A layout with a rank list
  // answers false whatever the list holds. O(ndim), where comparing with such
  // a layout is O(size) for a layout derived differently.
  bool is_arange() const;

  // -- Ranks and coordinates
  // --------------------------------------------------- Whether `global_rank`
  // is a member of this (possibly sliced) layout.
  bool contains(int64_t global_rank) const;
  // The coordinate of a member. OutOfRange for a rank outside the root grid,
  // NotFound for a rank of the root grid that this sub-layout does not hold.
  absl::StatusOr<Coordinate> coordinate_of(int64_t global_rank) const;
  // The same, written into the caller's `out` (ndim() entries; a wrong
  // length is InvalidArgument): no coordinate built and returned. The hot
  // path (a layout as created, a rank in range) is inline, a few ns.
  //   int64_t coord[MeshLayout::kMaxDims];
  //   absl::Status s = layout.coordinate_of(rank, absl::MakeSpan(coord,
  //   layout.ndim()));
  absl::Status coordinate_of(int64_t global_rank,
                             absl::Span<int64_t> out) const {
    if (identity_ && table_ == nullptr && !dividers_.empty() &&
        global_rank >= 0 && global_rank < root_size_ &&
        out.size() == root_shape_.size()) [[likely]] {
      uint64_t rest = static_cast<uint64_t>(global_rank);
      for (size_t r = root_shape_.size(); r-- > 0;) {
        const uint64_t q = dividers_[r].quotient(rest);
        out[r] = static_cast<int64_t>(rest - q * dividers_[r].divisor());
        rest = q;
      }
      return absl::OkStatus();
    }
    return CoordinateOfSlow(global_rank, out);
  }
  // The global rank at a coordinate. InvalidArgument for a wrong length,
  // OutOfRange for an index outside its dimension. Inline for a layout as
  // created.
  absl::StatusOr<int64_t> rank_at(absl::Span<const int64_t> coordinate) const {
    if (identity_ && table_ == nullptr && coordinate.size() == dims_.size())
        [[likely]] {
      int64_t index = 0;
      bool inside = true;
      for (size_t r = 0; r < dims_.size() && inside; ++r) {
        const int64_t i = coordinate[r];
        inside = i >= 0 && i < root_shape_[r];
        // Only inside indices are added: then the running index stays below
        // the shape's product, which fits in int64_t (an index far outside
        // overflowed here, found by mesh_layout_fuzzer).
        if (inside) index = index * root_shape_[r] + i;
      }
      if (inside) [[likely]]
        return index;
    }
    return RankAtSlow(coordinate);
  }
  // All member ranks, row-major. O(size).
  std::vector<int64_t> ranks() const;

  // -- Derived layouts
  // --------------------------------------------------------- The layout along
  // `dims` (in the order given) that contains `global_rank`. Errors: empty or
  // duplicate dims, an unknown name, a rank not held.
  absl::StatusOr<MeshLayout> submesh(absl::Span<const std::string> dims,
                                     int64_t global_rank) const;
  // Every group along `dims`: the member ranks of each, in the order of
  // `dims` (row-major over them); groups listed row-major over the other
  // dimensions. Partitions the layout. O(size).
  absl::StatusOr<std::vector<std::vector<int64_t>>> groups(
      absl::Span<const std::string> dims) const;
  // `dims` merged into one dimension named `name`, placed where the first of
  // `dims` (in mesh order) stood. Its index runs row-major over `dims` in the
  // order given. Same members, same rank for every coordinate of the others.
  absl::StatusOr<MeshLayout> flatten(absl::Span<const std::string> dims,
                                     absl::string_view name) const;

  // -- Splitting (what a communicator split needs) ---------------------------
  // For the group along `dims` that holds `global_rank`: which group it is
  // (row-major over the other dimensions, 0 .. size/group_size-1) and where
  // the rank stands inside it. O(ndim).
  struct GroupPosition {
    int64_t group = 0;  // the split's color
    int64_t index = 0;  // the split's key
    int64_t group_size = 0;
    int64_t group_count = 0;
  };
  absl::StatusOr<GroupPosition> group_position(
      absl::Span<const std::string> dims, int64_t global_rank) const;
  // One group along the single dimension `dim`, by number, without listing
  // the others (groups() builds all of them): the `k`-th member of group
  // `group`, numbered as groups() and group_position() number them
  // (row-major over the other dimensions). O(ndim). Indices must be in range
  // (dim < ndim(), group < size() / dim size, k < dim size); -1 otherwise.
  //   layout.group_member(/*dim=*/2, /*group=*/3, /*k=*/0);  // 6 in 2x2x2
  int64_t group_member(int64_t dim, int64_t group, int64_t k) const;
  // Every member of that group, in order along `dim`. O(group size * ndim).
  std::vector<int64_t> group_members(int64_t dim, int64_t group) const;

  // -- Neighbours
  // -------------------------------------------------------------- The rank
  // `shift` steps away from `global_rank` along `dim`, as MPI_Cart_shift
  // defines it: with `periodic` the index wraps, otherwise a step past either
  // edge gives std::nullopt (MPI_PROC_NULL).
  absl::StatusOr<std::optional<int64_t>> neighbor(absl::string_view dim,
                                                  int64_t global_rank,
                                                  int64_t shift,
                                                  bool periodic = false) const;

  // "MeshLayout(PP=2, DP=2, TP=2)".
  std::string ToString() const;
  // Heap bytes this layout holds (the rank table counted once per holder).
  size_t memory_bytes() const;

  // Same names, shape and ranks in the same places. O(ndim) for layouts
  // derived the same way from one root; O(size) otherwise.
  friend bool operator==(const MeshLayout& a, const MeshLayout& b);

 private:
  // Up to 7 bytes of a name and its length in one word; 0 for longer names.
  static uint64_t NameKey(absl::string_view name) {
    if (name.size() > 7) return 0;
    uint64_t key = static_cast<uint64_t>(name.size()) << 56;
    for (size_t i = 0; i < name.size(); ++i) {
      key |= static_cast<uint64_t>(static_cast<unsigned char>(name[i]))
             << (8 * i);
    }
    return key;
  }

  struct Dim {
    std::string name;
    // `name` packed into one word when it is at most 7 bytes (0 otherwise):
    // looking a dimension up by name is then an integer compare.
    uint64_t key = 0;
    int64_t size = 1;
    // Root dimensions this dimension spans, outermost first; its index is
    // row-major over them.
    absl::InlinedVector<int, 2> roots;
  };
  struct RankTable;  // explicit ranks and their inverse

  MeshLayout() = default;

  // The general cases of the inline queries above (and their errors).
  absl::Status CoordinateOfSlow(int64_t global_rank,
                                absl::Span<int64_t> out) const;
  absl::StatusOr<int64_t> RankAtSlow(
      absl::Span<const int64_t> coordinate) const;

  // Root coordinate of a root-grid index, and back.
  Coordinate root_coordinate(int64_t root_index) const;
  int64_t root_index(absl::Span<const int64_t> root_coord) const;
  // Writes the root coordinates that dimension `d` at index `i` stands for.
  void scatter(const Dim& d, int64_t i, Coordinate& root_coord) const;
  int64_t gather(const Dim& d, const Coordinate& root_coord) const;
  // Root index of a global rank (OutOfRange when it is not in the root grid).
  absl::StatusOr<int64_t> root_index_of(int64_t global_rank) const;
  int64_t global_rank_of(int64_t root_index) const;
  absl::StatusOr<std::vector<int64_t>> dims_by_name(
      absl::Span<const std::string> names, absl::string_view what) const;

  std::vector<int64_t> root_shape_;
  int64_t root_size_ = 1;
  std::vector<Dim> dims_;
  // Root coordinate for the root dimensions that no dimension spans.
  Coordinate anchor_;
  // Bit r set when some dimension spans root dimension r.
  uint64_t spanned_ = 0;
  // Dimension i is root dimension i, and every root dimension is present:
  // coordinates are root coordinates (a layout as created).
  bool identity_ = false;
  // One per root dimension, when the root grid has fewer than 2^32 ranks
  // (empty otherwise): rank -> coordinate without hardware division.
  absl::InlinedVector<FastDivider, 6> dividers_;
  int64_t size_ = 1;
  std::shared_ptr<const RankTable> table_;
};

}  // namespace vemesh

#endif  // VEMESH_LAYOUT_MESH_LAYOUT_H_
