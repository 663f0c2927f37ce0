// The Gloo backend, run as 1, 2, 4 and 8 ranks: one thread per rank in this
// process, all rendezvousing through one MemoryStore. Every result is
// checked against values each rank computes on its own from the ranks'
// known inputs; failures (a rank that never comes, a peer that leaves
// mid-collective) must end in an error within a bound, never a hang.

#include "vemesh/comm/gloo/gloo_communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gloo/common/error.h"
#include "gloo/context.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/comm/gloo/gloo_store.h"
#include "vemesh/rendezvous/memory_store.h"

namespace vemesh {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsNull;
using ::testing::NotNull;

// Long enough for 8 ranks on a loaded 2-core machine; a test that needs a
// failure to be fast sets its own, shorter bound.
constexpr absl::Duration kTimeout = absl::Seconds(30);

// Global ranks that differ from group ranks, so that a mix-up shows.
int Global(int rank) { return 100 + rank; }
std::vector<int> GlobalRanks(int n) {
  std::vector<int> out(n);
  for (int r = 0; r < n; ++r) out[r] = Global(r);
  return out;
}

using Body = std::function<void(std::shared_ptr<GlooCommunicator>)>;

// Runs `body` on `n` threads, each with its rank of a fresh group of `n`.
void OnRanks(int n, const Body& body, absl::Duration timeout = kTimeout) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto comm = GlooCommunicator::Create(store, "world", r, n, GlobalRanks(n),
                                           timeout);
      ASSERT_TRUE(comm.ok()) << "rank " << r << ": " << comm.status();
      body(*std::move(comm));
    });
  }
  for (std::thread& t : threads) t.join();
}

template <typename F>
void ForEachType(F&& f) {
  f(float{});
  f(double{});
  f(int32_t{});
  f(int64_t{});
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

template <typename T>
std::string Name() {
  return std::string(DataTypeName(DataTypeOf<T>()));
}

class GlooCommunicatorTest : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
};

INSTANTIATE_TEST_SUITE_P(Ranks, GlooCommunicatorTest,
                         ::testing::Values(1, 2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("n", info.param);
                         });

TEST_P(GlooCommunicatorTest, CreateReportsGroupAndHandle) {
  const int n = this->n();
  OnRanks(n, [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    EXPECT_EQ(comm->size(), n);
    EXPECT_EQ(comm->global_rank(), Global(me));
    EXPECT_THAT(comm->ranks(), ElementsAreArray(GlobalRanks(n)));
    EXPECT_EQ(comm->backend(), "gloo");
    EXPECT_EQ(comm->prefix(), "world");
    NativeHandle handle = comm->native_handle();
    EXPECT_EQ(handle.backend, "gloo");
    ASSERT_THAT(handle.handle, NotNull());
    auto* context = static_cast<gloo::Context*>(handle.handle);
    EXPECT_EQ(context->rank, me);
    EXPECT_EQ(context->size, n);
    EXPECT_TRUE(comm->barrier().ok());
  });
}

TEST_P(GlooCommunicatorTest, Broadcast) {
  OnRanks(n(), [&](std::shared_ptr<GlooCommunicator> comm) {
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      for (int root = 0; root < comm->size(); ++root) {
        std::vector<T> data(5, T(99));
        if (comm->rank() == root) {
          for (size_t i = 0; i < data.size(); ++i) data[i] = Value<T>(root, i);
        }
        ASSERT_TRUE(comm->broadcast(absl::MakeSpan(data), root).ok());
        for (size_t i = 0; i < data.size(); ++i) {
          EXPECT_EQ(data[i], Value<T>(root, i))
              << Name<T>() << " root " << root << " i " << i;
        }
      }
    });
  });
}

