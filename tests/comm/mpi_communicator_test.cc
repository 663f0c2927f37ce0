// The MPI backend, run on 1, 2 and 4 ranks. Every result is checked against
// values each rank computes on its own from a formula of rank and index, for
// every operation and every data type; the blocking forms and the
// asynchronous ones (waited, or test()ed until done) both; and the failure
// surface: the base class's argument checks through this backend, count
// mismatches, deadlines and abort() from another thread.

#include "vemesh/comm/mpi/mpi_communicator.h"
#include "vemesh/comm/mpi/internal/mpi_datatypes.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
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
#include "expected_values.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vemesh {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsNull;
using ::testing::NotNull;
// Element values and the results they reduce to: tests/comm/expected_values.h.
using ::vemesh::testing::Expected;
using ::vemesh::testing::From;
using ::vemesh::testing::Inputs;
using ::vemesh::testing::OpsOf;
using ::vemesh::testing::To;
using ::vemesh::testing::Value;
using ::vemesh::testing::Values;

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
  if (!(*w)->status().ok()) return ::testing::AssertionFailure() << (*w)->status();
  return ::testing::AssertionSuccess();
}

// An operation that started and whose wait(deadline) ended OK.
::testing::AssertionResult WaitedOk(const Communicator::WorkOr& w,
                                    absl::Time deadline = absl::InfiniteFuture()) {
  if (!w.ok()) return ::testing::AssertionFailure() << w.status();
  const absl::Status s = (*w)->wait(deadline);
  if (!s.ok()) return ::testing::AssertionFailure() << s;
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

// -- Every operation x every data type ---------------------------------------------

template <typename T>
class Collectives : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, double, int32_t, int64_t, BFloat16,
                                      Float16, int8_t, uint8_t>;
TYPED_TEST_SUITE(Collectives, ElementTypes);

TYPED_TEST(Collectives, Broadcast) {
  using T = TypeParam;
  auto world = World();
  ASSERT_THAT(world, NotNull());
  for (int root = 0; root < world->size(); ++root) {
    std::vector<T> data(5, From<T>(99));
    if (world->rank() == root) data = Values<T>(root, 5);
    ASSERT_TRUE(world->broadcast(absl::MakeSpan(data), root).ok());
    for (size_t i = 0; i < data.size(); ++i) {
      EXPECT_VALUE(data[i], Value<T>(root, i)) << "root " << root << " i " << i;
    }
    // The asynchronous form, test()ed until done.
    std::vector<T> again(5, From<T>(99));
    if (world->rank() == root) again = Values<T>(root, 5);
    ASSERT_TRUE(TestedOk(world->ibroadcast(again.data(), again.size(),
                                           DataTypeOf<T>(), root)));
    for (size_t i = 0; i < again.size(); ++i) {
      EXPECT_VALUE(again[i], Value<T>(root, i)) << "async root " << root;
    }
  }
}

TYPED_TEST(Collectives, AllReduceEveryOp) {
  using T = TypeParam;
  auto world = World();
  ASSERT_THAT(world, NotNull());
  const int me = world->rank();
  const int n = world->size();
  const size_t count = 7;
  for (ReduceOp op : OpsOf<T>()) {
    SCOPED_TRACE(ReduceOpName(op));
    std::vector<T> data = Inputs<T>(op, me, count);
    std::vector<T> out(count, From<T>(0));
    // Out of place, then in place, then asynchronous (waited).
    ASSERT_TRUE(world
                    ->all_reduce(data.data(), out.data(), count,
                                 DataTypeOf<T>(), op)
                    .ok());
    std::vector<T> async = data;
    ASSERT_TRUE(world->all_reduce(absl::MakeSpan(data), op).ok());
    ASSERT_TRUE(WaitedOk(world->iall_reduce(absl::MakeSpan(async), op),
                         absl::Now() + absl::Seconds(30)));
    for (size_t i = 0; i < count; ++i) {
      const double want = Expected<T>(op, n, i);
      EXPECT_VALUE(out[i], want) << "i " << i;
      EXPECT_VALUE(data[i], want) << "in place, i " << i;
      EXPECT_VALUE(async[i], want) << "async, i " << i;
    }
  }
}

TYPED_TEST(Collectives, ReduceToEveryRoot) {
  using T = TypeParam;
  auto world = World();
  ASSERT_THAT(world, NotNull());
  const int me = world->rank();
  const int n = world->size();
  const size_t count = 5;
  for (ReduceOp op : OpsOf<T>()) {
    for (int root = 0; root < n; ++root) {
      SCOPED_TRACE(absl::StrCat(ReduceOpName(op), " root ", root));
      const std::vector<T> send = Inputs<T>(op, me, count);
      std::vector<T> recv(count, From<T>(42));
      ASSERT_TRUE(world
                      ->reduce(send.data(), recv.data(), count,
                               DataTypeOf<T>(), op, root)
                      .ok());
      auto w = world->ireduce(send.data(), nullptr, count, DataTypeOf<T>(), op,
                              root);
      if (me == root) {
        // The root needs its recv buffer: the null one is refused.
        EXPECT_TRUE(absl::IsInvalidArgument(w.status())) << w.status();
      }
      for (size_t i = 0; i < count; ++i) {
        // Only the root's buffer is written.
        EXPECT_VALUE(recv[i], me == root ? Expected<T>(op, n, i) : 42.0);
      }
      if (me != root) {
        // A rank that is not the root may pass no recv buffer; the root
        // does its part with a real one.
        ASSERT_TRUE(w.ok()) << w.status();
      }
      std::vector<T> again(count, From<T>(42));
      if (me == root) {
        w = world->ireduce(send.data(), again.data(), count, DataTypeOf<T>(),
                           op, root);
        ASSERT_TRUE(w.ok()) << w.status();
      }
      ASSERT_TRUE((*w)->wait(absl::Now() + absl::Seconds(30)).ok());
      if (me == root) {
        for (size_t i = 0; i < count; ++i) {
          EXPECT_VALUE(again[i], Expected<T>(op, n, i)) << "async, i " << i;
        }
      }
    }
  }
}

TYPED_TEST(Collectives, AllGatherEvenAndUneven) {
  using T = TypeParam;
  auto world = World();
  ASSERT_THAT(world, NotNull());
  const int me = world->rank();
  const int n = world->size();
  const size_t count = 3;
  const std::vector<T> mine = Values<T>(me, count);
  std::vector<T> all(count * n);
  ASSERT_TRUE(
      world->all_gather(absl::MakeConstSpan(mine), absl::MakeSpan(all)).ok());
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) {
      EXPECT_VALUE(all[r * count + i], Value<T>(r, i)) << "rank " << r;
    }
  }
  // Uneven, rank 0 (and every third) contributing nothing.
  std::vector<size_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = static_cast<size_t>(r % 3);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const std::vector<T> part = Values<T>(me, counts[me]);
  std::vector<T> gathered(total, From<T>(99));
  std::vector<T> async(total, From<T>(99));
  ASSERT_TRUE(world
                  ->all_gather_v(part.data(), gathered.data(), counts,
                                 DataTypeOf<T>())
                  .ok());
  ASSERT_TRUE(TestedOk(world->iall_gather_v(part.data(), async.data(), counts,
                                            DataTypeOf<T>())));
  size_t at = 0;
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < counts[r]; ++i, ++at) {
      EXPECT_VALUE(gathered[at], Value<T>(r, i)) << "rank " << r << " i " << i;
      EXPECT_VALUE(async[at], Value<T>(r, i)) << "async rank " << r;
    }
  }
}

