// DeviceMesh on worlds of 1, 2, 4, 6 and 8 ranks. Each test adapts to the
// world size it finds; every expectation is computed by each rank from the
// layout alone, then compared with what the communicators do.

#include "vemesh/mesh/device_mesh.h"

#include <mpi.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/comm/mpi/mpi_communicator.h"
#include "vemesh/comm/nccl/nccl_communicator.h"

namespace vemesh {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::NotNull;

int WorldRank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int WorldSize() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

std::vector<int64_t> Int64s(absl::Span<const int> values) {
  return std::vector<int64_t>(values.begin(), values.end());
}

// An all_reduce of `T(global rank + 1)` over `group`, against the sum,
// max and min of the expected members.
template <typename T>
void ExpectReductions(Communicator& group, const std::vector<int64_t>& members,
                      int64_t me) {
  T sum = 0;
  T max = static_cast<T>(members[0] + 1);
  T min = max;
  for (int64_t r : members) {
    sum += static_cast<T>(r + 1);
    max = std::max(max, static_cast<T>(r + 1));
    min = std::min(min, static_cast<T>(r + 1));
  }
  for (auto [op, expected] :
       {std::pair{ReduceOp::kSum, sum}, std::pair{ReduceOp::kMax, max},
        std::pair{ReduceOp::kMin, min}}) {
    T value = static_cast<T>(me + 1);
    ASSERT_TRUE(group.all_reduce(absl::MakeSpan(&value, 1), op).ok());
    EXPECT_EQ(value, expected)
        << DataTypeName(DataTypeOf<T>()) << " " << ReduceOpName(op);
  }
}

// For every dimension: the group is the layout's group, in order, as seen
// by ranks() and by an all_gather of global ranks; reductions agree.
void ExpectGroupsMatchLayout(const DeviceMesh& mesh) {
  const int64_t me = mesh.global_rank();
  auto coord = mesh.get_coordinate();
  ASSERT_TRUE(coord.ok()) << coord.status();
  for (int64_t d = 0; d < mesh.ndim(); ++d) {
    const std::string& name = mesh.layout().dim_name(d);
    SCOPED_TRACE(absl::StrCat("dim ", name));
    auto expected = mesh.layout().submesh({name}, me);
    ASSERT_TRUE(expected.ok()) << expected.status();
    const std::vector<int64_t> members = expected->ranks();
    auto by_name = mesh.get_group(name);
    auto by_index = mesh.get_group(d);
    ASSERT_TRUE(by_name.ok()) << by_name.status();
    ASSERT_TRUE(by_index.ok()) << by_index.status();
    ASSERT_EQ(*by_name, *by_index);
    Communicator& group = **by_name;
    EXPECT_EQ(Int64s(group.ranks()), members);
    EXPECT_EQ(group.global_rank(), me);
    EXPECT_EQ(group.rank(), (*coord)[d]);
    EXPECT_EQ(mesh.get_local_rank(name).value_or(-1), (*coord)[d]);
    std::vector<int64_t> gathered(group.size());
    ASSERT_TRUE(
        group.all_gather(absl::MakeConstSpan(&me, 1), absl::MakeSpan(gathered))
            .ok());
    EXPECT_EQ(gathered, members);
    ExpectReductions<float>(group, members, me);
    ExpectReductions<double>(group, members, me);
    ExpectReductions<int32_t>(group, members, me);
    ExpectReductions<int64_t>(group, members, me);
  }
}

std::vector<std::string> NamesFor(size_t ndim) {
  if (ndim == 4) return {"PP", "DP", "CP", "TP"};
  return {};  // the defaults
}

TEST(DeviceMesh, EveryShapeOfThisWorld) {
  const int world = WorldSize();
  const std::vector<std::vector<int64_t>> shapes = {
      {1},       {1, 1},    {2},          {1, 2},      {2, 1},
      {4},       {2, 2},    {1, 4},       {2, 1, 2},   {6},
      {2, 3},    {3, 2},    {1, 2, 3},    {8},         {2, 2, 2},
      {4, 1, 2}, {2, 1, 4}, {2, 2, 1, 2}, {1, 2, 1, 3}};
  int tried = 0;
  for (const auto& shape : shapes) {
    const int64_t size = std::accumulate(shape.begin(), shape.end(), int64_t{1},
                                         std::multiplies<int64_t>());
    if (size != world) continue;
    SCOPED_TRACE(absl::StrCat("shape (", absl::StrJoin(shape, ", "), ")"));
    auto mesh = init_device_mesh("cpu", shape, NamesFor(shape.size()));
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    EXPECT_EQ(mesh->shape(), shape);
    EXPECT_EQ(mesh->size(), world);
    EXPECT_EQ(mesh->global_rank(), WorldRank());
    EXPECT_TRUE(mesh->has_self());
    std::vector<int64_t> all(world);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(mesh->mesh(), all);
    ExpectGroupsMatchLayout(*mesh);
    ++tried;
  }
  EXPECT_GE(tried, 1);
}

TEST(DeviceMesh, ExplicitRankList) {
  // The world in reverse order, as one (world)-sized 2-D or 1-D mesh.
  const int world = WorldSize();
  MeshOptions options;
  for (int r = world - 1; r >= 0; --r) options.ranks.push_back(r);
  std::vector<int64_t> shape = world % 2 == 0
                                   ? std::vector<int64_t>{2, world / 2}
                                   : std::vector<int64_t>{world};
  auto mesh = init_device_mesh("cpu", shape, {}, options);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(mesh->mesh(), options.ranks);
  ExpectGroupsMatchLayout(*mesh);
}

TEST(DeviceMesh, SmallerThanTheWorld) {
  const int world = WorldSize();
  if (world < 2) GTEST_SKIP() << "needs 2 ranks";
  const int me = WorldRank();
  // The last rank stays out of a default mesh; the first rank stays out of
  // an explicit one.
  for (bool explicit_ranks : {false, true}) {
    SCOPED_TRACE(explicit_ranks ? "explicit ranks" : "arange");
    MeshOptions options;
    int64_t outsider = world - 1;
    if (explicit_ranks) {
      for (int r = 1; r < world; ++r) options.ranks.push_back(r);
      outsider = 0;
    }
    auto mesh = init_device_mesh("cpu", {world - 1}, {"DP"}, options);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    if (me == outsider) {
      EXPECT_FALSE(mesh->has_self());
      EXPECT_TRUE(absl::IsNotFound(mesh->get_coordinate().status()));
      auto group = mesh->get_group("DP");
      EXPECT_TRUE(absl::IsFailedPrecondition(group.status())) << group.status();
      EXPECT_THAT(std::string(group.status().message()),
                  HasSubstr("not a member"));
      EXPECT_TRUE(absl::IsFailedPrecondition((*mesh)["DP"].status()));
      EXPECT_THAT(mesh->ToString(), HasSubstr("not a member"));
    } else {
      EXPECT_TRUE(mesh->has_self());
      ExpectGroupsMatchLayout(*mesh);
    }
  }
  // A 2-D mesh smaller than the world, flattened: outsiders take part.
  if (world >= 4) {
    auto mesh = init_device_mesh("cpu", {2, (world - 1) / 2}, {"DP", "TP"});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    auto flat = mesh->flatten({"DP", "TP"});
    if (mesh->has_self()) {
      ASSERT_TRUE(flat.ok()) << flat.status();
      EXPECT_EQ(Int64s((*flat)->ranks()), mesh->mesh());
    } else {
      EXPECT_TRUE(absl::IsFailedPrecondition(flat.status())) << flat.status();
    }
  }
}

TEST(DeviceMesh, ChildrenShareTheParentsCommunicators) {
  const int world = WorldSize();
  std::vector<int64_t> shape = world % 2 == 0
                                   ? std::vector<int64_t>{1, world / 2, 2}
                                   : std::vector<int64_t>{1, 1, world};
  auto mesh = init_device_mesh("cpu", shape);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  const int64_t live = LiveCommunicatorCount();
  auto tp = (*mesh)["TP"];
  ASSERT_TRUE(tp.ok()) << tp.status();
  EXPECT_EQ(tp->ndim(), 1);
  EXPECT_EQ(tp->get_group("TP").value(), mesh->get_group("TP").value());
  EXPECT_EQ(tp->get_group(0).value(), mesh->get_group(2).value());
  auto dp_tp = mesh->slice({"DP", "TP"});
  ASSERT_TRUE(dp_tp.ok()) << dp_tp.status();
  EXPECT_EQ(dp_tp->get_group("DP").value(), mesh->get_group("DP").value());
  auto tp_dp = mesh->slice({"TP", "DP"});  // transposed
  ASSERT_TRUE(tp_dp.ok()) << tp_dp.status();
  EXPECT_EQ(tp_dp->get_group(0).value(), mesh->get_group("TP").value());
  auto grandchild = (*dp_tp)["DP"];
  ASSERT_TRUE(grandchild.ok());
  EXPECT_EQ(grandchild->get_group("DP").value(), mesh->get_group("DP").value());
  EXPECT_TRUE(absl::IsNotFound(tp->get_group("DP").status()));
  EXPECT_EQ(LiveCommunicatorCount(), live);  // slicing made none
  ExpectGroupsMatchLayout(*dp_tp);
  ExpectGroupsMatchLayout(*tp_dp);
}

TEST(DeviceMesh, FlattenIsCachedAndOrdered) {
  const int world = WorldSize();
  std::vector<int64_t> shape = world % 2 == 0
                                   ? std::vector<int64_t>{2, world / 2}
                                   : std::vector<int64_t>{1, world};
  auto mesh = init_device_mesh("cpu", shape, {"DP", "TP"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  const int64_t me = mesh->global_rank();
  auto flat = mesh->flatten({"DP", "TP"}, "DPTP");
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ(Int64s((*flat)->ranks()), mesh->mesh());
  const int64_t live = LiveCommunicatorCount();
  auto again = mesh->flatten({"DP", "TP"}, "DPTP");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *flat);
  auto by_name = mesh->get_group("DPTP");
  ASSERT_TRUE(by_name.ok()) << by_name.status();
  EXPECT_EQ(*by_name, *flat);
  // From a child holding both dimensions: the same communicator.
  auto child = mesh->slice({"DP", "TP"});
  ASSERT_TRUE(child.ok());
  EXPECT_EQ(child->flatten({"DP", "TP"}, "DPTP").value(), *flat);
  EXPECT_EQ(LiveCommunicatorCount(), live);
  // One dimension is that dimension's group.
  EXPECT_EQ(mesh->flatten({"TP"}).value(), mesh->get_group("TP").value());

  // TP-major order is another group order: the layout says which.
  auto transposed = mesh->flatten({"TP", "DP"});
  ASSERT_TRUE(transposed.ok()) << transposed.status();
  auto layout = mesh->layout().flatten({"TP", "DP"}, "TP_DP");
  ASSERT_TRUE(layout.ok());
  auto group = layout->submesh({"TP_DP"}, me);
  ASSERT_TRUE(group.ok());
  EXPECT_EQ(Int64s((*transposed)->ranks()), group->ranks());
  std::vector<int64_t> gathered((*transposed)->size());
  ASSERT_TRUE(
      (*transposed)
          ->all_gather(absl::MakeConstSpan(&me, 1), absl::MakeSpan(gathered))
          .ok());
  EXPECT_EQ(gathered, group->ranks());

  // Bad names fail alike on every rank, before any communication.
  EXPECT_TRUE(absl::IsNotFound(mesh->flatten({"DP", "XX"}).status()) ||
              absl::IsInvalidArgument(mesh->flatten({"DP", "XX"}).status()));
  EXPECT_FALSE(mesh->flatten({"DP", "TP"}, "TP").ok());
}

TEST(DeviceMesh, MismatchedArgumentsFailOnEveryRank) {
  const int world = WorldSize();
  if (world < 2) GTEST_SKIP() << "needs 2 ranks";
  const int me = WorldRank();
  MeshOptions options;
  options.timeout = absl::Seconds(20);
  const absl::Time start = absl::Now();
  // Rank 1 transposes the shape.
  std::vector<int64_t> shape =
      me == 1 ? std::vector<int64_t>{world, 1} : std::vector<int64_t>{1, world};
  auto mesh = init_device_mesh("cpu", shape, {}, options);
  ASSERT_FALSE(mesh.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(mesh.status())) << mesh.status();
  EXPECT_THAT(std::string(mesh.status().message()),
              HasSubstr("shape: rank 1 has"));
  EXPECT_THAT(std::string(mesh.status().message()),
              HasSubstr(absl::StrCat("(", world, ", 1)")));

  // The last rank names its dimensions differently.
  std::vector<std::string> names = {"DP", "TP"};
  if (me == world - 1) names = {"DP", "EP"};
  mesh = init_device_mesh("cpu", {1, world}, names, options);
  ASSERT_FALSE(mesh.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(mesh.status())) << mesh.status();
  EXPECT_THAT(
      std::string(mesh.status().message()),
      HasSubstr(absl::StrCat("dim names: rank ", world - 1, " has [DP, EP]")));

  // Different explicit rank lists.
  MeshOptions reversed = options;
  for (int r = 0; r < world; ++r)
    reversed.ranks.push_back(me == 0 ? r : world - 1 - r);
  mesh = init_device_mesh("cpu", {world}, {"DP"}, reversed);
  if (world > 1) {
    ASSERT_FALSE(mesh.ok());
    EXPECT_THAT(std::string(mesh.status().message()),
                HasSubstr("ranks: rank 1 has ["));
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));

  // MPI is still healthy: a good mesh follows.
  auto good = init_device_mesh("cpu", {world});
  ASSERT_TRUE(good.ok()) << good.status();
  ExpectGroupsMatchLayout(*good);
}

TEST(DeviceMesh, TooLargeForTheWorldFailsOnEveryRank) {
  const int world = WorldSize();
  auto mesh = init_device_mesh("cpu", {world + 1});
  EXPECT_TRUE(absl::IsInvalidArgument(mesh.status())) << mesh.status();
  EXPECT_THAT(std::string(mesh.status().message()),
              HasSubstr("world has only"));
  MeshOptions options;
  options.ranks = {world};
  mesh = init_device_mesh("cpu", {1}, {"DP"}, options);
  EXPECT_TRUE(absl::IsInvalidArgument(mesh.status())) << mesh.status();
  EXPECT_THAT(std::string(mesh.status().message()), HasSubstr("holds rank"));
  // Bad input that never reaches communication.
  EXPECT_TRUE(
      absl::IsInvalidArgument(init_device_mesh("tpu", {world}).status()));
  EXPECT_FALSE(init_device_mesh("cpu", {0}).ok());
}

TEST(DeviceMesh, MetaMeshDoesNotCommunicate) {
  const int64_t live = LiveCommunicatorCount();
  // Larger than the world: planning only.
  auto mesh = init_device_mesh("meta", {4, 4}, {"DP", "TP"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(mesh->device_type(), DeviceType::kMeta);
  EXPECT_EQ(mesh->global_rank(), WorldRank());
  EXPECT_EQ(mesh->host_local_rank(), 0);
  EXPECT_EQ(mesh->host_size(), 1);
  auto group = mesh->get_group("TP");
  EXPECT_TRUE(absl::IsFailedPrecondition(group.status())) << group.status();
  EXPECT_THAT(std::string(group.status().message()), HasSubstr("meta"));
  EXPECT_TRUE(absl::IsFailedPrecondition(mesh->flatten({"DP", "TP"}).status()));
  auto tp = (*mesh)["TP"];
  ASSERT_TRUE(tp.ok());
  EXPECT_EQ(tp->mesh().size(), 4u);
  EXPECT_EQ(LiveCommunicatorCount(), live);
}

TEST(DeviceMesh, HostPlacement) {
  auto mesh = init_device_mesh("cpu", {WorldSize()});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  // The tests run on one host.
  EXPECT_EQ(mesh->host_size(), WorldSize());
  EXPECT_EQ(mesh->host_local_rank(), WorldRank());
  if (const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) {
    EXPECT_EQ(mesh->host_local_rank(), std::atoi(local));
  }
  EXPECT_THAT(mesh->ToString(), HasSubstr(absl::StrCat("rank=", WorldRank())));
}

TEST(DeviceMesh, CudaWithoutAGpuFailsOnEveryRank) {
  if (CudaDeviceCount().ok()) GTEST_SKIP() << "a GPU is present";
  auto mesh = init_device_mesh("cuda", {WorldSize()});
  ASSERT_FALSE(mesh.ok());
  EXPECT_FALSE(mesh.status().message().empty());
  // The failure was agreed on: MPI is still in step.
  auto good = init_device_mesh("cpu", {WorldSize()});
  EXPECT_TRUE(good.ok()) << good.status();
}

TEST(DeviceMesh, OverAnotherWorld) {
  // Two halves, each its own world: ranks are ranks in that world.
  auto world = MpiCommunicator::World();
  ASSERT_TRUE(world.ok()) << world.status();
  const int me = (*world)->rank();
  const int half = (*world)->size() / 2;
  const int color = half > 0 && me >= half ? 1 : 0;
  auto part = (*world)->split(color, me);
  ASSERT_TRUE(part.ok()) << part.status();
  MeshOptions options;
  options.world = *part;
  auto mesh = init_device_mesh("cpu", {(*part)->size()}, {"DP"}, options);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(mesh->global_rank(), (*part)->rank());
  ExpectGroupsMatchLayout(*mesh);
}

TEST(DeviceMesh, CreatingAndDestroyingDoesNotLeak) {
  const int world = WorldSize();
  const int64_t before = LiveCommunicatorCount();
  std::vector<int64_t> shape = world % 2 == 0
                                   ? std::vector<int64_t>{2, world / 2}
                                   : std::vector<int64_t>{1, world};
  for (int i = 0; i < 50; ++i) {
    auto mesh = init_device_mesh("cpu", shape, {"DP", "TP"});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    ASSERT_TRUE(mesh->flatten({"DP", "TP"}).ok());
    auto child = (*mesh)["TP"];
    ASSERT_TRUE(child.ok());
    // world copy, two dimensions, one flattened group
    EXPECT_EQ(LiveCommunicatorCount(), before + 4);
  }
  EXPECT_EQ(LiveCommunicatorCount(), before);
}

}  // namespace
}  // namespace vemesh
