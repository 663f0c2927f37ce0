// MpiCommunicator::split_many with group_local requests (issue 32): each
// group made by MPI_Comm_create_group over its members only. The groups
// equal MPI_Comm_split's, a rank outside every group makes no call (the
// others do not wait for it), bad members are refused before any call on
// every rank, and plain and group-local requests mix in one call.

#include <mpi.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/comm/mpi/mpi_communicator.h"

namespace vemesh {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::shared_ptr<MpiCommunicator> World() {
  auto world = MpiCommunicator::World();
  EXPECT_TRUE(world.ok()) << world.status();
  return world.ok() ? *world : nullptr;
}

// Rows and columns of a 2 x (size/2) grid (one row when size is odd), as a
// mesh asks for them: color, key, members.
std::vector<SplitRequest> GridRequests(int rank, int size, bool local) {
  const int cols = size % 2 == 0 ? size / 2 : size;
  const int rows = size / cols;
  SplitRequest row;
  row.name = "row";
  row.color = rank / cols;
  row.key = rank % cols;
  SplitRequest col;
  col.name = "col";
  col.color = rank % cols;
  col.key = rank / cols;
  for (int c = 0; c < cols; ++c) row.members.push_back(row.color * cols + c);
  for (int r = 0; r < rows; ++r) col.members.push_back(r * cols + col.color);
  row.group_local = local;
  col.group_local = local;
  if (!local) {
    row.members.clear();
    col.members.clear();
  }
  return {row, col};
}

int SumOfRanks(Communicator& comm) {
  int mine = comm.rank();
  int sum = -1;
  EXPECT_TRUE(
      comm.all_reduce(&mine, &sum, 1, DataType::kInt32, ReduceOp::kSum).ok());
  return sum;
}

TEST(MpiSplitMany, GroupLocalGivesTheSplitsGroups) {
  auto world = World();
  ASSERT_NE(world, nullptr);
  auto split = world->split_many(
      GridRequests(world->rank(), world->size(), /*local=*/false));
  auto local = world->split_many(
      GridRequests(world->rank(), world->size(), /*local=*/true));
  ASSERT_TRUE(split.ok()) << split.status();
  ASSERT_TRUE(local.ok()) << local.status();
  ASSERT_EQ(local->size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    Communicator& a = *(*split)[i];
    Communicator& b = *(*local)[i];
    EXPECT_EQ(b.rank(), a.rank());
    EXPECT_EQ(b.size(), a.size());
    EXPECT_THAT(b.ranks(), ElementsAreArray(a.ranks()));
    EXPECT_EQ(SumOfRanks(b), b.size() * (b.size() - 1) / 2);
  }
}

TEST(MpiSplitMany, RanksOutsideEveryGroupMakeNoCall) {
  auto world = World();
  ASSERT_NE(world, nullptr);
  // Only ranks 0 and 1 form a group; the others pass color -1 and return
  // at once (with a world split they would have to take part).
  SplitRequest request;
  request.group_local = true;
  if (world->rank() < 2) {
    request.color = 0;
    request.key = world->rank();
    for (int r = 0; r < std::min(2, world->size()); ++r) {
      request.members.push_back(r);
    }
  }
  auto groups = world->split_many(absl::MakeConstSpan(&request, 1));
  ASSERT_TRUE(groups.ok()) << groups.status();
  if (world->rank() < 2) {
    ASSERT_NE((*groups)[0], nullptr);
    EXPECT_EQ((*groups)[0]->size(), std::min(2, world->size()));
    EXPECT_EQ(SumOfRanks(*(*groups)[0]), world->size() >= 2 ? 1 : 0);
  } else {
    EXPECT_EQ((*groups)[0], nullptr);
  }
  // Everyone still meets on the world afterwards.
  EXPECT_EQ(SumOfRanks(*world), world->size() * (world->size() - 1) / 2);
}

TEST(MpiSplitMany, MembersWithoutThisRankAreRefusedBeforeAnyCall) {
  auto world = World();
  ASSERT_NE(world, nullptr);
  SplitRequest request;
  request.name = "TP";
  request.group_local = true;
  request.color = 0;
  request.key = 0;
  request.members = {world->size()};  // not this rank, not even in range
  auto groups = world->split_many(absl::MakeConstSpan(&request, 1));
  ASSERT_FALSE(groups.ok());
  EXPECT_EQ(groups.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(groups.status().message(), HasSubstr("'TP'"));
  EXPECT_THAT(groups.status().message(), HasSubstr("members"));
  // No rank made a call: the world is in step.
  EXPECT_EQ(SumOfRanks(*world), world->size() * (world->size() - 1) / 2);
}

TEST(MpiSplitMany, PlainAndGroupLocalMixInOneCall) {
  auto world = World();
  ASSERT_NE(world, nullptr);
  std::vector<SplitRequest> requests =
      GridRequests(world->rank(), world->size(), /*local=*/true);
  requests[1].group_local = false;  // the column by a world split
  requests[1].members.clear();
  auto groups = world->split_many(requests);
  ASSERT_TRUE(groups.ok()) << groups.status();
  for (const auto& g : *groups) {
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(SumOfRanks(*g), g->size() * (g->size() - 1) / 2);
  }
}

}  // namespace
}  // namespace vemesh