TYPED_TEST(Collectives, ReduceScatterEvenAndUneven) {
  using T = TypeParam;
  auto world = World();
  ASSERT_THAT(world, NotNull());
  const int me = world->rank();
  const int n = world->size();
  const size_t count = 2;
  for (ReduceOp op : OpsOf<T>()) {
    SCOPED_TRACE(ReduceOpName(op));
    const std::vector<T> send = Inputs<T>(op, me, count * n);
    std::vector<T> recv(count);
    ASSERT_TRUE(world
                    ->reduce_scatter(absl::MakeConstSpan(send),
                                     absl::MakeSpan(recv), op)
                    .ok());
    for (size_t j = 0; j < count; ++j) {
      EXPECT_VALUE(recv[j], Expected<T>(op, n, me * count + j)) << "j " << j;
    }
    // Uneven blocks, some empty: rank r gets (r + 1) % 3 elements.
    std::vector<size_t> counts(n);
    size_t total = 0;
    size_t offset = 0;  // where this rank's block starts
    for (int r = 0; r < n; ++r) {
      counts[r] = static_cast<size_t>((r + 1) % 3);
      if (r == me) offset = total;
      total += counts[r];
    }
    const std::vector<T> many = Inputs<T>(op, me, total);
    std::vector<T> block(counts[me], From<T>(99));
    std::vector<T> async(counts[me], From<T>(99));
    ASSERT_TRUE(world
                    ->reduce_scatter_v(many.data(), block.data(), counts,
                                       DataTypeOf<T>(), op)
                    .ok());
    ASSERT_TRUE(WaitedOk(world->ireduce_scatter_v(many.data(), async.data(),
                                                  counts, DataTypeOf<T>(), op)));
    for (size_t j = 0; j < counts[me]; ++j) {
      EXPECT_VALUE(block[j], Expected<T>(op, n, offset + j)) << "v, j " << j;
      EXPECT_VALUE(async[j], Expected<T>(op, n, offset + j)) << "async, j " << j;
    }
  }
}

