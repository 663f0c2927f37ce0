#include "vemesh/layout/mesh_layout.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/base/status_macros.h"

namespace vemesh {

struct MeshLayout::RankTable {
  std::vector<int64_t> ranks;                      // root index -> global rank
  absl::flat_hash_map<int64_t, int64_t> index_of;  // global rank -> root index
};

namespace {

std::string JoinNames(absl::Span<const std::string> names) {
  return absl::StrCat("[", absl::StrJoin(names, ", "), "]");
}

}  // namespace

absl::StatusOr<std::vector<std::string>> DefaultDimNames(size_t ndim) {
  static const char* const kNames[] = {"PP", "DP", "TP"};
  if (ndim < 1 || ndim > 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no default dimension names for a ", ndim,
        "-D mesh: defaults cover 1 to 3 dimensions (the last n of [PP, DP, "
        "TP]); pass mesh_dim_names explicitly"));
  }
  return std::vector<std::string>(std::end(kNames) - ndim, std::end(kNames));
}

absl::StatusOr<MeshLayout> MeshLayout::Create(
    absl::Span<const int64_t> shape, absl::Span<const std::string> names,
    absl::Span<const int64_t> ranks) {
  if (shape.empty()) {
    return absl::InvalidArgumentError(
        "mesh shape is empty: expected at least one dimension");
  }
  if (shape.size() > kMaxDims) {
    return absl::InvalidArgumentError(
        absl::StrCat("mesh shape has ", shape.size(),
                     " dimensions: expected at most ", kMaxDims));
  }
  std::vector<std::string> dim_names;
  if (names.empty()) {
    VEMESH_ASSIGN_OR_RETURN(auto defaults, DefaultDimNames(shape.size()));
    dim_names = std::move(defaults);
  } else {
    dim_names.assign(names.begin(), names.end());
  }
  if (dim_names.size() != shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mesh_dim_names ", JoinNames(dim_names), " has ", dim_names.size(),
        " names but the mesh shape has ", shape.size(),
        " dimensions: expected one name per dimension"));
  }
  absl::flat_hash_set<absl::string_view> seen;
  for (size_t i = 0; i < dim_names.size(); ++i) {
    if (dim_names[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh dimension ", i, " has an empty name in ",
                       JoinNames(dim_names), ": expected a non-empty name"));
    }
    if (!seen.insert(dim_names[i]).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mesh dimension name '", dim_names[i], "' appears twice in ",
          JoinNames(dim_names), ": expected unique names"));
    }
  }
  int64_t product = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh dimension ", i, " ('", dim_names[i],
                       "') has size ", shape[i], ": expected a size >= 1"));
    }
    if (__builtin_mul_overflow(product, shape[i], &product)) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh shape [", absl::StrJoin(shape, ", "),
                       "] has more ranks than int64 can count: expected a "
                       "product below 2^63"));
    }
  }

  MeshLayout layout;
  layout.root_shape_.assign(shape.begin(), shape.end());
  layout.root_size_ = product;
  layout.size_ = product;
  layout.anchor_.assign(shape.size(), 0);
  layout.identity_ = true;
  if (static_cast<uint64_t>(product) < FastDivider::kMaxOperand) {
    for (int64_t n : shape) layout.dividers_.emplace_back(n);
  }
  layout.spanned_ =
      (shape.size() == 64) ? ~uint64_t{0} : (uint64_t{1} << shape.size()) - 1;
  layout.dims_.reserve(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    const uint64_t key = NameKey(dim_names[i]);
    layout.dims_.push_back(
        Dim{std::move(dim_names[i]), key, shape[i], {static_cast<int>(i)}});
  }

  if (!ranks.empty()) {
    if (static_cast<int64_t>(ranks.size()) != product) {
      return absl::InvalidArgumentError(absl::StrCat(
          "explicit rank list has ", ranks.size(), " entries but the mesh [",
          absl::StrJoin(shape, ", "), "] holds ", product,
          " ranks: expected one rank per mesh position"));
    }
    auto table = std::make_shared<RankTable>();
    table->ranks.assign(ranks.begin(), ranks.end());
    table->index_of.reserve(ranks.size());
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("explicit rank list has rank ", ranks[i],
                         " at position ", i, ": expected ranks >= 0"));
      }
      auto [it, inserted] =
          table->index_of.emplace(ranks[i], static_cast<int64_t>(i));
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(
            "explicit rank list has rank ", ranks[i], " twice (positions ",
            it->second, " and ", i, "): expected each rank once"));
      }
    }
    layout.table_ = std::move(table);
  }
  return layout;
}

