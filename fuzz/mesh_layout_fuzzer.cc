// libFuzzer target: MeshLayout built from arbitrary shapes, names and rank
// lists, then driven by an arbitrary sequence of queries that checks the
// layout's invariants as it goes:
//   - rank <-> coordinate round trips (rank_at / coordinate_of);
//   - the root layout is row-major over the shape (or the rank list);
//   - a sub-mesh holds exactly the ranks that share the other coordinates;
//   - groups() partitions the layout and agrees with group_position() and
//     submesh();
//   - neighbor() is MPI_Cart_shift (periodic or not), overflow included;
//   - flatten() keeps the members and indexes row-major over the dims given;
//   - is_arange() says whether the ranks are 0..size-1 in row-major order;
//   - every rejected input is an error status with a message, never a crash.
// Derived layouts (sub-meshes, flattened ones) replace the current one, so
// chains such as flatten-of-submesh-of-flatten get checked too.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fuzz_check.h"
#include "vemesh/layout/mesh_layout.h"

namespace {

using vemesh::Coordinate;
using vemesh::MeshLayout;

// Full O(size) scans (ranks(), groups()) only for layouts this small, so
// that each input stays fast; bigger worlds get sampled per-rank checks.
constexpr int64_t kScanCap = 512;
// Explicit rank lists only up to this many ranks.
constexpr int64_t kTableCap = 1024;
constexpr int kMaxOps = 48;

const char* const kNamePool[] = {"PP", "DP", "TP",    "EP", "CP",
                                 "SP", "X",  "DP_TP", "",   "PP"};

template <typename T>
void CheckError(const absl::StatusOr<T>& result) {
  FUZZ_CHECK(!result.ok());
  FUZZ_CHECK(!result.status().message().empty());
}

std::string ConsumeName(FuzzedDataProvider& in) {
  if (in.ConsumeBool()) {
    return kNamePool[in.ConsumeIntegralInRange<size_t>(
        0, std::size(kNamePool) - 1)];
  }
  return in.ConsumeRandomLengthString(6);
}

int64_t ConsumeSize(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
      return in.ConsumeIntegral<int64_t>();  // anything: <1, overflow
    case 1:
      return in.ConsumeIntegralInRange<int64_t>(1, 1 << 20);
    default:
      return in.ConsumeIntegralInRange<int64_t>(1, 4);
  }
}

int64_t Product(const std::vector<int64_t>& shape) {
  int64_t p = 1;
  for (int64_t s : shape) p *= s;
  return p;
}

// Row-major coordinate of index `i` in `shape`.
Coordinate Unravel(const std::vector<int64_t>& shape, int64_t i) {
  Coordinate c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = i % shape[d];
    i /= shape[d];
  }
  return c;
}

Coordinate ConsumeCoordinate(FuzzedDataProvider& in, const MeshLayout& l) {
  Coordinate c(l.ndim());
  const std::vector<int64_t> shape = l.shape();
  for (size_t d = 0; d < shape.size(); ++d) {
    c[d] = in.ConsumeIntegralInRange<int64_t>(0, shape[d] - 1);
  }
  return c;
}

// A member rank, through rank_at; checks the round trip on the way.
int64_t ConsumeMember(FuzzedDataProvider& in, const MeshLayout& l) {
  const Coordinate c = ConsumeCoordinate(in, l);
  auto rank = l.rank_at(c);
  FUZZ_CHECK(rank.ok());
  auto back = l.coordinate_of(*rank);
  FUZZ_CHECK(back.ok());
  FUZZ_CHECK(*back == c);
  FUZZ_CHECK(l.contains(*rank));
  return *rank;
}

// A non-empty list of distinct dimension names, in an arbitrary order.
std::vector<std::string> ConsumeDims(FuzzedDataProvider& in,
                                     const MeshLayout& l) {
  std::vector<std::string> names = l.dim_names();
  for (size_t i = names.size(); i > 1; --i) {
    std::swap(names[i - 1], names[in.ConsumeIntegralInRange<size_t>(0, i - 1)]);
  }
  names.resize(in.ConsumeIntegralInRange<size_t>(1, names.size()));
  return names;
}