TYPED_TEST(Collectives, GatherAndScatterAtEveryRoot) {
  using T = TypeParam;
  auto world = World();
  ASSERT_THAT(world, NotNull());
  const int me = world->rank();
  const int n = world->size();
  const size_t count = 3;
  for (int root = 0; root < n; ++root) {
    SCOPED_TRACE(absl::StrCat("root ", root));
    const std::vector<T> mine = Values<T>(me, count);
    std::vector<T> all(me == root ? count * n : 0);
    ASSERT_TRUE(world
                    ->gather(mine.data(), me == root ? all.data() : nullptr,
                             count, DataTypeOf<T>(), root)
                    .ok());
    for (size_t k = 0; k < all.size(); ++k) {
      EXPECT_VALUE(all[k], Value<T>(static_cast<int>(k / count), k % count));
    }
    // Scatter: the root hands block r (values of "rank" r + 10) to rank r.
    std::vector<T> blocks;
    if (me == root) {
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < count; ++i) {
          blocks.push_back(From<T>(Value<T>(r + 10, i)));
        }
      }
    }
    std::vector<T> got(count, From<T>(99));
    ASSERT_TRUE(TestedOk(world->iscatter(me == root ? blocks.data() : nullptr,
                                         got.data(), count, DataTypeOf<T>(),
                                         root)));
    for (size_t i = 0; i < count; ++i) {
      EXPECT_VALUE(got[i], Value<T>(me + 10, i)) << "i " << i;
    }
  }
}

TYPED_TEST(Collectives, AllToAllEvenAndUneven) {
  using T = TypeParam;
  auto world = World();
  ASSERT_THAT(world, NotNull());
  const int me = world->rank();
  const int n = world->size();
  // Block for peer p carries Value(me * n + p, i): who sent it to whom.
  const size_t count = 2;
  std::vector<T> send;
  for (int p = 0; p < n; ++p) {
    for (size_t i = 0; i < count; ++i) {
      send.push_back(From<T>(Value<T>(me * n + p, i)));
    }
  }
  std::vector<T> recv(count * n, From<T>(99));
  ASSERT_TRUE(
      world->all_to_all(absl::MakeConstSpan(send), absl::MakeSpan(recv)).ok());
  for (int p = 0; p < n; ++p) {
    for (size_t i = 0; i < count; ++i) {
      EXPECT_VALUE(recv[p * count + i], Value<T>(p * n + me, i))
          << "from " << p << " i " << i;
    }
  }
  // Uneven: rank r sends (r + 2p) % 3 elements to rank p (zeros included).
  auto c = [](int from, int to) { return static_cast<size_t>((from + 2 * to) % 3); };
  std::vector<size_t> send_counts(n), recv_counts(n);
  std::vector<T> vsend;
  size_t received = 0;
  for (int p = 0; p < n; ++p) {
    send_counts[p] = c(me, p);
    recv_counts[p] = c(p, me);
    received += recv_counts[p];
    for (size_t i = 0; i < send_counts[p]; ++i) {
      vsend.push_back(From<T>(Value<T>(me * n + p, i)));
    }
  }
  std::vector<T> vrecv(received, From<T>(99));
  std::vector<T> async(received, From<T>(99));
  ASSERT_TRUE(world
                  ->all_to_all_v(absl::MakeConstSpan(vsend), send_counts,
                                 absl::MakeSpan(vrecv), recv_counts)
                  .ok());
  ASSERT_TRUE(WaitedOk(world->iall_to_all_v(vsend.data(), send_counts,
                                            async.data(), recv_counts,
                                            DataTypeOf<T>())));
  size_t at = 0;
  for (int p = 0; p < n; ++p) {
    for (size_t i = 0; i < recv_counts[p]; ++i, ++at) {
      EXPECT_VALUE(vrecv[at], Value<T>(p * n + me, i)) << "v from " << p;
      EXPECT_VALUE(async[at], Value<T>(p * n + me, i)) << "async from " << p;
    }
  }
}