TEST_P(GlooCommunicatorTest, AllReduceEveryOpInAndOutOfPlace) {
  OnRanks(n(), [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
        std::vector<T> data(7);
        for (size_t i = 0; i < data.size(); ++i) data[i] = Value<T>(me, i);
        std::vector<T> out(7, T(0));
        ASSERT_TRUE(comm->all_reduce(data.data(), out.data(), data.size(),
                                     DataTypeOf<T>(), op)
                        .ok());
        // The input of an out-of-place reduction is left alone.
        for (size_t i = 0; i < data.size(); ++i) {
          ASSERT_EQ(data[i], Value<T>(me, i));
        }
        ASSERT_TRUE(comm->all_reduce(absl::MakeSpan(data), op).ok());
        for (size_t i = 0; i < data.size(); ++i) {
          const T expected = Reduce<T>(op, comm->size(), i);
          EXPECT_EQ(out[i], expected)
              << Name<T>() << " " << ReduceOpName(op) << " i " << i;
          EXPECT_EQ(data[i], expected)
              << Name<T>() << " " << ReduceOpName(op) << " in place, i " << i;
        }
      }
    });
  });
}

TEST_P(GlooCommunicatorTest, AllGather) {
  OnRanks(n(), [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      const size_t count = 3;
      std::vector<T> mine(count);
      for (size_t i = 0; i < count; ++i) mine[i] = Value<T>(me, i);
      std::vector<T> all(count * comm->size());
      ASSERT_TRUE(
          comm->all_gather(absl::MakeConstSpan(mine), absl::MakeSpan(all))
              .ok());
      for (int r = 0; r < comm->size(); ++r) {
        for (size_t i = 0; i < count; ++i) {
          EXPECT_EQ(all[r * count + i], Value<T>(r, i))
              << Name<T>() << " rank " << r;
        }
      }
    });
  });
}

TEST_P(GlooCommunicatorTest, ReduceScatterEveryOp) {
  OnRanks(n(), [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      const size_t count = 2;
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
        std::vector<T> send(count * comm->size());
        for (size_t i = 0; i < send.size(); ++i) send[i] = Value<T>(me, i);
        std::vector<T> recv(count);
        ASSERT_TRUE(comm->reduce_scatter(absl::MakeConstSpan(send),
                                         absl::MakeSpan(recv), op)
                        .ok());
        for (size_t j = 0; j < count; ++j) {
          EXPECT_EQ(recv[j], Reduce<T>(op, comm->size(), me * count + j))
              << Name<T>() << " " << ReduceOpName(op) << " j " << j;
        }
      }
    });
  });
}

TEST_P(GlooCommunicatorTest, SendRecvRing) {
  OnRanks(n(), [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    const int n = comm->size();
    const int next = (me + 1) % n;
    const int prev = (me + n - 1) % n;
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      std::vector<T> out(4);
      for (size_t i = 0; i < out.size(); ++i) out[i] = Value<T>(me, i);
      std::vector<T> in(4, T(0));
      // A combined shift works on any size, oneself included (n == 1).
      ASSERT_TRUE(comm->send_recv(absl::MakeConstSpan(out), next,
                                  absl::MakeSpan(in), prev)
                      .ok());
      for (size_t i = 0; i < in.size(); ++i) {
        EXPECT_EQ(in[i], Value<T>(prev, i)) << Name<T>();
      }
      if (n < 2) return;
      // Separate send and recv: even ranks send first, odd ranks receive
      // first.
      std::fill(in.begin(), in.end(), T(0));
      if (me % 2 == 0) {
        ASSERT_TRUE(comm->send(absl::MakeConstSpan(out), next).ok());
        ASSERT_TRUE(comm->recv(absl::MakeSpan(in), prev).ok());
      } else {
        ASSERT_TRUE(comm->recv(absl::MakeSpan(in), prev).ok());
        ASSERT_TRUE(comm->send(absl::MakeConstSpan(out), next).ok());
      }
      for (size_t i = 0; i < in.size(); ++i) {
        EXPECT_EQ(in[i], Value<T>(prev, i)) << Name<T>();
      }
    });
  });
}