std::vector<int64_t> Indices(const MeshLayout& l,
                             const std::vector<std::string>& dims) {
  std::vector<int64_t> out;
  for (const std::string& d : dims) out.push_back(*l.dim_index(d));
  return out;
}

bool Picked(const std::vector<int64_t>& idx, int64_t d) {
  return std::find(idx.begin(), idx.end(), d) != idx.end();
}

void CheckRootLayout(FuzzedDataProvider& in, const MeshLayout& l,
                     const std::vector<int64_t>& shape,
                     const std::vector<int64_t>& table) {
  FUZZ_CHECK(l.shape() == shape);
  FUZZ_CHECK(l.size() == Product(shape));
  FUZZ_CHECK(l.has_rank_table() == !table.empty());
  auto expected = [&](int64_t i) { return table.empty() ? i : table[i]; };
  for (int k = 0; k < 4; ++k) {
    const int64_t i = in.ConsumeIntegralInRange<int64_t>(0, l.size() - 1);
    const Coordinate c = Unravel(shape, i);
    auto rank = l.rank_at(c);
    FUZZ_CHECK(rank.ok() && *rank == expected(i));
    auto back = l.coordinate_of(*rank);
    FUZZ_CHECK(back.ok() && *back == c);
  }
  if (l.size() <= kScanCap) {
    const std::vector<int64_t> ranks = l.ranks();
    FUZZ_CHECK(static_cast<int64_t>(ranks.size()) == l.size());
    for (int64_t i = 0; i < l.size(); ++i) FUZZ_CHECK(ranks[i] == expected(i));
  }
}

// Every member of `sub` agrees with `anchor` (in `parent`) on the dims not
// picked, and its sub coordinate is its parent coordinate on the picked ones.
void CheckSubmeshMember(const MeshLayout& parent, const MeshLayout& sub,
                        const std::vector<int64_t>& picked,
                        const Coordinate& anchor, int64_t rank) {
  auto pc = parent.coordinate_of(rank);
  FUZZ_CHECK(pc.ok());
  auto sc = sub.coordinate_of(rank);
  FUZZ_CHECK(sc.ok());
  for (int64_t d = 0; d < parent.ndim(); ++d) {
    if (!Picked(picked, d)) FUZZ_CHECK((*pc)[d] == anchor[d]);
  }
  for (size_t k = 0; k < picked.size(); ++k) {
    FUZZ_CHECK((*sc)[k] == (*pc)[picked[k]]);
  }
}

void OpSubmesh(FuzzedDataProvider& in, MeshLayout& cur) {
  const std::vector<std::string> dims = ConsumeDims(in, cur);
  const std::vector<int64_t> picked = Indices(cur, dims);
  const int64_t member = ConsumeMember(in, cur);
  auto sub = cur.submesh(dims, member);
  FUZZ_CHECK(sub.ok());
  FUZZ_CHECK(sub->dim_names() == dims);
  int64_t size = 1;
  for (int64_t d : picked) size *= cur.shape()[d];
  FUZZ_CHECK(sub->size() == size);
  const Coordinate anchor = *cur.coordinate_of(member);
  CheckSubmeshMember(cur, *sub, picked, anchor, member);
  for (int k = 0; k < 3; ++k) {
    CheckSubmeshMember(cur, *sub, picked, anchor, ConsumeMember(in, *sub));
  }
  if (cur.size() <= kScanCap) {
    // Exactly the ranks that share the anchor's other coordinates.
    int64_t count = 0;
    for (int64_t r : cur.ranks()) {
      const Coordinate c = *cur.coordinate_of(r);
      bool same = true;
      for (int64_t d = 0; d < cur.ndim(); ++d) {
        same = same && (Picked(picked, d) || c[d] == anchor[d]);
      }
      FUZZ_CHECK(sub->contains(r) == same);
      count += same;
    }
    FUZZ_CHECK(count == sub->size());
  }
  if (in.ConsumeBool()) cur = *std::move(sub);
}