TYPED_TEST(Collectives, PointToPoint) {
  using T = TypeParam;
  auto world = World();
  ASSERT_THAT(world, NotNull());
  const int me = world->rank();
  const int n = world->size();
  const int next = (me + 1) % n;
  const int prev = (me + n - 1) % n;
  const std::vector<T> out = Values<T>(me, 4);
  std::vector<T> in(4, From<T>(0));
  // A combined shift works on any size, oneself included.
  ASSERT_TRUE(world
                  ->send_recv(absl::MakeConstSpan(out), next,
                              absl::MakeSpan(in), prev)
                  .ok());
  for (size_t i = 0; i < in.size(); ++i) EXPECT_VALUE(in[i], Value<T>(prev, i));

  // isend, then a blocking recv: by group rank, then by global rank.
  for (bool global : {false, true}) {
    SCOPED_TRACE(global ? "GlobalRank" : "group rank");
    std::fill(in.begin(), in.end(), From<T>(0));
    auto w = global ? world->isend(out.data(), out.size(), DataTypeOf<T>(),
                                   GlobalRank(world->ranks()[next]))
                    : world->isend(absl::MakeConstSpan(out), next);
    ASSERT_TRUE(w.ok()) << w.status();
    absl::Status got =
        global ? world->recv(absl::MakeSpan(in), GlobalRank(world->ranks()[prev]))
               : world->recv(absl::MakeSpan(in), prev);
    ASSERT_TRUE(got.ok()) << got;
    ASSERT_TRUE((*w)->wait().ok());
    for (size_t i = 0; i < in.size(); ++i) {
      EXPECT_VALUE(in[i], Value<T>(prev, i));
    }
  }

  // A batch: two messages to the next rank, in order, and one to oneself.
  const std::vector<T> first = Values<T>(me + 20, 3);
  const std::vector<T> second = Values<T>(me + 40, 2);
  const std::vector<T> self = Values<T>(me + 60, 1);
  std::vector<T> a(3), b(2), s(1);
  std::vector<P2POp> ops = {
      P2POp::Recv(absl::MakeSpan(a), prev),
      P2POp::Send(absl::MakeConstSpan(first), next),
      P2POp::Recv(absl::MakeSpan(b), prev),
      P2POp::Send(absl::MakeConstSpan(second), next),
  };
  // With one rank the ring is oneself already.
  if (n > 1) {
    ops.insert(ops.begin() + 2, P2POp::Send(absl::MakeConstSpan(self), me));
    ops.push_back(P2POp::Recv(absl::MakeSpan(s), me));
  } else {
    s = self;
  }
  ASSERT_TRUE(world->batch_send_recv(ops).ok());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_VALUE(a[i], Value<T>(prev + 20, i));
  for (size_t i = 0; i < b.size(); ++i) EXPECT_VALUE(b[i], Value<T>(prev + 40, i));
  EXPECT_VALUE(s[0], Value<T>(me + 60, 0));
}

// -- Async forms of the equal-block collectives ---------------------------------

