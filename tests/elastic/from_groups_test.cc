// DeviceMesh::FromGroups (vemesh/mesh/device_mesh.h): a mesh that adopts one
// communicator per dimension the program already has. The groups here are
// fakes that only describe themselves (every collective is Unimplemented
// and counted), so the tests also show that adopting communicates nothing.

#include <atomic>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/mesh/device_mesh.h"

namespace vemesh {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::atomic<int> g_collective_calls{0};

class FakeCommunicator final : public Communicator {
 public:
  FakeCommunicator(int rank, std::vector<int> ranks, std::string backend)
      : rank_(rank), ranks_(std::move(ranks)), backend_(std::move(backend)) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  absl::Span<const int> ranks() const override { return ranks_; }
  absl::string_view backend() const override { return backend_; }

  absl::StatusOr<std::shared_ptr<Communicator>> split(int, int) override {
    return Refuse("split");
  }
  NativeHandle native_handle() const override {
    return NativeHandle{backend_, nullptr};
  }

 protected:
  // Every operation: counted and refused.
  WorkOr Start(const Operation& op) override { return Refuse(op.Name()); }

 private:
  static absl::Status Refuse(absl::string_view op) {
    ++g_collective_calls;
    return absl::UnimplementedError(absl::StrCat("fake ", op));
  }

  const int rank_;
  const std::vector<int> ranks_;
  const std::string backend_;
};

// The layout under test: 2 x 3, row-major arange, so global rank
// g = dp * 3 + tp.
constexpr int kDp = 2;
constexpr int kTp = 3;

MeshLayout Layout() {
  auto layout = MeshLayout::Create({kDp, kTp}, {"DP", "TP"});
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *std::move(layout);
}

// The right groups of global rank `g`, worked out from the row-major rule.
std::shared_ptr<Communicator> DpGroup(int g) {
  std::vector<int> ranks;
  for (int dp = 0; dp < kDp; ++dp) ranks.push_back(dp * kTp + g % kTp);
  return std::make_shared<FakeCommunicator>(g / kTp, ranks, "fake-dp");
}
std::shared_ptr<Communicator> TpGroup(int g) {
  std::vector<int> ranks;
  for (int tp = 0; tp < kTp; ++tp) ranks.push_back(g / kTp * kTp + tp);
  return std::make_shared<FakeCommunicator>(g % kTp, ranks, "fake-tp");
}

class FromGroupsEveryRankTest : public ::testing::TestWithParam<int> {};

INSTANTIATE_TEST_SUITE_P(Ranks, FromGroupsEveryRankTest,
                         ::testing::Range(0, kDp* kTp),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("rank", info.param);
                         });

