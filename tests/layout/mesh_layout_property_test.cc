// Property tests: every shape of 1 to 4 dimensions and at most 64 ranks (32
// in sanitized builds).
#include <algorithm>
#include <functional>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "vemesh/layout/mesh_layout.h"

namespace vemesh {
namespace {

const std::vector<std::string> kNames = {"A", "B", "C", "D"};

// Shapes of at most kMaxRanks ranks. A sanitized build checks each shape
// some twenty times slower, so it stops at 32 (1,073 shapes; CI time); the
// release build covers up to 64 (2,964).
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define VEMESH_PROPERTY_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define VEMESH_PROPERTY_SANITIZED 1
#endif
#ifdef VEMESH_PROPERTY_SANITIZED
constexpr int64_t kMaxRanks = 32;
#else
constexpr int64_t kMaxRanks = 64;
#endif

// Every shape of 1..4 dimensions, sizes >= 1, product <= kMaxRanks.
std::vector<std::vector<int64_t>> AllShapes() {
  std::vector<std::vector<int64_t>> out;
  std::vector<int64_t> shape;
  std::function<void(int64_t)> grow = [&](int64_t product) {
    if (!shape.empty()) out.push_back(shape);
    if (shape.size() == 4) return;
    for (int64_t n = 1; product * n <= kMaxRanks; ++n) {
      shape.push_back(n);
      grow(product * n);
      shape.pop_back();
    }
  };
  grow(1);
  return out;
}

// Every ordered, non-empty selection of dimension names (each subset in
// mesh order and in reverse).
std::vector<std::vector<std::string>> Selections(size_t ndim) {
  std::vector<std::vector<std::string>> out;
  for (unsigned mask = 1; mask < (1u << ndim); ++mask) {
    std::vector<std::string> dims;
    for (size_t i = 0; i < ndim; ++i) {
      if (mask & (1u << i)) dims.push_back(kNames[i]);
    }
    out.push_back(dims);
    if (dims.size() > 1) {
      std::reverse(dims.begin(), dims.end());
      out.push_back(dims);
    }
  }
  return out;
}

std::vector<std::string> NamesFor(size_t ndim) {
  return {kNames.begin(), kNames.begin() + ndim};
}

std::string Describe(const std::vector<int64_t>& shape) {
  return absl::StrCat("shape [", absl::StrJoin(shape, ","), "]");
}

TEST(MeshLayoutPropertyTest, EnumeratesManyShapes) {
  // 1-D: 64, 2-D: 280, ... the enumeration itself is what the other tests
  // rely on covering, so pin its size.
  EXPECT_GT(AllShapes().size(), 1000u);
}

TEST(MeshLayoutPropertyTest, RankCoordinateRoundTripIsRowMajor) {
  for (const auto& shape : AllShapes()) {
    SCOPED_TRACE(Describe(shape));
    auto layout = MeshLayout::Create(shape, NamesFor(shape.size()));
    ASSERT_TRUE(layout.ok()) << layout.status();
    for (int64_t r = 0; r < layout->size(); ++r) {
      auto c = layout->coordinate_of(r);
      ASSERT_TRUE(c.ok()) << c.status();
      // Row-major: the last dimension varies fastest.
      int64_t rest = r;
      for (size_t d = shape.size(); d-- > 0;) {
        ASSERT_EQ((*c)[d], rest % shape[d]);
        rest /= shape[d];
      }
      auto back = layout->rank_at(*c);
      ASSERT_TRUE(back.ok());
      ASSERT_EQ(*back, r);
    }
  }
}

TEST(MeshLayoutPropertyTest, GroupsPartitionTheWorldAndMatchSubmeshes) {
  for (const auto& shape : AllShapes()) {
    SCOPED_TRACE(Describe(shape));
    auto layout = MeshLayout::Create(shape, NamesFor(shape.size()));
    ASSERT_TRUE(layout.ok());
    for (const auto& dims : Selections(shape.size())) {
      SCOPED_TRACE(absl::StrJoin(dims, ","));
      auto groups = layout->groups(dims);
      ASSERT_TRUE(groups.ok()) << groups.status();
      std::vector<int> seen(layout->size(), 0);
      for (const auto& group : *groups) {
        for (int64_t r : group) ++seen[r];
      }
      ASSERT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) {
        return n == 1;
      })) << "groups do not partition the world";
      for (int64_t r = 0; r < layout->size(); ++r) {
        auto pos = layout->group_position(dims, r);
        ASSERT_TRUE(pos.ok());
        ASSERT_EQ(pos->group_count, static_cast<int64_t>(groups->size()));
        const auto& group = (*groups)[pos->group];
        ASSERT_EQ(group[pos->index], r) << "group_position disagrees";
        auto sub = layout->submesh(dims, r);
        ASSERT_TRUE(sub.ok());
        ASSERT_EQ(sub->ranks(), group) << "submesh of " << r;
        ASSERT_TRUE(sub->contains(r));
        // The sub-layout's own coordinates round-trip too.
        auto sc = sub->coordinate_of(r);
        ASSERT_TRUE(sc.ok());
        ASSERT_EQ(*sub->rank_at(*sc), r);
      }
    }
  }
}