std::vector<int64_t> MeshLayout::shape() const {
  std::vector<int64_t> out;
  out.reserve(dims_.size());
  for (const Dim& d : dims_) out.push_back(d.size);
  return out;
}

std::vector<std::string> MeshLayout::dim_names() const {
  std::vector<std::string> out;
  out.reserve(dims_.size());
  for (const Dim& d : dims_) out.push_back(d.name);
  return out;
}

absl::StatusOr<int64_t> MeshLayout::dim_index(absl::string_view name) const {
  if (auto i = find_dim(name)) return *i;
  return absl::NotFoundError(absl::StrCat("mesh dimension '", name,
                                          "' does not exist: expected one of ",
                                          JoinNames(dim_names())));
}

absl::StatusOr<int64_t> MeshLayout::find_role(absl::string_view role) const {
  if (auto exact = find_dim(role)) return *exact;
  int64_t found = -1;
  for (int64_t i = 0; i < ndim(); ++i) {
    if (!absl::EqualsIgnoreCase(dims_[i].name, role)) continue;
    if (found >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "role '", role, "' matches both dimension '", dims_[found].name,
          "' and '", dims_[i].name, "' of ", ToString(),
          " (roles match dimension names ignoring case): expected one; name "
          "the role exactly as one of ",
          JoinNames(dim_names())));
    }
    found = i;
  }
  if (found >= 0) return found;
  return absl::NotFoundError(absl::StrCat(
      ToString(), " has no dimension '", role,
      "' (roles match dimension names ignoring case): expected one of ",
      JoinNames(dim_names())));
}

absl::StatusOr<int64_t> MeshLayout::dim_size(int64_t dim) const {
  if (dim < 0 || dim >= ndim()) {
    return absl::OutOfRangeError(
        absl::StrCat("mesh dimension index ", dim,
                     " is out of range: expected 0 to ", ndim() - 1));
  }
  return dims_[dim].size;
}

absl::StatusOr<int64_t> MeshLayout::dim_size(absl::string_view name) const {
  VEMESH_ASSIGN_OR_RETURN(auto i, dim_index(name));
  return dims_[i].size;
}

Coordinate MeshLayout::root_coordinate(int64_t root_index) const {
  Coordinate rc(root_shape_.size());
  if (!dividers_.empty()) {
    uint64_t rest = static_cast<uint64_t>(root_index);
    for (size_t r = root_shape_.size(); r-- > 0;) {
      const uint64_t q = dividers_[r].quotient(rest);
      rc[r] = static_cast<int64_t>(rest - q * dividers_[r].divisor());
      rest = q;
    }
    return rc;
  }
  for (size_t r = root_shape_.size(); r-- > 0;) {
    rc[r] = root_index % root_shape_[r];
    root_index /= root_shape_[r];
  }
  return rc;
}

int64_t MeshLayout::root_index(absl::Span<const int64_t> root_coord) const {
  int64_t index = 0;
  for (size_t r = 0; r < root_shape_.size(); ++r) {
    index = index * root_shape_[r] + root_coord[r];
  }
  return index;
}

void MeshLayout::scatter(const Dim& d, int64_t i, Coordinate& rc) const {
  for (size_t k = d.roots.size(); k-- > 0;) {
    const int r = d.roots[k];
    rc[r] = i % root_shape_[r];
    i /= root_shape_[r];
  }
}