void OpGroups(FuzzedDataProvider& in, const MeshLayout& cur) {
  const std::vector<std::string> dims = ConsumeDims(in, cur);
  if (cur.size() > kScanCap) {
    // Sampled: group_position agrees with the sub-mesh along the same dims.
    const int64_t member = ConsumeMember(in, cur);
    auto pos = cur.group_position(dims, member);
    FUZZ_CHECK(pos.ok());
    auto sub = cur.submesh(dims, member);
    FUZZ_CHECK(sub.ok());
    FUZZ_CHECK(pos->group_size == sub->size());
    FUZZ_CHECK(pos->group_count * pos->group_size == cur.size());
    const Coordinate sc = *sub->coordinate_of(member);
    int64_t index = 0;
    const std::vector<int64_t> sub_shape = sub->shape();
    for (size_t k = 0; k < sc.size(); ++k) index = index * sub_shape[k] + sc[k];
    FUZZ_CHECK(pos->index == index);
    FUZZ_CHECK(pos->group >= 0 && pos->group < pos->group_count);
    return;
  }
  auto groups = cur.groups(dims);
  FUZZ_CHECK(groups.ok());
  std::vector<int64_t> all;
  for (size_t g = 0; g < groups->size(); ++g) {
    const std::vector<int64_t>& group = (*groups)[g];
    auto sub = cur.submesh(dims, group.front());
    FUZZ_CHECK(sub.ok());
    FUZZ_CHECK(sub->ranks() == group);
    for (size_t k = 0; k < group.size(); ++k) {
      auto pos = cur.group_position(dims, group[k]);
      FUZZ_CHECK(pos.ok());
      FUZZ_CHECK(pos->group == static_cast<int64_t>(g));
      FUZZ_CHECK(pos->index == static_cast<int64_t>(k));
      FUZZ_CHECK(pos->group_size == static_cast<int64_t>(group.size()));
      FUZZ_CHECK(pos->group_count == static_cast<int64_t>(groups->size()));
    }
    all.insert(all.end(), group.begin(), group.end());
  }
  // A partition: every member exactly once.
  std::vector<int64_t> members = cur.ranks();
  std::sort(all.begin(), all.end());
  std::sort(members.begin(), members.end());
  FUZZ_CHECK(all == members);
}

void OpNeighbor(FuzzedDataProvider& in, const MeshLayout& cur) {
  const int64_t d = in.ConsumeIntegralInRange<int64_t>(0, cur.ndim() - 1);
  const int64_t member = ConsumeMember(in, cur);
  const int64_t shift = in.ConsumeBool()
                            ? in.ConsumeIntegral<int64_t>()
                            : in.ConsumeIntegralInRange<int64_t>(-3, 3);
  const bool periodic = in.ConsumeBool();
  auto got = cur.neighbor(cur.dim_name(d), member, shift, periodic);
  Coordinate c = *cur.coordinate_of(member);
  const int64_t n = cur.shape()[d];
  int64_t target = 0;
  if (__builtin_add_overflow(c[d], shift, &target)) {
    FUZZ_CHECK(!got.ok() &&
               got.status().code() == absl::StatusCode::kOutOfRange);
    return;
  }
  FUZZ_CHECK(got.ok());
  if (periodic) {
    // Not ((t % n) + n) % n: that overflows for a dimension near 2^63.
    target %= n;
    if (target < 0) target += n;
  } else if (target < 0 || target >= n) {
    FUZZ_CHECK(!got->has_value());
    return;
  }
  FUZZ_CHECK(got->has_value());
  c[d] = target;
  FUZZ_CHECK(**got == *cur.rank_at(c));
  // Shifting back returns home (always, for a periodic shift or in range).
  if (shift != INT64_MIN) {
    auto home = cur.neighbor(cur.dim_name(d), **got, -shift, periodic);
    if (home.ok()) FUZZ_CHECK(home->has_value() && **home == member);
  }
}