TEST_P(GlooCommunicatorTest, ExchangeWithOneself) {
  OnRanks(n(), [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    std::vector<int64_t> out = {me, 2 * me, 3 * me};
    std::vector<int64_t> in(3, -1);
    ASSERT_TRUE(comm->send_recv(absl::MakeConstSpan(out), me,
                                absl::MakeSpan(in), me)
                    .ok());
    EXPECT_EQ(in, out);
    // A send to oneself waits for the recv from oneself, in order.
    std::vector<int64_t> first = {1}, second = {2, 2};
    ASSERT_TRUE(comm->send(absl::MakeConstSpan(first), me).ok());
    ASSERT_TRUE(comm->send(absl::MakeConstSpan(second), me).ok());
    std::vector<int64_t> got1(1), got2(2);
    ASSERT_TRUE(comm->recv(absl::MakeSpan(got1), me).ok());
    ASSERT_TRUE(comm->recv(absl::MakeSpan(got2), me).ok());
    EXPECT_EQ(got1, first);
    EXPECT_EQ(got2, second);
    // Nothing left: a recv from oneself could only hang, so it fails.
    absl::Status s = comm->recv(absl::MakeSpan(got1), me);
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
    EXPECT_TRUE(comm->barrier().ok());
  });
}

TEST_P(GlooCommunicatorTest, LengthMismatchIsInvalidArgument) {
  OnRanks(n(), [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    // Rank 0 sends to rank 1, or to itself when alone.
    const int to = comm->size() > 1 ? 1 : 0;
    std::vector<int32_t> three = {1, 2, 3};
    std::vector<int32_t> four(4);
    if (me == 0) {
      ASSERT_TRUE(comm->send(absl::MakeConstSpan(three), to).ok());
      ASSERT_TRUE(comm->send(absl::MakeConstSpan(four), to).ok());
    }
    if (me == to) {
      absl::Status s = comm->recv(absl::MakeSpan(four), 0);
      EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
      EXPECT_EQ(s.message(), "recv expected 4 elements from rank 0 but got 3");
      // The longer message did not overrun, and the stream stays in step.
      std::vector<int32_t> two(2);
      s = comm->recv(absl::MakeSpan(two), 0);
      EXPECT_EQ(s.message(), "recv expected 2 elements from rank 0 but got 4");
    }
    EXPECT_TRUE(comm->barrier().ok());  // still usable
  });
}

TEST_P(GlooCommunicatorTest, BadArgumentsMatchTheMpiBackend) {
  OnRanks(n(), [&](std::shared_ptr<GlooCommunicator> comm) {
    const int n = comm->size();
    const std::string group =
        absl::StrCat(" is outside the group of ", n, " ranks (0..", n - 1, ")");
    std::vector<int32_t> one(1);
    std::vector<int32_t> wrong(n + 1);
    absl::Status s =
        comm->all_gather(absl::MakeConstSpan(one), absl::MakeSpan(wrong));
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_EQ(s.message(), absl::StrCat("all_gather buffer has ", n + 1,
                                        " elements: expected ", n));
    s = comm->reduce_scatter(absl::MakeConstSpan(wrong), absl::MakeSpan(one),
                             ReduceOp::kSum);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    s = comm->broadcast(absl::MakeSpan(one), n);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_EQ(s.message(), absl::StrCat("broadcast: root ", n, group));
    s = comm->send(absl::MakeConstSpan(one), -1);
    EXPECT_EQ(s.message(), absl::StrCat("send: peer -1", group));
    s = comm->recv(absl::MakeSpan(one), n);
    EXPECT_EQ(s.message(), absl::StrCat("recv: peer ", n, group));
    s = comm->send_recv(absl::MakeConstSpan(one), n, absl::MakeSpan(one), 0);
    EXPECT_EQ(s.message(), absl::StrCat("send_recv: dest ", n, group));
    s = comm->send_recv(absl::MakeConstSpan(one), 0, absl::MakeSpan(one), -2);
    EXPECT_EQ(s.message(), absl::StrCat("send_recv: source -2", group));
    s = comm->all_reduce(nullptr, nullptr, 3, DataType::kInt32, ReduceOp::kSum);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_EQ(s.message(), "all_reduce got a null buffer for 3 elements");
    std::vector<int32_t> buffer(4);
    s = comm->all_reduce(buffer.data(), buffer.data() + 1, 3, DataType::kInt32,
                         ReduceOp::kSum);
    EXPECT_EQ(s.message(),
              "all_reduce: send and recv overlap without being the same "
              "buffer");
    s = comm->all_gather(buffer.data(), buffer.data(), 1, DataType::kInt32);
    EXPECT_EQ(s.message(), "all_gather: send and recv buffers overlap");
    // The MPI backend's int-count bound, checked before any memory is read.
    const size_t huge = size_t{INT_MAX} + 1;
    s = comm->all_reduce(buffer.data(), buffer.data(), huge, DataType::kInt32,
                         ReduceOp::kSum);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_EQ(s.message(),
              absl::StrCat("all_reduce of ", huge,
                           " elements: the Gloo backend takes at most ",
                           INT_MAX));
    s = comm->send(buffer.data(), huge, DataType::kInt32, 0);
    EXPECT_THAT(std::string(s.message()), HasSubstr("at most"));
    EXPECT_TRUE(comm->barrier().ok());  // the group is still usable
  });
}