int64_t MeshLayout::gather(const Dim& d, const Coordinate& rc) const {
  int64_t i = 0;
  for (int r : d.roots) i = i * root_shape_[r] + rc[r];
  return i;
}

absl::StatusOr<int64_t> MeshLayout::root_index_of(int64_t global_rank) const {
  if (table_ != nullptr) {
    auto it = table_->index_of.find(global_rank);
    if (it == table_->index_of.end()) {
      return absl::OutOfRangeError(absl::StrCat(
          "rank ", global_rank, " is not in the mesh's rank list"));
    }
    return it->second;
  }
  if (global_rank < 0 || global_rank >= root_size_) {
    return absl::OutOfRangeError(
        absl::StrCat("rank ", global_rank, " is out of range: expected 0 to ",
                     root_size_ - 1));
  }
  return global_rank;
}

int64_t MeshLayout::global_rank_of(int64_t root_index) const {
  return table_ != nullptr ? table_->ranks[root_index] : root_index;
}

bool MeshLayout::is_arange() const {
  if (table_ != nullptr) return false;
  if (identity_) return true;
  // A rank is the root row-major index: sum of root coordinate x root stride.
  std::vector<int64_t> stride(root_shape_.size(), 1);
  for (size_t r = root_shape_.size(); r-- > 1;) {
    stride[r - 1] = stride[r] * root_shape_[r];
  }
  // A pinned root adds anchor x stride to every rank: rank 0 needs it 0.
  for (size_t r = 0; r < root_shape_.size(); ++r) {
    if (!(spanned_ & (uint64_t{1} << r)) && anchor_[r] != 0) return false;
  }
  // The spanned roots, innermost first in this layout's own order, must have
  // the strides of a row-major grid over them: 1, then each one's size times
  // the last. Roots of size 1 add nothing either way.
  int64_t expected = 1;
  for (size_t i = dims_.size(); i-- > 0;) {
    const Dim& d = dims_[i];
    for (size_t k = d.roots.size(); k-- > 0;) {
      const int r = d.roots[k];
      if (root_shape_[r] == 1) continue;
      if (stride[r] != expected) return false;
      expected *= root_shape_[r];
    }
  }
  return true;
}

bool MeshLayout::contains(int64_t global_rank) const {
  // coordinate_of's membership test without its error: a non-member is the
  // common answer for the many meshes a rank is not in (the get_global_*
  // lists), and building a message that names the layout cost more than
  // the rest of a mesh.
  int64_t index = global_rank;
  if (table_ != nullptr) {
    auto it = table_->index_of.find(global_rank);
    if (it == table_->index_of.end()) return false;
    index = it->second;
  } else if (global_rank < 0 || global_rank >= root_size_) {
    return false;
  }
  if (size_ == root_size_) return true;
  const Coordinate rc = root_coordinate(index);
  for (size_t r = 0; r < rc.size(); ++r) {
    if (!(spanned_ & (uint64_t{1} << r)) && rc[r] != anchor_[r]) return false;
  }
  return true;
}

absl::StatusOr<Coordinate> MeshLayout::coordinate_of(
    int64_t global_rank) const {
  // The common case, a default layout as created, without a StatusOr hop.
  if (identity_ && table_ == nullptr && global_rank >= 0 &&
      global_rank < root_size_) {
    // Built from the inline path's digits: no zero-fill first.
    constexpr size_t kInline = 6;  // Coordinate's inline capacity
    if (!dividers_.empty() && root_shape_.size() <= kInline) {
      int64_t digits[kInline];
      const absl::Span<int64_t> out(digits, root_shape_.size());
      (void)coordinate_of(global_rank, out);  // in range: always OK
      return absl::StatusOr<Coordinate>(absl::in_place, out.begin(), out.end());
    }
    return root_coordinate(global_rank);
  }
  VEMESH_ASSIGN_OR_RETURN(auto index, root_index_of(global_rank));
  if (identity_) return root_coordinate(index);
  const Coordinate rc = root_coordinate(index);
  // A sub-layout holds only the ranks that agree with its anchor on every
  // root dimension it does not span.
  if (size_ != root_size_) {
    for (size_t r = 0; r < rc.size(); ++r) {
      if (!(spanned_ & (uint64_t{1} << r)) && rc[r] != anchor_[r]) {
        return absl::NotFoundError(absl::StrCat(
            "rank ", global_rank, " is not a member of ", ToString()));
      }
    }
  }
  Coordinate coord(dims_.size());
  for (size_t i = 0; i < dims_.size(); ++i) coord[i] = gather(dims_[i], rc);
  return coord;
}

