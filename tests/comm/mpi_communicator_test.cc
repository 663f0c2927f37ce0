// The MPI backend, run on 1, 2 and 4 ranks. Every result is checked against
// values each rank computes on its own from the ranks' known inputs.

#include "vemesh/comm/mpi/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vemesh {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsNull;
using ::testing::NotNull;

std::shared_ptr<MpiCommunicator> World() {
  auto world = MpiCommunicator::World();
  EXPECT_TRUE(world.ok()) << world.status();
  return world.ok() ? *world : nullptr;
}

// The value rank `r` contributes at position `i`: mixed signs, small enough
// that float sums are exact.
template <typename T>
T Value(int r, size_t i) {
  return static_cast<T>((r * 7 + static_cast<int>(i) * 3) % 11) - T(5);
}

template <typename T>
T Reduce(ReduceOp op, int size, size_t i) {
  T acc = Value<T>(0, i);
  for (int r = 1; r < size; ++r) {
    const T v = Value<T>(r, i);
    if (op == ReduceOp::kSum) acc += v;
    if (op == ReduceOp::kMax) acc = std::max(acc, v);
    if (op == ReduceOp::kMin) acc = std::min(acc, v);
  }
  return acc;
}

TEST(DataTypes, NamesAndSizes) {
  EXPECT_EQ(SizeOf(DataType::kFloat32), 4u);
  EXPECT_EQ(SizeOf(DataType::kFloat64), 8u);
  EXPECT_EQ(SizeOf(DataType::kInt32), 4u);
  EXPECT_EQ(SizeOf(DataType::kInt64), 8u);
  EXPECT_EQ(DataTypeName(DataType::kInt64), "int64");
  EXPECT_EQ(DataTypeName(DataType::kFloat32), "float32");
  EXPECT_EQ(ReduceOpName(ReduceOp::kMax), "max");
  EXPECT_EQ(ReduceOpName(ReduceOp::kSum), "sum");
}

TEST(MpiCommunicator, WorldMatchesMpi) {
  auto world = World();
  ASSERT_THAT(world, NotNull());
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(world->rank(), rank);
  EXPECT_EQ(world->size(), size);
  EXPECT_EQ(world->global_rank(), rank);
  std::vector<int> all(size);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_THAT(world->ranks(), ElementsAreArray(all));
  EXPECT_EQ(world->backend(), "mpi");
  NativeHandle handle = world->native_handle();
  EXPECT_EQ(handle.backend, "mpi");
  int result = MPI_UNEQUAL;
  MPI_Comm_compare(*static_cast<MPI_Comm*>(handle.handle), MPI_COMM_WORLD,
                   &result);
  EXPECT_EQ(result, MPI_CONGRUENT);  // a private copy, not WORLD itself
  EXPECT_TRUE(world->barrier().ok());
}

template <typename T>
class Collectives : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, double, int32_t, int64_t>;
TYPED_TEST_SUITE(Collectives, ElementTypes);

TYPED_TEST(Collectives, Broadcast) {
  using T = TypeParam;
  auto world = World();
  ASSERT_THAT(world, NotNull());
  for (int root = 0; root < world->size(); ++root) {
    std::vector<T> data(5, T(99));
    if (world->rank() == root) {
      for (size_t i = 0; i < data.size(); ++i) data[i] = Value<T>(root, i);
    }
    ASSERT_TRUE(world->broadcast(absl::MakeSpan(data), root).ok());
    for (size_t i = 0; i < data.size(); ++i) {
      EXPECT_EQ(data[i], Value<T>(root, i)) << "root " << root << " i " << i;
    }
  }
}

TYPED_TEST(Collectives, AllReduceEveryOp) {
  using T = TypeParam;
  auto world = World();
  ASSERT_THAT(world, NotNull());
  const int me = world->rank();
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    std::vector<T> data(7);
    for (size_t i = 0; i < data.size(); ++i) data[i] = Value<T>(me, i);
    std::vector<T> out(7, T(0));
    // Out of place, then in place.
    ASSERT_TRUE(world
                    ->all_reduce(data.data(), out.data(), data.size(),
                                 DataTypeOf<T>(), op)
                    .ok());
    ASSERT_TRUE(world->all_reduce(absl::MakeSpan(data), op).ok());
    for (size_t i = 0; i < data.size(); ++i) {
      const T expected = Reduce<T>(op, world->size(), i);
      EXPECT_EQ(out[i], expected) << ReduceOpName(op) << " i " << i;
      EXPECT_EQ(data[i], expected) << ReduceOpName(op) << " in place, i " << i;
    }
  }
}

TYPED_TEST(Collectives, AllGather) {
  using T = TypeParam;
  auto world = World();
  ASSERT_THAT(world, NotNull());
  const int me = world->rank();
  const size_t count = 3;
  std::vector<T> mine(count);
  for (size_t i = 0; i < count; ++i) mine[i] = Value<T>(me, i);
  std::vector<T> all(count * world->size());
  ASSERT_TRUE(
      world->all_gather(absl::MakeConstSpan(mine), absl::MakeSpan(all)).ok());
  for (int r = 0; r < world->size(); ++r) {
    for (size_t i = 0; i < count; ++i) {
      EXPECT_EQ(all[r * count + i], Value<T>(r, i)) << "rank " << r;
    }
  }
}