TEST(MpiCommunicator, AsyncCollectivesOverlap) {
  auto world = World();
  ASSERT_THAT(world, NotNull());
  const int me = world->rank();
  const int n = world->size();
  // Several operations in flight at once, finished in reverse order.
  std::vector<float> reduced = Values<float>(me, 6);
  std::vector<int32_t> mine = Values<int32_t>(me, 2);
  std::vector<int32_t> all(2 * n);
  std::vector<double> rs_send = Inputs<double>(ReduceOp::kMax, me, 3 * n);
  std::vector<double> rs_recv(3);
  std::vector<int64_t> a2a_send(n), a2a_recv(n);
  for (int p = 0; p < n; ++p) a2a_send[p] = me * 100 + p;
  std::vector<BFloat16> gathered(me == 0 ? n : 0);
  const BFloat16 one(static_cast<float>(me));

  std::vector<std::shared_ptr<Work>> works;
  auto add = [&](Communicator::WorkOr w) {
    ASSERT_TRUE(w.ok()) << w.status();
    works.push_back(*w);
  };
  add(world->iall_reduce(absl::MakeSpan(reduced), ReduceOp::kSum));
  add(world->iall_gather(mine.data(), all.data(), 2, DataType::kInt32));
  add(world->ireduce_scatter(rs_send.data(), rs_recv.data(), 3,
                             DataType::kFloat64, ReduceOp::kMax));
  add(world->iall_to_all(a2a_send.data(), a2a_recv.data(), 1,
                         DataType::kInt64));
  add(world->igather(&one, me == 0 ? gathered.data() : nullptr, 1,
                     DataType::kBFloat16, 0));
  for (auto it = works.rbegin(); it != works.rend(); ++it) {
    ASSERT_TRUE(TestUntilDone(**it)) << (*it)->name();
    EXPECT_TRUE((*it)->status().ok()) << (*it)->status();
  }
  for (size_t i = 0; i < reduced.size(); ++i) {
    EXPECT_EQ(reduced[i], Expected<float>(ReduceOp::kSum, n, i));
  }
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(all[2 * r], Value<int32_t>(r, 0));
    EXPECT_EQ(all[2 * r + 1], Value<int32_t>(r, 1));
    EXPECT_EQ(a2a_recv[r], r * 100 + me);
    if (me == 0) {
      EXPECT_EQ(static_cast<float>(gathered[r]), r);
    }
  }
  for (size_t j = 0; j < 3; ++j) {
    EXPECT_EQ(rs_recv[j], Expected<double>(ReduceOp::kMax, n, me * 3 + j));
  }
}

// -- Rounding of 16-bit floats, with a tolerance -------------------------------------

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

// -- Misuse: the base class's checks, through this backend ------------------------