absl::Status MeshLayout::CoordinateOfSlow(int64_t global_rank,
                                          absl::Span<int64_t> out) const {
  if (out.size() != dims_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinate_of: the output holds ", out.size(),
                     " entries: expected ", dims_.size(), " for ", ToString()));
  }
  VEMESH_ASSIGN_OR_RETURN(Coordinate coord, coordinate_of(global_rank));
  std::copy(coord.begin(), coord.end(), out.begin());
  return absl::OkStatus();
}

absl::StatusOr<int64_t> MeshLayout::RankAtSlow(
    absl::Span<const int64_t> coordinate) const {
  if (coordinate.size() != dims_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinate [", absl::StrJoin(coordinate, ", "), "] has ",
                     coordinate.size(), " entries: expected ", dims_.size(),
                     " for ", ToString()));
  }
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (coordinate[i] < 0 || coordinate[i] >= dims_[i].size) {
      return absl::OutOfRangeError(
          absl::StrCat("coordinate [", absl::StrJoin(coordinate, ", "),
                       "] has index ", coordinate[i], " along '", dims_[i].name,
                       "': expected 0 to ", dims_[i].size - 1));
    }
  }
  if (identity_) return global_rank_of(root_index(coordinate));
  Coordinate rc = anchor_;
  for (size_t i = 0; i < dims_.size(); ++i)
    scatter(dims_[i], coordinate[i], rc);
  return global_rank_of(root_index(rc));
}

std::vector<int64_t> MeshLayout::ranks() const {
  std::vector<int64_t> out;
  out.reserve(size_);
  Coordinate coord(dims_.size(), 0);
  Coordinate rc = anchor_;
  for (int64_t n = 0; n < size_; ++n) {
    for (size_t i = 0; i < dims_.size(); ++i) scatter(dims_[i], coord[i], rc);
    out.push_back(global_rank_of(root_index(rc)));
    // Row-major increment of `coord`.
    for (size_t i = dims_.size(); i-- > 0;) {
      if (++coord[i] < dims_[i].size) break;
      coord[i] = 0;
    }
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> MeshLayout::dims_by_name(
    absl::Span<const std::string> names, absl::string_view what) const {
  if (names.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " needs at least one dimension name: expected some of ",
        JoinNames(dim_names())));
  }
  std::vector<int64_t> out;
  out.reserve(names.size());
  for (const std::string& name : names) {
    VEMESH_ASSIGN_OR_RETURN(auto i, dim_index(name));
    if (std::find(out.begin(), out.end(), i) != out.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " names dimension '", name, "' twice in ",
                       JoinNames(names), ": expected each dimension once"));
    }
    out.push_back(i);
  }
  return out;
}

absl::StatusOr<MeshLayout> MeshLayout::submesh(
    absl::Span<const std::string> dims, int64_t global_rank) const {
  VEMESH_ASSIGN_OR_RETURN(auto picked, dims_by_name(dims, "a sub-mesh"));
  if (!contains(global_rank)) return coordinate_of(global_rank).status();
  auto index = root_index_of(global_rank);
  // Only what a sub-layout keeps: copying the whole layout and clearing its
  // dimensions cost a copy of every name.
  MeshLayout out;
  out.root_shape_ = root_shape_;
  out.root_size_ = root_size_;
  out.dividers_ = dividers_;
  out.table_ = table_;
  out.anchor_ = root_coordinate(*index);
  out.size_ = 1;
  out.spanned_ = 0;
  out.identity_ = false;
  out.dims_.reserve(picked.size());
  for (int64_t i : picked) {
    out.dims_.push_back(dims_[i]);
    out.size_ *= dims_[i].size;
    for (int r : dims_[i].roots) out.spanned_ |= uint64_t{1} << r;
  }
  return out;
}