TEST_P(FromGroupsEveryRankTest, AdoptsTheRightGroups) {
  const int g = GetParam();
  const int calls_before = g_collective_calls.load();
  auto dp = DpGroup(g);
  auto tp = TpGroup(g);
  auto mesh = DeviceMesh::FromGroups(DeviceType::kCpu, Layout(), g, {dp, tp},
                                     /*host_local_rank=*/g % 2,
                                     /*host_size=*/2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();

  EXPECT_EQ(mesh->device_type(), DeviceType::kCpu);
  EXPECT_EQ(mesh->global_rank(), g);
  EXPECT_TRUE(mesh->has_self());
  EXPECT_EQ(mesh->size(), kDp * kTp);
  EXPECT_THAT(mesh->shape(), ElementsAre(kDp, kTp));
  EXPECT_THAT(mesh->mesh_dim_names(), ElementsAre("DP", "TP"));

  auto coord = mesh->get_coordinate();
  ASSERT_TRUE(coord.ok()) << coord.status();
  EXPECT_THAT(*coord, ElementsAre(g / kTp, g % kTp));
  auto local = mesh->get_local_rank("TP");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(*local, g % kTp);

  // The very groups given, by name and by index.
  auto got_tp = mesh->get_group("TP");
  ASSERT_TRUE(got_tp.ok()) << got_tp.status();
  EXPECT_EQ(got_tp->get(), tp.get());
  auto got_dp = mesh->get_group(int64_t{0});
  ASSERT_TRUE(got_dp.ok()) << got_dp.status();
  EXPECT_EQ(got_dp->get(), dp.get());

  // Each dimension reports its own group's backend.
  auto tp_backend = mesh->backend("TP");
  ASSERT_TRUE(tp_backend.ok()) << tp_backend.status();
  EXPECT_EQ(*tp_backend, "fake-tp");
  auto dp_backend = mesh->backend("DP");
  ASSERT_TRUE(dp_backend.ok()) << dp_backend.status();
  EXPECT_EQ(*dp_backend, "fake-dp");

  EXPECT_EQ(mesh->host_local_rank(), g % 2);
  EXPECT_EQ(mesh->host_size(), 2);

  // A child mesh shares the adopted group.
  auto child = (*mesh)["TP"];
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_TRUE(child->same_root(*mesh));
  auto child_tp = child->get_group("TP");
  ASSERT_TRUE(child_tp.ok()) << child_tp.status();
  EXPECT_EQ(child_tp->get(), tp.get());

  // Adopting and querying called no collective.
  EXPECT_EQ(g_collective_calls.load(), calls_before);
}

TEST(FromGroupsTest, DefaultHostPlacementIsOneRankPerHost) {
  auto mesh = DeviceMesh::FromGroups(DeviceType::kCuda, Layout(), 4,
                                     {DpGroup(4), TpGroup(4)});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(mesh->device_type(), DeviceType::kCuda);
  EXPECT_EQ(mesh->host_local_rank(), 0);
  EXPECT_EQ(mesh->host_size(), 1);
}

TEST(FromGroupsTest, MeshHoldsTheGroupsAfterTheCallerLetsGo) {
  const int64_t before = LiveCommunicatorCount();
  std::weak_ptr<Communicator> weak_tp;
  {
    auto tp = TpGroup(2);
    weak_tp = tp;
    auto mesh = DeviceMesh::FromGroups(DeviceType::kCpu, Layout(), 2,
                                       {DpGroup(2), std::move(tp)});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    EXPECT_EQ(LiveCommunicatorCount(), before + 2);
    EXPECT_FALSE(weak_tp.expired());
  }
  EXPECT_TRUE(weak_tp.expired());
  EXPECT_EQ(LiveCommunicatorCount(), before);
}

// -- Flatten -----------------------------------------------------------------

TEST(FromGroupsTest, FlattenOfSeveralDimensionsIsFailedPrecondition) {
  const int calls_before = g_collective_calls.load();
  auto mesh = DeviceMesh::FromGroups(DeviceType::kCpu, Layout(), 5,
                                     {DpGroup(5), TpGroup(5)});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto flat = mesh->flatten({"DP", "TP"});
  ASSERT_FALSE(flat.ok());
  EXPECT_EQ(flat.status().code(), absl::StatusCode::kFailedPrecondition)
      << flat.status();
  EXPECT_THAT(flat.status().message(), HasSubstr("adopted its groups"));
  EXPECT_THAT(flat.status().message(), HasSubstr("[DP, TP]"));
  // The other order is refused the same way, and nothing was called.
  auto reversed = mesh->flatten({"TP", "DP"}, "TPDP");
  ASSERT_FALSE(reversed.ok());
  EXPECT_EQ(reversed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(g_collective_calls.load(), calls_before);
  // The refusal registered nothing: the name is still free.
  EXPECT_FALSE(mesh->get_group("DP_TP").ok());
}

TEST(FromGroupsTest, FlattenOfOneDimensionIsThatGroup) {
  auto tp = TpGroup(1);
  auto mesh =
      DeviceMesh::FromGroups(DeviceType::kCpu, Layout(), 1, {DpGroup(1), tp});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto flat = mesh->flatten({"TP"}, "T");
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ(flat->get(), tp.get());
  auto by_name = mesh->get_group("T");
  ASSERT_TRUE(by_name.ok()) << by_name.status();
  EXPECT_EQ(by_name->get(), tp.get());
}

// -- Wrong groups
// --------------------------------------------------------------

struct BadGroups {
  const char* why;
  DeviceType device_type = DeviceType::kCpu;
  int global_rank = 4;
  // Built per test: the groups to pass.
  std::vector<std::shared_ptr<Communicator>> (*groups)() = nullptr;
  int host_local_rank = 0;
  int host_size = 1;
  std::vector<std::string> named;  // what the message must contain
};

// gtest prints a failing case by this, not as bytes.
void PrintTo(const BadGroups& bad, std::ostream* os) { *os << bad.why; }

// Global rank 4 is coordinate (1, 1): DP group [1, 4] (rank 1), TP group
// [3, 4, 5] (rank 1).
std::vector<BadGroups> BadCatalogue() {
  using Groups = std::vector<std::shared_ptr<Communicator>>;
  return {
      {.why = "OneGroupForTwoDims",
       .groups = [] { return Groups{DpGroup(4)}; },
       .named = {"1 groups", "one per dimension (2)"}},
      {.why = "ThreeGroupsForTwoDims",
       .groups =
           [] {
             return Groups{DpGroup(4), TpGroup(4), TpGroup(4)};
           },
       .named = {"3 groups", "one per dimension (2)"}},
      {.why = "NoGroups",
       .groups = [] { return Groups{}; },
       .named = {"0 groups"}},
      {.why = "NullTpGroup",
       .groups =
           [] {
             return Groups{DpGroup(4), nullptr};
           },
       .named = {"no group for dimension 'TP'"}},
      {.why = "NullDpGroup",
       .groups =
           [] {
             return Groups{nullptr, TpGroup(4)};
           },
       .named = {"no group for dimension 'DP'"}},
      {.why = "TpGroupTooSmall",
       .groups =
           [] {
             return Groups{DpGroup(4), std::make_shared<FakeCommunicator>(
                                           1, std::vector<int>{3, 4}, "f")};
           },
       .named = {"group of 'TP'", "rank 1 of 2", "expected rank 1 of 3"}},
      {.why = "GroupsSwapped",
       .groups =
           [] {
             return Groups{TpGroup(4), DpGroup(4)};
           },
       .named = {"group of 'DP'", "rank 1 of 3", "expected rank 1 of 2"}},
      {.why = "DpRankIsNotTheCoordinate",
       .groups =
           [] {
             return Groups{std::make_shared<FakeCommunicator>(
                               0, std::vector<int>{1, 4}, "f"),
                           TpGroup(4)};
           },
       .named = {"group of 'DP'", "rank 0 of 2", "expected rank 1 of 2"}},
      {.why = "GroupOfAnotherRank",
       // Rank 3's groups: TP has the same members but rank 0, not 1.
       .groups =
           [] {
             return Groups{DpGroup(4), TpGroup(3)};
           },
       .named = {"group of 'TP'", "rank 0 of 3", "expected rank 1 of 3"}},
      {.why = "TpRanksOutOfOrder",
       .groups =
           [] {
             return Groups{DpGroup(4), std::make_shared<FakeCommunicator>(
                                           1, std::vector<int>{5, 4, 3}, "f")};
           },
       .named = {"group of 'TP'", "holds rank 5 at index 0", "expected 3"}},
      {.why = "DpRanksOfAnotherColumn",
       .groups =
           [] {
             return Groups{std::make_shared<FakeCommunicator>(
                               1, std::vector<int>{2, 4}, "f"),
                           TpGroup(4)};
           },
       .named = {"group of 'DP'", "holds rank 2 at index 0", "expected 1"}},
      {.why = "HostLocalRankPastHostSize",
       .groups =
           [] {
             return Groups{DpGroup(4), TpGroup(4)};
           },
       .host_local_rank = 2,
       .host_size = 2,
       .named = {"host-local rank 2 of a host of 2"}},
      {.why = "NegativeHostLocalRank",
       .groups =
           [] {
             return Groups{DpGroup(4), TpGroup(4)};
           },
       .host_local_rank = -1,
       .host_size = 2,
       .named = {"host-local rank -1 of a host of 2"}},
      {.why = "EmptyHost",
       .groups =
           [] {
             return Groups{DpGroup(4), TpGroup(4)};
           },
       .host_local_rank = 0,
       .host_size = 0,
       .named = {"host-local rank 0 of a host of 0"}},
      {.why = "MetaDevice",
       .device_type = DeviceType::kMeta,
       .groups =
           [] {
             return Groups{DpGroup(4), TpGroup(4)};
           },
       .named = {"meta"}},
  };
}

class FromGroupsBadTest : public ::testing::TestWithParam<BadGroups> {};

INSTANTIATE_TEST_SUITE_P(Catalogue, FromGroupsBadTest,
                         ::testing::ValuesIn(BadCatalogue()),
                         [](const ::testing::TestParamInfo<BadGroups>& info) {
                           return std::string(info.param.why);
                         });

TEST_P(FromGroupsBadTest, IsInvalidArgumentNamingWhatDiffers) {
  const BadGroups& bad = GetParam();
  const int calls_before = g_collective_calls.load();
  const int64_t before = LiveCommunicatorCount();
  {
    auto mesh = DeviceMesh::FromGroups(bad.device_type, Layout(),
                                       bad.global_rank, bad.groups(),
                                       bad.host_local_rank, bad.host_size);
    ASSERT_FALSE(mesh.ok()) << mesh->ToString();
    EXPECT_EQ(mesh.status().code(), absl::StatusCode::kInvalidArgument)
        << mesh.status();
    EXPECT_THAT(mesh.status().message(), HasSubstr("DeviceMesh::FromGroups"));
    for (const std::string& part : bad.named) {
      EXPECT_THAT(mesh.status().message(), HasSubstr(part));
    }
  }
  // A refused group is not kept, and was never called.
  EXPECT_EQ(LiveCommunicatorCount(), before);
  EXPECT_EQ(g_collective_calls.load(), calls_before);
}

TEST(FromGroupsTest, RankOutsideTheLayoutIsRefused) {
  // Global rank 6 is past the 2 x 3 grid; its "groups" are whatever the
  // program passes.
  auto mesh = DeviceMesh::FromGroups(DeviceType::kCpu, Layout(), 6,
                                     {DpGroup(4), TpGroup(4)});
  ASSERT_FALSE(mesh.ok());
  EXPECT_THAT(mesh.status().message(), HasSubstr("6"));
}

}  // namespace
}  // namespace vemesh
