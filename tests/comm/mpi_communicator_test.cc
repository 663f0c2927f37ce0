// The MPI backend's own behaviour, run on 1, 2 and 4 ranks: its world and
// data types against MPI's, 16-bit rounding within a bound, MPI's int
// counts, receive count mismatches, and the communicators a split keeps.
// What every backend must do (every operation for every data type, blocking
// and asynchronous, abort, deadlines, split order) is the conformance
// suite's (tests/comm/conformance/, conformance_mpi_test).

#include "vemesh/comm/mpi/mpi_communicator.h"
#include "vemesh/comm/mpi/internal/mpi_datatypes.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vemesh {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::NotNull;

std::shared_ptr<MpiCommunicator> World() {
  auto world = MpiCommunicator::World();
  EXPECT_TRUE(world.ok()) << world.status();
  return world.ok() ? *world : nullptr;
}

// test() until the operation finished: bounded by count and by time.
bool TestUntilDone(Work& work) {
  const absl::Time until = absl::Now() + absl::Seconds(30);
  for (int i = 0; i < 10'000'000 && absl::Now() < until; ++i) {
    if (work.test()) return true;
    if (i > 1000) std::this_thread::yield();
  }
  return false;
}

// An operation that started, finished under test() and ended OK.
::testing::AssertionResult TestedOk(const Communicator::WorkOr& w) {
  if (!w.ok()) return ::testing::AssertionFailure() << w.status();
  if (!TestUntilDone(**w)) {
    return ::testing::AssertionFailure() << (*w)->name() << " did not finish";
  }
  if (!(*w)->status().ok())
    return ::testing::AssertionFailure() << (*w)->status();
  return ::testing::AssertionSuccess();
}

TEST(DataTypes, NamesAndSizes) {
  EXPECT_EQ(SizeOf(DataType::kBFloat16), 2u);
  EXPECT_EQ(SizeOf(DataType::kFloat16), 2u);
  EXPECT_EQ(SizeOf(DataType::kInt8), 1u);
  EXPECT_EQ(SizeOf(DataType::kUInt8), 1u);
  EXPECT_EQ(SizeOf(DataType::kInt64), 8u);
  EXPECT_EQ(DataTypeName(DataType::kBFloat16), "bfloat16");
  EXPECT_EQ(ReduceOpName(ReduceOp::kAvg), "avg");
}

TEST(MpiTypes, SixteenBitTypesAreTwoBytesAndDistinct) {
  ASSERT_THAT(World(), NotNull());  // MPI is running
  for (DataType t : {DataType::kBFloat16, DataType::kFloat16}) {
    MPI_Datatype m = MpiDataType(t);
    ASSERT_NE(m, MPI_DATATYPE_NULL) << DataTypeName(t);
    int bytes = 0;
    MPI_Type_size(m, &bytes);
    EXPECT_EQ(bytes, 2) << DataTypeName(t);
    EXPECT_EQ(MpiDataType(t), m) << "made once";
  }
  EXPECT_NE(MpiReduceOp(ReduceOp::kSum, DataType::kBFloat16),
            MpiReduceOp(ReduceOp::kSum, DataType::kFloat16));
  EXPECT_EQ(MpiReduceOp(ReduceOp::kProd, DataType::kInt32), MPI_PROD);
  EXPECT_EQ(MpiReduceOp(ReduceOp::kAvg, DataType::kFloat32), MPI_SUM);
  EXPECT_EQ(MpiDataType(DataType::kInt8), MPI_INT8_T);
  EXPECT_EQ(MpiDataType(DataType::kUInt8), MPI_UINT8_T);
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
  EXPECT_TRUE(TestedOk(world->ibarrier()));
}

// -- Rounding of 16-bit floats, with a tolerance
// -------------------------------------