TEST(MeshLayoutPropertyTest, NeighboursAreConsistent) {
  for (const auto& shape : AllShapes()) {
    SCOPED_TRACE(Describe(shape));
    auto layout = MeshLayout::Create(shape, NamesFor(shape.size()));
    ASSERT_TRUE(layout.ok());
    for (size_t d = 0; d < shape.size(); ++d) {
      const std::string& dim = kNames[d];
      for (int64_t r = 0; r < layout->size(); ++r) {
        const int64_t index = (*layout->coordinate_of(r))[d];
        for (int64_t shift : {1, 2, -1}) {
          auto next = layout->neighbor(dim, r, shift);
          ASSERT_TRUE(next.ok());
          const bool inside = index + shift >= 0 && index + shift < shape[d];
          ASSERT_EQ(next->has_value(), inside);
          if (inside) {
            // The previous of my next is me, away from the edges.
            auto back = layout->neighbor(dim, **next, -shift);
            ASSERT_TRUE(back.ok() && back->has_value());
            ASSERT_EQ(**back, r);
          }
          auto wrapped = layout->neighbor(dim, r, shift, /*periodic=*/true);
          ASSERT_TRUE(wrapped.ok() && wrapped->has_value());
          auto back = layout->neighbor(dim, **wrapped, -shift, true);
          ASSERT_EQ(**back, r);
        }
      }
    }
  }
}

TEST(MeshLayoutPropertyTest, FlattenPreservesMembership) {
  for (const auto& shape : AllShapes()) {
    if (shape.size() < 2) continue;
    SCOPED_TRACE(Describe(shape));
    auto layout = MeshLayout::Create(shape, NamesFor(shape.size()));
    ASSERT_TRUE(layout.ok());
    for (const auto& dims : Selections(shape.size())) {
      if (dims.size() < 2) continue;
      SCOPED_TRACE(absl::StrJoin(dims, ","));
      auto flat = layout->flatten(dims, "F");
      ASSERT_TRUE(flat.ok()) << flat.status();
      ASSERT_EQ(flat->size(), layout->size());
      ASSERT_EQ(flat->ndim(),
                layout->ndim() - static_cast<int64_t>(dims.size()) + 1);
      // Groups along the new dimension are the groups along `dims`.
      ASSERT_EQ(*flat->groups({"F"}), *layout->groups(dims));
      for (int64_t r = 0; r < layout->size(); ++r) {
        auto c = flat->coordinate_of(r);
        ASSERT_TRUE(c.ok());
        ASSERT_EQ(*flat->rank_at(*c), r);
        // Every other dimension keeps, for each rank, the same group.
        for (const std::string& other : flat->dim_names()) {
          if (other == "F") continue;
          ASSERT_EQ(flat->submesh({other}, r)->ranks(),
                    layout->submesh({other}, r)->ranks());
        }
      }
    }
  }
}

TEST(MeshLayoutPropertyTest, ExplicitRankListsRoundTrip) {
  std::mt19937_64 rng(7);
  for (const auto& shape : AllShapes()) {
    auto plain = MeshLayout::Create(shape, NamesFor(shape.size()));
    ASSERT_TRUE(plain.ok());
    std::vector<int64_t> ranks(plain->size());
    std::iota(ranks.begin(), ranks.end(), 100);
    std::shuffle(ranks.begin(), ranks.end(), rng);
    auto layout = MeshLayout::Create(shape, NamesFor(shape.size()), ranks);
    ASSERT_TRUE(layout.ok());
    ASSERT_EQ(layout->ranks(), ranks);
    for (int64_t i = 0; i < plain->size(); ++i) {
      // Position i of the rank list sits at plain coordinate of i.
      auto c = layout->coordinate_of(ranks[i]);
      ASSERT_TRUE(c.ok());
      ASSERT_EQ(*c, *plain->coordinate_of(i));
      ASSERT_EQ(*layout->rank_at(*c), ranks[i]);
    }
  }
}

}  // namespace
}  // namespace vemesh