void OpFlatten(FuzzedDataProvider& in, MeshLayout& cur) {
  const std::vector<std::string> dims = ConsumeDims(in, cur);
  const std::vector<int64_t> picked = Indices(cur, dims);
  const std::string name = ConsumeName(in);
  auto flat = cur.flatten(dims, name);
  const std::optional<int64_t> clash = cur.find_dim(name);
  if (name.empty() || (clash && !Picked(picked, *clash))) {
    CheckError(flat);
    FUZZ_CHECK(flat.status().code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  FUZZ_CHECK(flat.ok());
  FUZZ_CHECK(flat->size() == cur.size());
  FUZZ_CHECK(flat->ndim() ==
             cur.ndim() - static_cast<int64_t>(dims.size()) + 1);
  const int64_t first = *std::min_element(picked.begin(), picked.end());
  const std::vector<int64_t> shape = cur.shape();
  auto check = [&](int64_t rank) {
    const Coordinate c = *cur.coordinate_of(rank);
    auto fc = flat->coordinate_of(rank);
    FUZZ_CHECK(fc.ok());
    Coordinate expected;
    for (int64_t d = 0; d < cur.ndim(); ++d) {
      if (d == first) {
        int64_t index = 0;
        for (int64_t p : picked) index = index * shape[p] + c[p];
        expected.push_back(index);
      } else if (!Picked(picked, d)) {
        expected.push_back(c[d]);
      }
    }
    FUZZ_CHECK(*fc == expected);
    FUZZ_CHECK(*flat->rank_at(expected) == rank);
  };
  if (cur.size() <= kScanCap) {
    for (int64_t r : cur.ranks()) check(r);
  } else {
    for (int k = 0; k < 4; ++k) check(ConsumeMember(in, cur));
  }
  if (in.ConsumeBool()) cur = *std::move(flat);
}

void OpBadQueries(FuzzedDataProvider& in, const MeshLayout& cur) {
  // Any int64 as a rank: a member round-trips, anything else is an error.
  const int64_t rank = in.ConsumeIntegral<int64_t>();
  auto c = cur.coordinate_of(rank);
  if (c.ok()) {
    FUZZ_CHECK(*cur.rank_at(*c) == rank);
  } else {
    FUZZ_CHECK(c.status().code() == absl::StatusCode::kOutOfRange ||
               c.status().code() == absl::StatusCode::kNotFound);
    FUZZ_CHECK(!cur.contains(rank));
    CheckError(cur.submesh(cur.dim_names(), rank));
    CheckError(cur.neighbor(cur.dim_name(0), rank, 1));
  }
  // A coordinate of the wrong length or with an index out of range.
  Coordinate bad = ConsumeCoordinate(in, cur);
  if (in.ConsumeBool()) {
    bad.push_back(0);
  } else {
    const size_t d = in.ConsumeIntegralInRange<size_t>(0, bad.size() - 1);
    // Bytes consumed in the original order, so corpus inputs keep meaning.
    const bool below = in.ConsumeBool();
    const int64_t extra = in.ConsumeIntegral<uint16_t>();
    if (below) {
      bad[d] = -1 - extra;
    } else {
      // shape + extra overflows for a dimension near 2^63 (UB, and the run
      // stops); saturate instead. INT64_MAX is still out of range: indices
      // run to shape - 1 <= INT64_MAX - 1.
      const int64_t n = cur.shape()[d];
      bad[d] = n > INT64_MAX - extra ? INT64_MAX : n + extra;
    }
  }
  CheckError(cur.rank_at(bad));
  // Unknown, empty and duplicate dimension names.
  const std::string name = ConsumeName(in);
  if (!cur.find_dim(name)) {
    auto index = cur.dim_index(name);
    CheckError(index);
    FUZZ_CHECK(index.status().code() == absl::StatusCode::kNotFound);
    FUZZ_CHECK(index.status().message().find(absl::StrCat("'", name, "'")) !=
               std::string::npos);
    CheckError(cur.groups({name}));
    CheckError(cur.flatten({name}, "NEW"));
  }
  const std::vector<std::string> twice = {cur.dim_name(0), cur.dim_name(0)};
  CheckError(cur.groups(twice));
  CheckError(cur.submesh({}, 0));
  CheckError(cur.dim_size(cur.ndim()));
  CheckError(cur.dim_size(-1));
}

void OpMisc(const MeshLayout& cur) {
  MeshLayout copy = cur;
  if (cur.size() <= kScanCap) {
    FUZZ_CHECK(copy == cur);
    // is_arange() is O(ndim) arithmetic; its definition is the listed ranks.
    bool arange = !cur.has_rank_table();
    const std::vector<int64_t> ranks = cur.ranks();
    for (int64_t i = 0; arange && i < cur.size(); ++i) arange = ranks[i] == i;
    FUZZ_CHECK(cur.is_arange() == arange);
  }
  const std::string text = cur.ToString();
  for (const std::string& n : cur.dim_names()) {
    FUZZ_CHECK(text.find(n) != std::string::npos);
  }
  FUZZ_CHECK(cur.memory_bytes() < (size_t{1} << 30));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);

  // Shape: usually 1..6 small dims; sometimes anything up to 34 dims.
  const size_t ndim = in.ConsumeBool()
                          ? in.ConsumeIntegralInRange<size_t>(1, 6)
                          : in.ConsumeIntegralInRange<size_t>(0, 34);
  std::vector<int64_t> shape;
  for (size_t i = 0; i < ndim; ++i) shape.push_back(ConsumeSize(in));

  // Names: the defaults, or fuzzed (possibly the wrong count, empty, twice).
  std::vector<std::string> names;
  if (in.ConsumeBool()) {
    size_t count = ndim;
    if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {
      count = in.ConsumeIntegralInRange<size_t>(0, ndim + 1);
    }
    for (size_t i = 0; i < count; ++i) names.push_back(ConsumeName(in));
  }

  // Rank list: none, a shuffled strided arange, or fuzzed values.
  std::vector<int64_t> table;
  bool valid_shape = !shape.empty() && shape.size() <= MeshLayout::kMaxDims;
  int64_t product = 1;
  for (int64_t s : shape) {
    valid_shape =
        valid_shape && s >= 1 && !__builtin_mul_overflow(product, s, &product);
  }
  const int table_mode = in.ConsumeIntegralInRange<int>(0, 3);
  if (table_mode == 1 && valid_shape && product <= kTableCap) {
    const int64_t base = in.ConsumeIntegralInRange<int64_t>(0, 1 << 20);
    const int64_t stride = in.ConsumeIntegralInRange<int64_t>(1, 7);
    for (int64_t i = 0; i < product; ++i) table.push_back(base + i * stride);
    for (size_t i = table.size(); i > 1; --i) {
      std::swap(table[i - 1],
                table[in.ConsumeIntegralInRange<size_t>(0, i - 1)]);
    }
  } else if (table_mode == 2) {
    const size_t n = in.ConsumeIntegralInRange<size_t>(1, 64);
    for (size_t i = 0; i < n; ++i) {
      table.push_back(in.ConsumeIntegralInRange<int64_t>(-2, 70));
    }
  }

  auto created = MeshLayout::Create(shape, names, table);
  if (!created.ok()) {
    CheckError(created);
    FUZZ_CHECK(created.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  FUZZ_CHECK(valid_shape);
  MeshLayout cur = *std::move(created);
  CheckRootLayout(in, cur, shape, table);

  for (int op = 0; op < kMaxOps && in.remaining_bytes() > 0; ++op) {
    switch (in.ConsumeIntegralInRange<int>(0, 6)) {
      case 0:
        ConsumeMember(in, cur);
        break;
      case 1:
        OpSubmesh(in, cur);
        break;
      case 2:
        OpGroups(in, cur);
        break;
      case 3:
        OpNeighbor(in, cur);
        break;
      case 4:
        OpFlatten(in, cur);
        break;
      case 5:
        OpBadQueries(in, cur);
        break;
      case 6:
        OpMisc(cur);
        break;
    }
  }
  return 0;
}
