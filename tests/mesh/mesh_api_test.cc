// The spellings a new user types, on a local (meta) mesh: an integer
// dimension reaches the index overloads, `mesh[{"a", "b"}]` is a 2-D slice,
// and `mesh["a", "b"]` does not compile (tests/mesh/
// comma_subscript.cc, checked by the device_mesh.comma_subscript tests).
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/mesh/device_mesh.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace vemesh {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Compile-time: the brace spelling is a slice, an integer is an index.
static_assert(requires(const DeviceMesh& m) {
  { m[{"DP", "TP"}] } -> std::same_as<absl::StatusOr<DeviceMesh>>;
  { m[0] } -> std::same_as<absl::StatusOr<DeviceMesh>>;
  { m.size(0) } -> std::same_as<absl::StatusOr<int64_t>>;
});
static_assert(requires(const VeDeviceMesh& r) {
  { r[{"DP", "TP"}] } -> std::same_as<absl::StatusOr<DeviceMesh>>;
  { r.size(0) } -> std::same_as<absl::StatusOr<int64_t>>;
});

DeviceMesh Mesh234(int64_t rank) {
  auto layout = MeshLayout::Create({2, 3, 4}, {"PP", "DP", "TP"});
  return DeviceMesh::Meta(*layout, rank);
}

TEST(MeshApi, SizeOfALiteralZeroIsTheFirstDimension) {
  const DeviceMesh mesh = Mesh234(0);
  // Before: size(0) was size(absl::string_view(nullptr)), NotFound ''.
  auto s0 = mesh.size(0);
  ASSERT_TRUE(s0.ok()) << s0.status();
  EXPECT_EQ(*s0, 2);
  EXPECT_EQ(*mesh.size(1), 3);
  EXPECT_EQ(*mesh.size(int64_t{2}), 4);
  EXPECT_EQ(*mesh.size(2u), 4);
  EXPECT_EQ(*mesh.size("TP"), 4);
  EXPECT_EQ(mesh.size(3).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(mesh.size(3).status().message()), HasSubstr("3"));
  EXPECT_EQ(mesh.size(-1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(MeshApi, IndexSubscriptIsThatDimension) {
  const DeviceMesh mesh = Mesh234(17);  // coordinate [1, 1, 1]
  auto pp = mesh[0];
  ASSERT_TRUE(pp.ok()) << pp.status();
  EXPECT_THAT(pp->mesh_dim_names(), ElementsAre("PP"));
  EXPECT_THAT(pp->mesh(), ElementsAre(5, 17));
  EXPECT_THAT(mesh[2]->mesh(), ElementsAre(16, 17, 18, 19));
  EXPECT_EQ(mesh[3].status().code(), absl::StatusCode::kOutOfRange);
}

TEST(MeshApi, BraceSubscriptIsASlice) {
  const DeviceMesh mesh = Mesh234(17);
  auto dp_tp = mesh[{"DP", "TP"}];
  ASSERT_TRUE(dp_tp.ok()) << dp_tp.status();
  EXPECT_THAT(dp_tp->mesh_dim_names(), ElementsAre("DP", "TP"));
  EXPECT_THAT(dp_tp->shape(), ElementsAre(3, 4));
  std::vector<int64_t> expected;
  for (int64_t i = 12; i < 24; ++i) expected.push_back(i);
  EXPECT_EQ(dp_tp->mesh(), expected);
  EXPECT_EQ(mesh[{"TP"}]->mesh(), mesh["TP"]->mesh());
  auto bad = mesh[{"DP", "XX"}];
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
}

TEST(MeshApi, RegistryIndexAndBraceSubscripts) {
  VeDeviceMesh reg;
  ASSERT_TRUE(reg.init_device_mesh("meta", {2, 4}, {"dp", "tp"}).ok());
  EXPECT_EQ(*reg.size(0), 2);
  EXPECT_EQ(*reg.size(1), 4);
  EXPECT_EQ(*reg.get_strategy_size(0), 2);
  EXPECT_EQ(*reg.lookup_rank(0), 0);
  EXPECT_THAT(reg[1]->mesh_dim_names(), ElementsAre("tp"));
  auto tp_dp = reg[{"tp", "dp"}];
  ASSERT_TRUE(tp_dp.ok()) << tp_dp.status();
  EXPECT_THAT(tp_dp->shape(), ElementsAre(4, 2));
  EXPECT_EQ(reg[2].status().code(), absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace vemesh