// Values that bfloat16 cannot hold exactly. The backend rounds the partial
// sum to bfloat16 after each of the size()-1 combining steps. bfloat16 has
// 8 significant bits, so rounding to nearest is off by at most half a unit
// in the last place: 2^-8 of the rounded value's magnitude, and every
// partial sum is at most sum(|x_r|). So the result is within
// (size()-1) * 2^-8 * sum(|x_r|) of the exact sum of the bfloat16 inputs
// (in whatever order MPI combines them); with one rank nothing is rounded.
TEST(MpiCommunicator, BFloat16SumWithinRoundingBound) {
  auto world = World();
  ASSERT_THAT(world, NotNull());
  const int me = world->rank();
  const int n = world->size();
  const size_t count = 4096;  // several of MPI's internal segments
  auto input = [](int r, size_t i) {
    return BFloat16(0.1f * static_cast<float>(r + 1) +
                    0.013f * static_cast<float>(i % 97));
  };
  std::vector<BFloat16> data(count);
  for (size_t i = 0; i < count; ++i) data[i] = input(me, i);
  ASSERT_TRUE(world->all_reduce(absl::MakeSpan(data), ReduceOp::kSum).ok());
  for (size_t i = 0; i < count; ++i) {
    double exact = 0;
    double magnitude = 0;
    for (int r = 0; r < n; ++r) {
      const double x = static_cast<float>(input(r, i));
      exact += x;
      magnitude += std::abs(x);
    }
    const double bound = (n - 1) * std::ldexp(1.0, -8) * magnitude;
    EXPECT_NEAR(static_cast<float>(data[i]), exact, bound) << "i " << i;
  }
}

// -- Misuse
// ---------------------------------------------------------------------------

// MPI counts are int: INT_MAX + 1 elements is refused before any MPI call.
// (The base class's other checks reach every backend: the conformance
// suite.)
TEST(MpiCommunicator, CountsAboveIntMaxAreRefused) {
  auto world = World();
  ASSERT_THAT(world, NotNull());
  std::vector<int32_t> buffer(4);
  absl::Status s = world->all_reduce(buffer.data(), buffer.data(),
                                     static_cast<size_t>(INT_MAX) + 1,
                                     DataType::kInt8, ReduceOp::kSum);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr(absl::StrCat("limit of ", INT_MAX)));
  EXPECT_TRUE(world->barrier().ok());  // the group is still usable
}

TEST(MpiCommunicator, NonMemberGlobalRankIsNotFound) {
  auto world = World();
  ASSERT_THAT(world, NotNull());
  const int me = world->rank();
  if (world->size() < 2) GTEST_SKIP() << "needs another rank outside a group";
  auto alone = world->split(me, 0);  // every rank by itself
  ASSERT_TRUE(alone.ok()) << alone.status();
  std::vector<float> x(2);
  const int other = (me + 1) % world->size();
  absl::Status s = (*alone)->send(absl::MakeConstSpan(x), GlobalRank(other));
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat(other)));
  auto g = (*alone)->group_rank(other);
  EXPECT_TRUE(absl::IsNotFound(g.status())) << g.status();
  EXPECT_EQ(*(*alone)->group_rank(me), 0);
}

TEST(MpiCommunicator, ReceiveCountMismatchNamesBothCounts) {
  auto world = World();
  ASSERT_THAT(world, NotNull());
  const int me = world->rank();
  const int n = world->size();
  const int next = (me + 1) % n;
  const int prev = (me + n - 1) % n;
  std::vector<int32_t> three = {1, 2, 3};
  // Fewer than expected: 3 sent, 5 expected.
  std::vector<int32_t> five(5);
  absl::Status s = world->send_recv(absl::MakeConstSpan(three), next,
                                    absl::MakeSpan(five), prev);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("expected 5"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("got 3"));
  // More than expected: MPI truncates, still InvalidArgument.
  std::vector<int32_t> two(2);
  s = world->send_recv(absl::MakeConstSpan(three), next, absl::MakeSpan(two),
                       prev);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("expected 2"));
  // Both transfers finished: the communicator goes on.
  std::vector<int32_t> in(3);
  ASSERT_TRUE(world
                  ->send_recv(absl::MakeConstSpan(three), next,
                              absl::MakeSpan(in), prev)
                  .ok());
  EXPECT_EQ(in, three);
  EXPECT_TRUE(world->barrier().ok());
}