absl::StatusOr<MeshLayout::GroupPosition> MeshLayout::group_position(
    absl::Span<const std::string> dims, int64_t global_rank) const {
  VEMESH_ASSIGN_OR_RETURN(auto picked, dims_by_name(dims, "a group"));
  VEMESH_ASSIGN_OR_RETURN(auto coord, coordinate_of(global_rank));
  GroupPosition pos;
  pos.group_size = 1;
  for (int64_t i : picked) {
    pos.index = pos.index * dims_[i].size + coord[i];
    pos.group_size *= dims_[i].size;
  }
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (std::find(picked.begin(), picked.end(), static_cast<int64_t>(i)) !=
        picked.end()) {
      continue;
    }
    pos.group = pos.group * dims_[i].size + coord[i];
  }
  pos.group_count = size_ / pos.group_size;
  return pos;
}

int64_t MeshLayout::group_member(int64_t dim, int64_t group, int64_t k) const {
  if (dim < 0 || dim >= ndim() || group < 0 ||
      group >= size_ / dims_[dim].size) {
    return -1;
  }
  Coordinate coord(dims_.size(), 0);
  // Decode `group` row-major over the other dimensions (last fastest).
  for (int64_t d = ndim() - 1; d >= 0; --d) {
    if (d == dim) continue;
    coord[d] = group % dims_[d].size;
    group /= dims_[d].size;
  }
  coord[dim] = k;
  return rank_at(coord).value_or(-1);
}

std::vector<int64_t> MeshLayout::group_members(int64_t dim,
                                               int64_t group) const {
  std::vector<int64_t> members;
  if (dim < 0 || dim >= ndim()) return members;
  const int64_t n = dims_[dim].size;
  members.reserve(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    members.push_back(group_member(dim, group, k));
  }
  return members;
}

absl::StatusOr<std::vector<std::vector<int64_t>>> MeshLayout::groups(
    absl::Span<const std::string> dims) const {
  VEMESH_ASSIGN_OR_RETURN(auto picked, dims_by_name(dims, "a group"));
  std::vector<int64_t> others;
  for (int64_t i = 0; i < ndim(); ++i) {
    if (std::find(picked.begin(), picked.end(), i) == picked.end()) {
      others.push_back(i);
    }
  }
  int64_t group_size = 1;
  for (int64_t i : picked) group_size *= dims_[i].size;
  const int64_t group_count = size_ / group_size;

  // Walks a row-major counter over `which` dimensions, writing root coords.
  auto set_position = [&](const std::vector<int64_t>& which, int64_t n,
                          Coordinate& rc) {
    for (size_t k = which.size(); k-- > 0;) {
      const Dim& d = dims_[which[k]];
      scatter(d, n % d.size, rc);
      n /= d.size;
    }
  };
  std::vector<std::vector<int64_t>> out(group_count);
  Coordinate rc = anchor_;
  for (int64_t g = 0; g < group_count; ++g) {
    set_position(others, g, rc);
    out[g].reserve(group_size);
    for (int64_t k = 0; k < group_size; ++k) {
      set_position(picked, k, rc);
      out[g].push_back(global_rank_of(root_index(rc)));
    }
  }
  return out;
}