TEST_P(GlooCommunicatorTest, SplitOrdersByKeyAndReportsGlobalRanks) {
  const int n = this->n();
  OnRanks(n, [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    // Two groups by parity, each ordered by descending rank.
    auto half = comm->split(me % 2, -me);
    ASSERT_TRUE(half.ok()) << half.status();
    ASSERT_THAT(*half, NotNull());
    std::vector<int> expected;
    for (int r = n - 1; r >= 0; --r) {
      if (r % 2 == me % 2) expected.push_back(Global(r));
    }
    EXPECT_THAT((*half)->ranks(), ElementsAreArray(expected));
    EXPECT_EQ((*half)->global_rank(), Global(me));
    EXPECT_EQ((*half)->backend(), "gloo");
    const int mine = Global(me);
    std::vector<int> gathered(expected.size());
    ASSERT_TRUE((*half)
                    ->all_gather(absl::MakeConstSpan(&mine, 1),
                                 absl::MakeSpan(gathered))
                    .ok());
    EXPECT_EQ(gathered, expected);

    // A split of a split still reports global ranks.
    auto single = (*half)->split(me, 0);
    ASSERT_TRUE(single.ok()) << single.status();
    ASSERT_THAT(*single, NotNull());
    EXPECT_THAT((*single)->ranks(), ElementsAreArray({Global(me)}));
    EXPECT_TRUE((*single)->barrier().ok());

    // The parent is still usable after splitting.
    EXPECT_TRUE(comm->barrier().ok());
  });
}

TEST_P(GlooCommunicatorTest, NegativeColorGetsNoGroup) {
  const int n = this->n();
  OnRanks(n, [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    auto some = comm->split(me == 0 ? -1 : 0, me);
    ASSERT_TRUE(some.ok()) << some.status();
    if (me == 0) {
      EXPECT_THAT(*some, IsNull());
    } else {
      ASSERT_THAT(*some, NotNull());
      EXPECT_EQ((*some)->size(), n - 1);
      EXPECT_EQ((*some)->rank(), me - 1);
      EXPECT_EQ((*some)->ranks()[0], Global(1));
      int32_t x = 1;
      EXPECT_TRUE((*some)->all_reduce(absl::MakeSpan(&x, 1), ReduceOp::kSum)
                      .ok());
      EXPECT_EQ(x, n - 1);
    }
    // Everyone negative: nobody gets a group.
    auto none = comm->split(-1, 0);
    ASSERT_TRUE(none.ok()) << none.status();
    EXPECT_THAT(*none, IsNull());
  });
}

TEST_P(GlooCommunicatorTest, DestroyingFreesEveryCommunicator) {
  const int64_t before = LiveCommunicatorCount();
  OnRanks(n(), [&](std::shared_ptr<GlooCommunicator> comm) {
    for (int i = 0; i < 5; ++i) {
      auto child = comm->split(comm->rank() % 2, 0);
      ASSERT_TRUE(child.ok()) << child.status();
    }
  });
  EXPECT_EQ(LiveCommunicatorCount(), before);
}