TYPED_TEST(Collectives, ReduceScatterEveryOp) {
  using T = TypeParam;
  auto world = World();
  ASSERT_THAT(world, NotNull());
  const int me = world->rank();
  const size_t count = 2;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    std::vector<T> send(count * world->size());
    for (size_t i = 0; i < send.size(); ++i) send[i] = Value<T>(me, i);
    std::vector<T> recv(count);
    ASSERT_TRUE(world
                    ->reduce_scatter(absl::MakeConstSpan(send),
                                     absl::MakeSpan(recv), op)
                    .ok());
    for (size_t j = 0; j < count; ++j) {
      EXPECT_EQ(recv[j], Reduce<T>(op, world->size(), me * count + j))
          << ReduceOpName(op) << " j " << j;
    }
  }
}

TYPED_TEST(Collectives, SendRecvRing) {
  using T = TypeParam;
  auto world = World();
  ASSERT_THAT(world, NotNull());
  const int me = world->rank();
  const int n = world->size();
  const int next = (me + 1) % n;
  const int prev = (me + n - 1) % n;
  std::vector<T> out(4);
  for (size_t i = 0; i < out.size(); ++i) out[i] = Value<T>(me, i);
  std::vector<T> in(4, T(0));
  // A combined shift works on any size, oneself included.
  ASSERT_TRUE(world
                  ->send_recv(absl::MakeConstSpan(out), next,
                              absl::MakeSpan(in), prev)
                  .ok());
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(in[i], Value<T>(prev, i));
  if (n < 2) return;
  // Separate send and recv: even ranks send first, odd ranks receive first.
  std::fill(in.begin(), in.end(), T(0));
  if (me % 2 == 0) {
    ASSERT_TRUE(world->send(absl::MakeConstSpan(out), next).ok());
    ASSERT_TRUE(world->recv(absl::MakeSpan(in), prev).ok());
  } else {
    ASSERT_TRUE(world->recv(absl::MakeSpan(in), prev).ok());
    ASSERT_TRUE(world->send(absl::MakeConstSpan(out), next).ok());
  }
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(in[i], Value<T>(prev, i));
}

TEST(MpiCommunicator, SplitOrdersByKeyAndReportsWorldRanks) {
  auto world = World();
  ASSERT_THAT(world, NotNull());
  const int me = world->rank();
  const int n = world->size();
  // Two groups by parity, each ordered by descending world rank.
  auto half = world->split(me % 2, -me);
  ASSERT_TRUE(half.ok()) << half.status();
  ASSERT_THAT(*half, NotNull());
  std::vector<int> expected;
  for (int r = n - 1; r >= 0; --r) {
    if (r % 2 == me % 2) expected.push_back(r);
  }
  EXPECT_THAT((*half)->ranks(), ElementsAreArray(expected));
  EXPECT_EQ((*half)->global_rank(), me);
  std::vector<int> gathered(expected.size());
  ASSERT_TRUE((*half)
                  ->all_gather(absl::MakeConstSpan(&me, 1),
                               absl::MakeSpan(gathered))
                  .ok());
  EXPECT_EQ(gathered, expected);

  // A split of a split still reports world ranks.
  auto single = (*half)->split(me, 0);
  ASSERT_TRUE(single.ok()) << single.status();
  ASSERT_THAT(*single, NotNull());
  EXPECT_THAT((*single)->ranks(), ElementsAreArray({me}));

  // A negative color takes part and gets no group.
  auto some = world->split(me == 0 ? -1 : 0, me);
  ASSERT_TRUE(some.ok()) << some.status();
  if (me == 0) {
    EXPECT_THAT(*some, IsNull());
  } else {
    ASSERT_THAT(*some, NotNull());
    EXPECT_EQ((*some)->size(), n - 1);
    EXPECT_EQ((*some)->ranks()[0], 1);
  }
}

TEST(MpiCommunicator, BadArgumentsAreInvalidArgument) {
  auto world = World();
  ASSERT_THAT(world, NotNull());
  const int n = world->size();
  std::vector<int32_t> one(1);
  std::vector<int32_t> wrong(n + 1);
  absl::Status s =
      world->all_gather(absl::MakeConstSpan(one), absl::MakeSpan(wrong));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("all_gather"));
  s = world->reduce_scatter(absl::MakeConstSpan(wrong), absl::MakeSpan(one),
                            ReduceOp::kSum);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  s = world->broadcast(absl::MakeSpan(one), n);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("root"));
  s = world->send(absl::MakeConstSpan(one), -1);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  s = world->recv(absl::MakeSpan(one), n);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  s = world->all_reduce(nullptr, nullptr, 3, DataType::kInt32, ReduceOp::kSum);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("null"));
  std::vector<int32_t> buffer(4);
  s = world->all_reduce(buffer.data(), buffer.data() + 1, 3, DataType::kInt32,
                        ReduceOp::kSum);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_TRUE(world->barrier().ok());  // the group is still usable
}

TEST(MpiCommunicator, DestroyingFreesEveryCommunicator) {
  const int64_t before = LiveCommunicatorCount();
  {
    auto world = World();
    ASSERT_THAT(world, NotNull());
    for (int i = 0; i < 20; ++i) {
      auto child = world->split(world->rank() % 2, 0);
      ASSERT_TRUE(child.ok());
      EXPECT_EQ(LiveCommunicatorCount(), before + 2);
    }
  }
  EXPECT_EQ(LiveCommunicatorCount(), before);
}

}  // namespace
}  // namespace vemesh