absl::StatusOr<MeshLayout> MeshLayout::flatten(
    absl::Span<const std::string> dims, absl::string_view name) const {
  VEMESH_ASSIGN_OR_RETURN(auto picked, dims_by_name(dims, "flatten"));
  if (name.empty()) {
    return absl::InvalidArgumentError(
        "flatten needs a non-empty name for the new dimension");
  }
  if (auto clash = find_dim(name);
      clash &&
      std::find(picked.begin(), picked.end(), *clash) == picked.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("flatten would name the new dimension '", name,
                     "', which another dimension of ", ToString(),
                     " already has: expected a new name"));
  }
  Dim merged{std::string(name), NameKey(name), 1, {}};
  for (int64_t i : picked) {
    merged.size *= dims_[i].size;
    merged.roots.insert(merged.roots.end(), dims_[i].roots.begin(),
                        dims_[i].roots.end());
  }
  const int64_t first = *std::min_element(picked.begin(), picked.end());
  MeshLayout out = *this;
  out.identity_ = false;
  out.dims_.clear();
  for (int64_t i = 0; i < ndim(); ++i) {
    if (i == first) {
      out.dims_.push_back(merged);
    } else if (std::find(picked.begin(), picked.end(), i) == picked.end()) {
      out.dims_.push_back(dims_[i]);
    }
  }
  return out;
}

absl::StatusOr<std::optional<int64_t>> MeshLayout::neighbor(
    absl::string_view dim, int64_t global_rank, int64_t shift,
    bool periodic) const {
  VEMESH_ASSIGN_OR_RETURN(auto d, dim_index(dim));
  VEMESH_ASSIGN_OR_RETURN(auto coord, coordinate_of(global_rank));
  const int64_t n = dims_[d].size;
  int64_t target;
  if (__builtin_add_overflow(coord[d], shift, &target)) {
    return absl::OutOfRangeError(
        absl::StrCat("neighbour shift ", shift, " overflows int64"));
  }
  if (periodic) {
    target %= n;
    if (target < 0) target += n;
  } else if (target < 0 || target >= n) {
    return std::optional<int64_t>();
  }
  coord[d] = target;
  VEMESH_ASSIGN_OR_RETURN(auto rank, rank_at(coord));
  return std::optional<int64_t>(rank);
}

std::string MeshLayout::ToString() const {
  std::vector<std::string> parts;
  parts.reserve(dims_.size());
  for (const Dim& d : dims_) parts.push_back(absl::StrCat(d.name, "=", d.size));
  return absl::StrCat("MeshLayout(", absl::StrJoin(parts, ", "), ")");
}

size_t MeshLayout::memory_bytes() const {
  size_t bytes =
      root_shape_.capacity() * sizeof(int64_t) + dims_.capacity() * sizeof(Dim);
  for (const Dim& d : dims_) {
    bytes += d.name.capacity() > 15 ? d.name.capacity() : 0;
    bytes += d.roots.size() > 2 ? d.roots.capacity() * sizeof(int) : 0;
  }
  if (anchor_.size() > 6) bytes += anchor_.capacity() * sizeof(int64_t);
  if (dividers_.size() > 6) bytes += dividers_.capacity() * sizeof(FastDivider);
  if (table_ != nullptr) {
    bytes += sizeof(RankTable) + table_->ranks.capacity() * sizeof(int64_t) +
             table_->index_of.capacity() * (sizeof(int64_t) * 2 + 1);
  }
  return bytes;
}

bool operator==(const MeshLayout& a, const MeshLayout& b) {
  if (a.size_ != b.size_ || a.dims_.size() != b.dims_.size()) return false;
  bool same_description = a.root_shape_ == b.root_shape_ &&
                          a.table_ == b.table_ && a.spanned_ == b.spanned_;
  for (size_t i = 0; i < a.dims_.size(); ++i) {
    if (a.dims_[i].name != b.dims_[i].name ||
        a.dims_[i].size != b.dims_[i].size) {
      return false;
    }
    same_description = same_description && a.dims_[i].roots == b.dims_[i].roots;
  }
  for (size_t r = 0; same_description && r < a.anchor_.size(); ++r) {
    const bool pinned = !(a.spanned_ & (uint64_t{1} << r));
    same_description = !pinned || a.anchor_[r] == b.anchor_[r];
  }
  // The same description is the same mesh, in O(ndim). Otherwise compare
  // what they hold: the same ranks in the same places, however derived.
  return same_description || a.ranks() == b.ranks();
}

}  // namespace vemesh