// A 2x4 grid of 8 ranks: rows are {0..3}, {4..7}; columns {c, c+4}.
TEST(GlooGrid, RowsAndColumns) {
  OnRanks(8, [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    const int row_index = me / 4;
    const int col_index = me % 4;
    auto row = comm->split(row_index, col_index);
    ASSERT_TRUE(row.ok()) << row.status();
    auto col = comm->split(col_index, row_index);
    ASSERT_TRUE(col.ok()) << col.status();
    ASSERT_THAT(*row, NotNull());
    ASSERT_THAT(*col, NotNull());

    EXPECT_EQ((*row)->size(), 4);
    EXPECT_EQ((*row)->rank(), col_index);
    std::vector<int> row_ranks;
    for (int c = 0; c < 4; ++c) row_ranks.push_back(Global(row_index * 4 + c));
    EXPECT_THAT((*row)->ranks(), ElementsAreArray(row_ranks));

    EXPECT_EQ((*col)->size(), 2);
    EXPECT_EQ((*col)->rank(), row_index);
    EXPECT_THAT((*col)->ranks(), ElementsAreArray({Global(col_index),
                                                   Global(col_index + 4)}));

    // Sums over a row and over a column of the world ranks.
    int64_t x = me;
    ASSERT_TRUE((*row)->all_reduce(absl::MakeSpan(&x, 1), ReduceOp::kSum).ok());
    EXPECT_EQ(x, row_index == 0 ? 0 + 1 + 2 + 3 : 4 + 5 + 6 + 7);
    int64_t y = me;
    ASSERT_TRUE((*col)->all_reduce(absl::MakeSpan(&y, 1), ReduceOp::kSum).ok());
    EXPECT_EQ(y, col_index + col_index + 4);

    // Nested: each row in halves, the second half reversed by key.
    const int half = col_index / 2;
    auto pair = (*row)->split(half, half == 1 ? -col_index : col_index);
    ASSERT_TRUE(pair.ok()) << pair.status();
    ASSERT_THAT(*pair, NotNull());
    const int a = Global(row_index * 4 + half * 2);
    const int b = a + 1;
    EXPECT_THAT((*pair)->ranks(),
                half == 0 ? ElementsAreArray({a, b}) : ElementsAreArray({b, a}));
    EXPECT_EQ((*pair)->global_rank(), Global(me));
    int32_t z = Global(me);
    std::vector<int32_t> both(2);
    ASSERT_TRUE((*pair)
                    ->all_gather(absl::MakeConstSpan(&z, 1),
                                 absl::MakeSpan(both))
                    .ok());
    EXPECT_THAT(both, ElementsAreArray((*pair)->ranks()));
    // Groups made by different splits do not get in each other's way.
    EXPECT_TRUE((*row)->barrier().ok());
    EXPECT_TRUE((*col)->barrier().ok());
    EXPECT_TRUE(comm->barrier().ok());
  });
}

// -- Failures end in bounded time -------------------------------------------

bool IsTimeoutOrLost(const absl::Status& s) {
  return absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s);
}

TEST(GlooFailure, RankThatNeverComesTimesOutCreate) {
  // Rank 0 alone waits for rank 1's address; rank 1 alone waits for rank
  // 0's host entry. Both give up at the timeout.
  for (int rank : {0, 1}) {
    auto store = std::make_shared<MemoryStore>();
    const absl::Time start = absl::Now();
    auto comm = GlooCommunicator::Create(store, "lonely", rank, 2,
                                         GlobalRanks(2), absl::Seconds(1));
    const absl::Duration took = absl::Now() - start;
    ASSERT_FALSE(comm.ok()) << "rank " << rank;
    EXPECT_TRUE(absl::IsDeadlineExceeded(comm.status())) << comm.status();
    EXPECT_LT(took, absl::Seconds(10)) << "rank " << rank;
    EXPECT_GE(took, absl::Milliseconds(900)) << "rank " << rank;
  }
}

