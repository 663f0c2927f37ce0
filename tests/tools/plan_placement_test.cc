// Placement policies (block, cyclic, a hostfile's uneven slots) against a
// reference that places ranks one by one as the launcher does: every rank's
// host and local rank, every dimension's crossing-group count, every
// elided group's host count, and every order suggestion, over all shapes of
// up to 3 dimensions and 48 ranks.

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "small_shapes.h"
#include "tools/plan/dim_order.h"
#include "tools/plan/group_summary.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/placement/host_locality.h"
#include "vemesh/placement/host_map.h"

namespace vemesh::plan {
namespace {

using ::vemesh::testing::SmallShapes;

// The launchers, rank by rank. Block: fill a host with per_host ranks, then
// the next. Cyclic: deal ranks to the hosts in turn. Slots: fill each host's
// slots in file order.
std::vector<int64_t> PlaceBlock(int64_t per_host, int64_t world) {
  std::vector<int64_t> host;
  int64_t h = 0, used = 0;
  for (int64_t r = 0; r < world; ++r) {
    if (used == per_host) {
      ++h;
      used = 0;
    }
    host.push_back(h);
    ++used;
  }
  return host;
}

std::vector<int64_t> PlaceCyclic(int64_t hosts, int64_t world) {
  std::vector<int64_t> host;
  int64_t next = 0;
  for (int64_t r = 0; r < world; ++r) {
    host.push_back(next);
    next = next + 1 == hosts ? 0 : next + 1;
  }
  return host;
}

std::vector<int64_t> PlaceSlots(const std::vector<int64_t>& slots,
                                int64_t world) {
  std::vector<int64_t> host;
  for (size_t h = 0; h < slots.size(); ++h) {
    for (int64_t s = 0;
         s < slots[h] && static_cast<int64_t>(host.size()) < world; ++s) {
      host.push_back(static_cast<int64_t>(h));
    }
  }
  return host;
}

// The slots that a world really uses (HostMap::Slots takes those).
std::vector<int64_t> UsedSlots(const std::vector<int64_t>& slots,
                               int64_t world) {
  std::vector<int64_t> used;
  for (int64_t s : slots) {
    if (world == 0) break;
    used.push_back(std::min(s, world));
    world -= used.back();
  }
  return used;
}

HostMap SlotsMap(const std::vector<int64_t>& sizes) {
  std::vector<std::string> names;
  for (size_t i = 0; i < sizes.size(); ++i)
    names.push_back(absl::StrCat("n", i));
  return HostMap::Slots(names, sizes);
}

// Hostfile slot lists with at least `world` slots, from a fixed seed.
std::vector<std::vector<int64_t>> SlotLists(int64_t world) {
  std::mt19937 rng(17);
  std::vector<std::vector<int64_t>> out = {{world}, {world + 3}};
  for (int i = 0; i < 10; ++i) {
    std::vector<int64_t> slots;
    int64_t total = 0;
    while (total < world) {
      slots.push_back(1 + static_cast<int64_t>(rng() % 7));
      total += slots.back();
    }
    if (i % 3 == 0) slots.push_back(2);  // a host left empty
    out.push_back(slots);
  }
  return out;
}

struct Case {
  std::string name;
  HostMap hosts;
  std::vector<int64_t> reference;  // host of every rank
};

std::vector<Case> Cases(int64_t world) {
  std::vector<Case> out;
  for (int64_t h = 1; h <= 13; ++h) {
    out.push_back({absl::StrCat("block ", h), HostMap::Block(h, world),
                   PlaceBlock(h, world)});
  }
  for (int64_t h = 1; h <= std::min<int64_t>(world, 9); ++h) {
    out.push_back({absl::StrCat("cyclic ", h), HostMap::Cyclic(h, world),
                   PlaceCyclic(h, world)});
  }
  for (const auto& slots : SlotLists(world)) {
    out.push_back({absl::StrCat("slots ", absl::StrJoin(slots, ",")),
                   SlotsMap(UsedSlots(slots, world)),
                   PlaceSlots(slots, world)});
  }
  return out;
}

int64_t DistinctHosts(const std::vector<int64_t>& ranks,
                      const std::vector<int64_t>& reference) {
  std::vector<int64_t> seen;
  for (int64_t r : ranks) seen.push_back(reference[r]);
  std::sort(seen.begin(), seen.end());
  return std::unique(seen.begin(), seen.end()) - seen.begin();
}

TEST(HostMap, EveryPolicyPlacesRanksAsTheLauncher) {
  for (int64_t world = 1; world <= 48; ++world) {
    for (const Case& c : Cases(world)) {
      SCOPED_TRACE(absl::StrCat(c.name, " world ", world));
      const HostMap& m = c.hosts;
      const int64_t hosts =
          *std::max_element(c.reference.begin(), c.reference.end()) + 1;
      ASSERT_EQ(m.world_size(), world);
      ASSERT_EQ(m.host_count(), hosts);
      std::vector<int64_t> on_host(hosts, 0);
      for (int64_t r = 0; r < world; ++r) {
        ASSERT_EQ(m.host_of(r), c.reference[r]) << "rank " << r;
        // Local rank: the rank's place among its host's ranks.
        ASSERT_EQ(m.local_of(r), on_host[c.reference[r]]) << "rank " << r;
        ASSERT_EQ(m.rank_on(c.reference[r], on_host[c.reference[r]]), r);
        ++on_host[c.reference[r]];
      }
      int64_t largest = 0;
      for (int64_t h = 0; h < hosts; ++h) {
        ASSERT_EQ(m.host_size(h), on_host[h]) << "host " << h;
        largest = std::max(largest, on_host[h]);
      }
      ASSERT_EQ(m.max_host_size(), largest);
    }
  }
}

TEST(HostMap, NamesAndDescriptions) {
  EXPECT_EQ(HostMap::Block(4, 8).Describe(), "4 ranks per host");
  EXPECT_EQ(HostMap::Cyclic(2, 8).Describe(), "cyclic over 2 hosts");
  const HostMap slots = HostMap::Slots({"node0", "node1"}, {4, 2});
  EXPECT_EQ(slots.Describe(), "hostfile slots 4,2");
  EXPECT_EQ(slots.names(), (std::vector<std::string>{"node0", "node1"}));
  EXPECT_EQ(slots.policy(), PlacementPolicy::kHostfile);
  EXPECT_EQ(PlacementPolicyName(PlacementPolicy::kCyclic), "cyclic");
}

TEST(HostLocality, EveryPolicyCountsCrossingGroupsAsTheReference) {
  for (const auto& shape : SmallShapes()) {
    const MeshLayout layout = MeshLayout::Create(shape).value();
    for (const Case& c : Cases(layout.size())) {
      for (int64_t d = 0; d < layout.ndim(); ++d) {
        const auto groups = layout.groups({layout.dim_name(d)}).value();
        int64_t crossing = 0;
        for (const auto& g : groups)
          crossing += DistinctHosts(g, c.reference) > 1;
        const DimLocality fast = AnalyzeDimLocality(layout, d, c.hosts);
        ASSERT_EQ(fast.crossing_groups, crossing)
            << layout.ToString() << " dim " << d << " " << c.name;
        ASSERT_EQ(fast.group_count, static_cast<int64_t>(groups.size()));
        ASSERT_EQ(AnalyzeDimLocalityByScan(layout, d, c.hosts).crossing_groups,
                  crossing);
      }
    }
  }
}

TEST(GroupSummary, ElidedHostCountMatchesTheReferenceUnderEveryPolicy) {
  for (const auto& shape : SmallShapes()) {
    const MeshLayout layout = MeshLayout::Create(shape).value();
    for (const Case& c : Cases(layout.size())) {
      for (int64_t d = 0; d < layout.ndim(); ++d) {
        const auto groups = layout.groups({layout.dim_name(d)}).value();
        for (size_t g = 0; g < groups.size(); ++g) {
          const GroupSummary elided = SummarizeGroup(
              layout, d, static_cast<int64_t>(g), c.hosts, /*max_listed=*/1);
          const GroupSummary listed =
              SummarizeGroup(layout, d, static_cast<int64_t>(g), c.hosts);
          const int64_t distinct = DistinctHosts(groups[g], c.reference);
          ASSERT_EQ(elided.host_count, distinct)
              << layout.ToString() << " dim " << d << " group " << g << " "
              << c.name;
          ASSERT_EQ(listed.host_count, distinct);
        }
      }
    }
  }
}

// A suggestion exists exactly when some other order keeps the groups
// inside, found by trying every order against the reference.
TEST(DimOrder, SuggestionsUnderEveryPolicyAreProvenAndComplete) {
  const std::vector<std::string> names = {"PP", "TP", "DP"};
  for (const auto& shape : SmallShapes()) {
    if (shape.size() != 3) continue;
    const MeshLayout layout = MeshLayout::Create(shape, names).value();
    for (const Case& c : Cases(layout.size())) {
      SCOPED_TRACE(layout.ToString() + " " + c.name);
      // Orders (other than the given one) that keep TP inside a host.
      std::vector<int> perm = {0, 1, 2};
      bool any = false;
      // next_permutation from the sorted order visits the 5 others, then
      // returns false.
      while (std::next_permutation(perm.begin(), perm.end())) {
        std::vector<int64_t> s;
        std::vector<std::string> n;
        for (int i : perm) {
          s.push_back(shape[i]);
          n.push_back(names[i]);
        }
        const MeshLayout other = MeshLayout::Create(s, n).value();
        const std::vector<std::vector<int64_t>> groups =
            other.groups({"TP"}).value();
        bool inside = true;
        for (const auto& g : groups) {
          inside &= DistinctHosts(g, c.reference) == 1;
        }
        any |= inside;
      }
      const OrderSuggestion s =
          SuggestOrderKeepingInHost(layout, "TP", c.hosts).value();
      ASSERT_EQ(s.found, any);
      if (!s.found) {
        EXPECT_FALSE(s.reason.empty());
        continue;
      }
      std::vector<int64_t> reordered;
      for (const std::string& n : s.order) {
        reordered.push_back(layout.dim_size(n).value());
      }
      const MeshLayout fixed = MeshLayout::Create(reordered, s.order).value();
      const std::vector<std::vector<int64_t>> fixed_groups =
          fixed.groups({"TP"}).value();
      for (const auto& g : fixed_groups) {
        ASSERT_EQ(DistinctHosts(g, c.reference), 1) << s.mesh_spec;
      }
    }
  }
}

// Cyclic and hostfile counts stay arithmetic: a world of 2^40 ranks.
TEST(HostLocality, HugeWorldsUnderCyclicAndSlots) {
  const int64_t world = int64_t{1} << 40;
  const MeshLayout layout =
      MeshLayout::Create({int64_t{1} << 20, int64_t{1} << 12, 256},
                         {"PP", "DP", "TP"})
          .value();
  const DimLocality tp =
      AnalyzeDimLocality(layout, 2, HostMap::Cyclic(16, world));
  EXPECT_EQ(tp.crossing_groups, tp.group_count);
  const DimLocality pp =
      AnalyzeDimLocality(layout, 0, HostMap::Cyclic(16, world));
  EXPECT_EQ(pp.crossing_groups, 0);  // stride 2^20 is a multiple of 16
  const HostMap slots = HostMap::Slots({"a", "b"}, {world / 2, world / 2});
  const DimLocality pp_slots = AnalyzeDimLocality(layout, 0, slots);
  EXPECT_EQ(pp_slots.crossing_groups, pp_slots.group_count);
  EXPECT_EQ(AnalyzeDimLocality(layout, 2, slots).crossing_groups, 0);
  const GroupSummary g =
      SummarizeGroup(layout, 0, 0, HostMap::Cyclic(16, world));
  EXPECT_EQ(g.host_count, 1);
}

// (From host_locality_test.cc, whose engine moved to vemesh/placement/.)
// An elided group's host count is arithmetic (first member, stride, size);
// it must equal the count of distinct hosts over every member.
TEST(GroupSummary, ElidedHostCountMatchesEveryMember) {
  for (const auto& shape : SmallShapes()) {
    const MeshLayout layout = MeshLayout::Create(shape).value();
    for (int64_t h = 1; h <= 13; ++h) {
      const HostMap hosts{h, layout.size()};
      for (int64_t d = 0; d < layout.ndim(); ++d) {
        const auto groups = layout.groups({layout.dim_name(d)}).value();
        for (size_t g = 0; g < groups.size(); ++g) {
          std::vector<int64_t> seen;
          for (int64_t r : groups[g]) seen.push_back(hosts.host_of(r));
          std::sort(seen.begin(), seen.end());
          const int64_t distinct =
              std::unique(seen.begin(), seen.end()) - seen.begin();
          const GroupSummary s = SummarizeGroup(
              layout, d, static_cast<int64_t>(g), hosts, /*max_listed=*/1);
          ASSERT_EQ(s.host_count, distinct) << layout.ToString() << " dim " << d
                                            << " group " << g << " h " << h;
        }
      }
    }
  }
}

// A group of 2^62 members is summarised without visiting them.
TEST(GroupSummary, AHugeGroupIsSummarisedFromItsEnds) {
  const MeshLayout layout =
      MeshLayout::Create({int64_t{1} << 62}, {"TP"}).value();
  const GroupSummary s =
      SummarizeGroup(layout, 0, 0, HostMap{8, layout.size()});
  EXPECT_EQ(s.size, int64_t{1} << 62);
  EXPECT_EQ(s.ranks, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(s.tail.back(), (int64_t{1} << 62) - 1);
  EXPECT_EQ(s.host_count, int64_t{1} << 59);
}

TEST(DimOrder, EverySuggestionIsVerified) {
  for (const auto& shape : SmallShapes()) {
    if (shape.size() != 3) continue;
    const MeshLayout layout =
        MeshLayout::Create(shape, {"PP", "TP", "DP"}).value();
    for (int64_t h = 1; h <= 12; ++h) {
      const HostMap hosts{h, layout.size()};
      const OrderSuggestion s =
          SuggestOrderKeepingInHost(layout, "TP", hosts).value();
      if (!s.found) {
        EXPECT_FALSE(s.reason.empty());
        continue;
      }
      std::vector<int64_t> reordered;
      for (const std::string& n : s.order) {
        reordered.push_back(layout.dim_size(n).value());
      }
      const MeshLayout fixed = MeshLayout::Create(reordered, s.order).value();
      EXPECT_EQ(AnalyzeDimLocality(fixed, fixed.dim_index("TP").value(), hosts)
                    .crossing_groups,
                0)
          << layout.ToString() << " -> " << s.mesh_spec << " h " << h;
    }
  }
}

TEST(DimOrder, MovesTpInnermostAndExplainsTheImpossible) {
  const MeshLayout layout =
      MeshLayout::Create({4, 8, 2}, {"PP", "TP", "DP"}).value();
  const OrderSuggestion s =
      SuggestOrderKeepingInHost(layout, "TP", HostMap{8, 64}).value();
  ASSERT_TRUE(s.found);
  EXPECT_EQ(s.mesh_spec, "PP=4,DP=2,TP=8");
  const OrderSuggestion none =
      SuggestOrderKeepingInHost(layout, "TP", HostMap{4, 64}).value();
  EXPECT_FALSE(none.found);
  EXPECT_NE(none.reason.find("TP=8"), std::string::npos);
  EXPECT_FALSE(SuggestOrderKeepingInHost(layout, "EP", HostMap{4, 64}).ok());
}

}  // namespace
}  // namespace vemesh::plan