// Issue 44: ranks that pass different collectives (count, type, op, root,
// kind) get InvalidArgument on every rank, naming both, and the group goes
// on. Without the agreement check Open MPI ended the whole job
// (MPI_ERR_TRUNCATE reported on MPI_COMM_WORLD from inside MPI_Test).
TEST(MpiCommunicator, MismatchedCollectivesFailOnEveryRankAndTheGroupGoesOn) {
  auto world = World();
  ASSERT_THAT(world, NotNull());
  if (world->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  ASSERT_TRUE(world->collective_check());  // the default
  const int me = world->rank();
  const int n = world->size();
  auto expect_mismatch = [&](const absl::Status& s, const std::string& what) {
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(what)) << s;
  };
  // The count: MPI_ERR_TRUNCATE before.
  std::vector<float> a(me == 1 ? 16 : 8, 1.0f);
  expect_mismatch(world->all_reduce(absl::MakeSpan(a), ReduceOp::kSum),
                  "rank 1 has all_reduce of 16 float32 (op sum), rank 0 has "
                  "all_reduce of 8 float32");
  // The type (float32 here, float64 on rank 1).
  std::vector<float> f(8, 1.0f);
  std::vector<double> d(8, 1.0);
  expect_mismatch(me == 1
                      ? world->all_reduce(absl::MakeSpan(d), ReduceOp::kSum)
                      : world->all_reduce(absl::MakeSpan(f), ReduceOp::kSum),
                  "rank 1 has all_reduce of 8 float64");
  // The reduction and the root.
  expect_mismatch(world->all_reduce(absl::MakeSpan(f),
                                    me == 1 ? ReduceOp::kMax : ReduceOp::kSum),
                  "op max");
  expect_mismatch(world->broadcast(absl::MakeSpan(f), me == 1 ? 1 : 0),
                  "root 1");
  // The operation itself, asynchronous, waited for on every rank.
  Communicator::WorkOr w =
      me == 1 ? world->ibroadcast(absl::MakeSpan(f), 0)
              : world->iall_reduce(absl::MakeSpan(f), ReduceOp::kSum);
  ASSERT_TRUE(w.ok()) << w.status();
  expect_mismatch((*w)->wait(absl::Now() + absl::Seconds(30)),
                  "rank 1 has broadcast of 8 float32 (root 0)");
  // Nothing broke: the next collectives agree and sum.
  std::vector<float> ones(8, 1.0f);
  ASSERT_TRUE(world->all_reduce(absl::MakeSpan(ones), ReduceOp::kSum).ok());
  EXPECT_EQ(ones, std::vector<float>(8, static_cast<float>(n)));
  EXPECT_TRUE(world->barrier().ok());
}

// Checked collectives post their data in issue order whichever Work is
// waited for first (every rank calls MPI's collectives in one order), and
// a split between them waits for them.
TEST(MpiCommunicator, CheckedCollectivesKeepTheirOrderWaitedInReverse) {
  auto world = World();
  ASSERT_THAT(world, NotNull());
  const int me = world->rank();
  const int n = world->size();
  std::vector<std::vector<int64_t>> data;
  for (int i = 0; i < 8; ++i) data.emplace_back(4 + i, me + i);
  std::vector<std::shared_ptr<Work>> works;
  for (auto& v : data) {
    auto w = world->iall_reduce(absl::MakeSpan(v), ReduceOp::kSum);
    ASSERT_TRUE(w.ok()) << w.status();
    works.push_back(*w);
  }
  // Rank 0 waits newest first, the others oldest first.
  if (me == 0) std::reverse(works.begin(), works.end());
  for (auto& w : works) {
    ASSERT_TRUE(w->wait(absl::Now() + absl::Seconds(30)).ok()) << w->status();
  }
  for (int i = 0; i < 8; ++i) {
    const int64_t sum =
        static_cast<int64_t>(n) * (n - 1) / 2 + static_cast<int64_t>(n) * i;
    EXPECT_EQ(data[i], std::vector<int64_t>(4 + i, sum)) << "operation " << i;
  }
  // An operation still waiting for its agreement when the group splits.
  std::vector<int32_t> last(3, 1);
  auto pending = world->iall_reduce(absl::MakeSpan(last), ReduceOp::kSum);
  ASSERT_TRUE(pending.ok());
  auto half = world->split(me % 2, me);
  ASSERT_TRUE(half.ok()) << half.status();
  ASSERT_TRUE((*pending)->wait(absl::Now() + absl::Seconds(30)).ok());
  EXPECT_EQ(last, std::vector<int32_t>(3, n));
  std::vector<int32_t> one(1, 1);
  ASSERT_TRUE((*half)->all_reduce(absl::MakeSpan(one), ReduceOp::kSum).ok());
  EXPECT_EQ(one[0], (*half)->size());
}

// The check can be turned off (VEMESH_COLLECTIVE_CHECK=0, or per group):
// the same results without the exchange.
TEST(MpiCommunicator, CollectiveCheckOffStillComputes) {
  auto world = World();
  ASSERT_THAT(world, NotNull());
  world->set_collective_check(false);
  std::vector<double> v(5, 1.5);
  ASSERT_TRUE(world->all_reduce(absl::MakeSpan(v), ReduceOp::kSum).ok());
  EXPECT_EQ(v, std::vector<double>(5, 1.5 * world->size()));
  world->set_collective_check(true);
  EXPECT_TRUE(world->barrier().ok());
}

// -- Groups
// --------------------------------------------------------------------------

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