TEST(GlooFailure, SilentPeerTimesOutAnOperation) {
  // Long enough for the rendezvous on a loaded machine (it shares the
  // bound), short for a test.
  constexpr absl::Duration kShort = absl::Seconds(3);
  auto store = std::make_shared<MemoryStore>();
  std::atomic<bool> done{false};
  std::thread silent([&] {
    auto comm = GlooCommunicator::Create(store, "silent", 1, 2, GlobalRanks(2),
                                         kShort);
    ASSERT_TRUE(comm.ok()) << comm.status();
    // Holds its end open without taking part, until rank 0 gave up.
    const absl::Time limit = absl::Now() + absl::Seconds(15);
    while (!done.load() && absl::Now() < limit) {
      absl::SleepFor(absl::Milliseconds(10));
    }
  });
  auto comm = GlooCommunicator::Create(store, "silent", 0, 2, GlobalRanks(2),
                                       kShort);
  ASSERT_TRUE(comm.ok()) << comm.status();
  const absl::Time start = absl::Now();
  absl::Status s = (*comm)->barrier();
  const absl::Duration took = absl::Now() - start;
  done = true;
  silent.join();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_LT(took, absl::Seconds(10));
  // Broken for good, with the same code, without waiting again.
  const absl::Time again = absl::Now();
  absl::Status later = (*comm)->barrier();
  EXPECT_EQ(later.code(), s.code()) << later;
  EXPECT_THAT(std::string(later.message()), HasSubstr("broken"));
  EXPECT_LT(absl::Now() - again, absl::Seconds(1));
}

// One rank destroys its communicator while the others are inside an
// all_reduce: they all get an error well before the 30 s timeout, because
// the first to notice closes its connections too.
void PeerLeavesMidCollective(int n) {
  std::vector<absl::Status> results(n);
  std::vector<absl::Duration> took(n);
  OnRanks(n, [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    if (me == 0) {
      absl::SleepFor(absl::Milliseconds(300));  // the others are waiting
      comm.reset();
      return;
    }
    std::vector<float> data(1000, 1.0f);
    const absl::Time start = absl::Now();
    results[me] = comm->all_reduce(absl::MakeSpan(data), ReduceOp::kSum);
    took[me] = absl::Now() - start;
  });
  for (int r = 1; r < n; ++r) {
    EXPECT_FALSE(results[r].ok()) << "rank " << r;
    EXPECT_TRUE(IsTimeoutOrLost(results[r])) << "rank " << r << ": "
                                             << results[r];
    EXPECT_LT(took[r], absl::Seconds(10)) << "rank " << r;
  }
}

TEST(GlooFailure, PeerLeavesMidCollectiveOfTwo) { PeerLeavesMidCollective(2); }
TEST(GlooFailure, PeerLeavesMidCollectiveOfFour) { PeerLeavesMidCollective(4); }

// -- The store adapter ------------------------------------------------------

TEST(GlooStore, GetWaitsForTheKeyAndThrowsAtTheTimeout) {
  auto store = std::make_shared<MemoryStore>();
  GlooStore adapter(store, absl::Milliseconds(200));
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(store->set("k", "v").ok());
  });
  EXPECT_EQ(adapter.get("k"), std::vector<char>({'v'}));
  late.join();
  adapter.set("bytes", std::vector<char>{'\0', 'x'});
  EXPECT_EQ(*store->get("bytes"), std::string("\0x", 2));
  EXPECT_TRUE(adapter.error().ok());

  const absl::Time start = absl::Now();
  EXPECT_THROW(adapter.get("never"), gloo::IoException);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(absl::IsDeadlineExceeded(adapter.error())) << adapter.error();
  EXPECT_THAT(std::string(adapter.error().message()), HasSubstr("never"));
  // Gloo's own bound wins when it passes one.
  EXPECT_THROW(adapter.wait({"never"}, std::chrono::milliseconds(10)),
               gloo::IoException);
  EXPECT_THROW(adapter.set("", {}), gloo::IoException);  // bad key
}

}  // namespace
}  // namespace vemesh