TEST(MpiCommunicator, BadArgumentsNameTheMistake) {
  auto world = World();
  ASSERT_THAT(world, NotNull());
  const int n = world->size();
  std::vector<int32_t> one(1);
  std::vector<int32_t> wrong(n + 1);
  auto expect = [](const absl::Status& s, absl::StatusCode code,
                   const std::string& text) {
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(text)) << s;
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  expect(world->all_gather(absl::MakeConstSpan(one), absl::MakeSpan(wrong)),
         kInvalid, "all_gather");
  expect(world->reduce_scatter(absl::MakeConstSpan(wrong), absl::MakeSpan(one),
                               ReduceOp::kSum),
         kInvalid, "reduce_scatter");
  expect(world->broadcast(absl::MakeSpan(one), n), kInvalid,
         absl::StrCat("root ", n, " is outside the group of ", n, " ranks"));
  expect(world->send(absl::MakeConstSpan(one), -1), kInvalid,
         "-1 is outside the group");
  expect(world->recv(absl::MakeSpan(one), n), kInvalid, "is outside the group");
  expect(world->all_reduce(nullptr, nullptr, 3, DataType::kInt32,
                           ReduceOp::kSum),
         kInvalid, "buffer is null for 3 elements");
  std::vector<int32_t> buffer(4);
  expect(world->all_reduce(buffer.data(), buffer.data() + 1, 3,
                           DataType::kInt32, ReduceOp::kSum),
         kInvalid, "overlap");
  expect(world->all_reduce(buffer.data(), buffer.data(), 4, DataType::kInt32,
                           ReduceOp::kAvg),
         kInvalid, "avg needs a floating-point type; got int32");
  std::vector<size_t> counts(n + 1, 0);
  expect(world->all_gather_v(buffer.data(), buffer.data(), counts,
                             DataType::kInt32),
         kInvalid, "expected one per rank of the group");
  // MPI counts are int: INT_MAX + 1 elements is refused before any MPI call.
  expect(world->all_reduce(buffer.data(), buffer.data(),
                           static_cast<size_t>(INT_MAX) + 1, DataType::kInt8,
                           ReduceOp::kSum),
         kInvalid, absl::StrCat("limit of ", INT_MAX));
  // A global rank that is not a member.
  expect(world->send(absl::MakeConstSpan(one), GlobalRank(n + 7)),
         absl::StatusCode::kNotFound, absl::StrCat(n + 7));
  auto irecv = world->irecv(one.data(), 1, DataType::kInt32, GlobalRank(-3));
  expect(irecv.status(), absl::StatusCode::kNotFound, "-3");
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

// -- Deadlines and abort ------------------------------------------------------------

// A receive nobody sends to is left pending in MPI when the test gives up on
// it (MPI cannot cancel it); these buffers stay valid for the rest of the
// process, and every test below then sends the matching message with plain
// MPI, so that no request is left unmatched at MPI_Finalize.
int32_t landing[3][4];

// Once every rank has checked its abandoned receive (the barrier: a
// message sent earlier could complete a peer's receive before it looked),
// sends the message the receive from `me - 1` waited for, with plain MPI on
// `comm`'s MPI communicator (the vemesh one is aborted).
void Release(const MpiCommunicator& comm) {
  MPI_Barrier(comm.comm());
  const int next = (comm.rank() + 1) % comm.size();
  const int32_t payload[4] = {1, 2, 3, 4};
  MPI_Request request;
  MPI_Isend(payload, 4, MPI_INT32_T, next, 0, comm.comm(), &request);
  MPI_Wait(&request, MPI_STATUS_IGNORE);
  MPI_Barrier(comm.comm());
}

std::shared_ptr<MpiCommunicator> Private(MpiCommunicator& world) {
  auto dup = world.split_mpi(0, world.rank());
  EXPECT_TRUE(dup.ok()) << dup.status();
  return dup.ok() ? *dup : nullptr;
}

// The rank before this one in `comm`'s ring: the one Release() sends from.
int Prev(const Communicator& comm) {
  return (comm.rank() + comm.size() - 1) % comm.size();
}

// A blocking receive from Prev(comm) into `into` that nobody sends to (until
// Release()): what it returned, and how long it took.
struct Stuck {
  absl::Status status;
  absl::Duration took;
};
Stuck RecvNobodySends(MpiCommunicator& comm, int32_t (&into)[4]) {
  const absl::Time start = absl::Now();
  absl::Status s = comm.recv(into, 4, DataType::kInt32, Prev(comm));
  return {s, absl::Now() - start};
}

TEST(MpiCommunicator, WaitAfterAbortIsAborted) {
  auto world = World();
  ASSERT_THAT(world, NotNull());
  auto comm = Private(*world);
  ASSERT_THAT(comm, NotNull());
  auto w = comm->irecv(landing[0], 4, DataType::kInt32, Prev(*comm));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_FALSE((*w)->test());
  comm->abort("the test gave up");
  const absl::Time start = absl::Now();
  absl::Status s = (*w)->wait(absl::Now() + absl::Seconds(30));
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("the test gave up"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // Later operations are refused without touching MPI.
  EXPECT_TRUE(absl::IsAborted(comm->barrier()));
  Release(*comm);
}

TEST(MpiCommunicator, AbortFromAnotherThreadReleasesABlockedRecv) {
  auto world = World();
  ASSERT_THAT(world, NotNull());
  auto comm = Private(*world);
  ASSERT_THAT(comm, NotNull());
  // The second thread only calls abort(), which makes no MPI call: this
  // holds at any thread level MPI granted.
  std::atomic<bool> aborted{false};
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    comm->abort("aborted by a second thread");
    aborted = true;
  });
  const Stuck r = RecvNobodySends(*comm, landing[1]);
  aborter.join();
  EXPECT_TRUE(aborted);
  EXPECT_TRUE(absl::IsAborted(r.status)) << r.status;
  EXPECT_THAT(std::string(r.status.message()),
              HasSubstr("aborted by a second thread"));
  EXPECT_GE(r.took, absl::Milliseconds(150));
  EXPECT_LT(r.took, absl::Seconds(10));
  Release(*comm);
}

TEST(MpiCommunicator, TimeoutIsDeadlineExceededThenAborted) {
  auto world = World();
  ASSERT_THAT(world, NotNull());
  auto comm = Private(*world);
  ASSERT_THAT(comm, NotNull());
  comm->set_timeout(absl::Milliseconds(200));
  const Stuck r = RecvNobodySends(*comm, landing[2]);
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status)) << r.status;
  EXPECT_GE(r.took, absl::Milliseconds(150));
  EXPECT_LT(r.took, absl::Seconds(10));
  EXPECT_TRUE(comm->aborted());
  absl::Status next = comm->barrier();
  EXPECT_TRUE(absl::IsAborted(next)) << next;
  Release(*comm);
}

// -- Groups --------------------------------------------------------------------------

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
