// The cases of the communicator conformance suite (conformance.h), each
// written once for every backend: every operation for every data type and
// every reduction, blocking and asynchronous, at every root, with uneven
// counts (zeros included) for the v-forms; point to point and batches;
// abort from another thread; a deadline that aborts; the rank order of
// splits; and that communicators are freed with their last holder. Results
// are checked against values each rank computes on its own
// (tests/comm/expected_values.h).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "conformance.h"
#include "expected_values.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vemesh::testing {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsNull;
using ::testing::NotNull;

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Conformance);

constexpr absl::Duration kLimit = absl::Seconds(30);

template <typename F>
void ForEachType(F&& f) {
  f(float{});
  f(double{});
  f(int32_t{});
  f(int64_t{});
  f(BFloat16{});
  f(Float16{});
  f(int8_t{});
  f(uint8_t{});
}

template <typename T>
std::string Name() {
  return std::string(DataTypeName(DataTypeOf<T>()));
}

// A value no operation answers, to show what was (not) written.
template <typename T>
std::vector<T> Sentinel(size_t n) {
  return std::vector<T>(n, From<T>(99));
}

// Element-wise equality of values, with the place of the first difference.
template <typename T>
::testing::AssertionResult SameValues(const std::vector<T>& got,
                                      const std::vector<T>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << got.size() << " elements, expected " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (To(got[i]) != To(want[i])) {
      return ::testing::AssertionFailure()
             << "element " << i << " is " << To(got[i]) << ", expected "
             << To(want[i]);
    }
  }
  return ::testing::AssertionSuccess();
}

// The reduction of every rank's Inputs(op) at indices first.. first + n - 1.
template <typename T>
std::vector<T> Reduced(ReduceOp op, int size, size_t n, size_t first = 0) {
  std::vector<T> out;
  for (size_t i = 0; i < n; ++i) {
    out.push_back(From<T>(Expected<T>(op, size, first + i)));
  }
  return out;
}

// test() until the operation finished, at most kLimit.
bool TestUntilDone(Work& work) {
  const absl::Time end = absl::Now() + kLimit;
  while (absl::Now() < end) {
    if (work.test()) return true;
    std::this_thread::yield();
  }
  return false;
}

// An operation that started, finished under test() and ended OK.
::testing::AssertionResult TestedOk(const Communicator::WorkOr& w) {
  if (!w.ok()) return ::testing::AssertionFailure() << w.status();
  if (!TestUntilDone(**w)) {
    return ::testing::AssertionFailure() << (*w)->name() << " did not finish";
  }
  if (!(*w)->status().ok()) {
    return ::testing::AssertionFailure() << (*w)->status();
  }
  return ::testing::AssertionSuccess();
}

// An operation that started and whose wait(deadline) ended OK.
::testing::AssertionResult WaitedOk(const Communicator::WorkOr& w) {
  if (!w.ok()) return ::testing::AssertionFailure() << w.status();
  const absl::Status s = (*w)->wait(absl::Now() + kLimit);
  if (!s.ok()) return ::testing::AssertionFailure() << s;
  return ::testing::AssertionSuccess();
}

#define ASSERT_OK(expr)                          \
  do {                                           \
    const absl::Status _s = (expr);              \
    ASSERT_TRUE(_s.ok()) << #expr << ": " << _s; \
  } while (0)

// -- The group ----------------------------------------------------------------

TEST_P(Conformance, ReportsItsGroup) {
  OnRanks([&](std::shared_ptr<Communicator> comm) {
    const int n = comm->size();
    if (this->n() > 0) {
      EXPECT_EQ(n, this->n());
    }
    const std::vector<int> globals = h().GlobalRanks(n);
    EXPECT_THAT(comm->ranks(), ElementsAreArray(globals));
    EXPECT_EQ(comm->global_rank(), globals[comm->rank()]);
    EXPECT_EQ(comm->backend(), h().backend());
    const NativeHandle native = comm->native_handle();
    EXPECT_EQ(native.backend, h().backend());
    EXPECT_THAT(native.handle, NotNull());
    for (int r = 0; r < n; ++r) {
      absl::StatusOr<int> g = comm->group_rank(globals[r]);
      ASSERT_TRUE(g.ok()) << g.status();
      EXPECT_EQ(*g, r);
    }
    EXPECT_TRUE(absl::IsNotFound(comm->group_rank(-7).status()));
    EXPECT_TRUE(comm->barrier().ok());
    EXPECT_TRUE(TestedOk(comm->ibarrier()));
    EXPECT_TRUE(WaitedOk(comm->ibarrier()));
  });
}

// -- Collectives: every data type, reduction and root ------------------------

TEST_P(Conformance, BroadcastFromEveryRoot) {
  OnRanks([&](std::shared_ptr<Communicator> comm) {
    const int me = comm->rank();
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      const size_t count = 5;
      for (int root = 0; root < comm->size(); ++root) {
        SCOPED_TRACE(absl::StrCat(Name<T>(), " root ", root));
        const std::vector<T> start =
            me == root ? Values<T>(root, count) : Sentinel<T>(count);
        Buffer<T> data(h(), start);
        ASSERT_OK(comm->broadcast(data.data(), count, DataTypeOf<T>(), root));
        EXPECT_TRUE(SameValues(data.Read(), Values<T>(root, count)));
        Buffer<T> again(h(), start);
        ASSERT_TRUE(TestedOk(
            comm->ibroadcast(again.data(), count, DataTypeOf<T>(), root)));
        EXPECT_TRUE(SameValues(again.Read(), Values<T>(root, count)))
            << "async";
      }
    });
  });
}

TEST_P(Conformance, AllReduceEveryOpInAndOutOfPlace) {
  OnRanks([&](std::shared_ptr<Communicator> comm) {
    const int me = comm->rank();
    const int n = comm->size();
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      const DataType type = DataTypeOf<T>();
      const size_t count = 7;
      for (ReduceOp op : OpsOf<T>()) {
        SCOPED_TRACE(absl::StrCat(Name<T>(), " ", ReduceOpName(op)));
        const std::vector<T> mine = Inputs<T>(op, me, count);
        const std::vector<T> want = Reduced<T>(op, n, count);
        Buffer<T> send(h(), mine);
        Buffer<T> recv(h(), Sentinel<T>(count));
        ASSERT_OK(comm->all_reduce(send.data(), recv.data(), count, type, op));
        EXPECT_TRUE(SameValues(recv.Read(), want)) << "out of place";
        // The input of an out-of-place reduction is left alone.
        EXPECT_TRUE(SameValues(send.Read(), mine)) << "input";
        ASSERT_OK(comm->all_reduce(send.span(), op));
        EXPECT_TRUE(SameValues(send.Read(), want)) << "in place";
        Buffer<T> async(h(), mine);
        ASSERT_TRUE(WaitedOk(comm->iall_reduce(async.span(), op)));
        EXPECT_TRUE(SameValues(async.Read(), want)) << "async in place";
        Buffer<T> async_out(h(), Sentinel<T>(count));
        Buffer<T> async_in(h(), mine);
        ASSERT_TRUE(TestedOk(comm->iall_reduce(
            async_in.data(), async_out.data(), count, type, op)));
        EXPECT_TRUE(SameValues(async_out.Read(), want)) << "async";
      }
    });
  });
}

TEST_P(Conformance, ReduceToEveryRoot) {
  OnRanks([&](std::shared_ptr<Communicator> comm) {
    const int me = comm->rank();
    const int n = comm->size();
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      const DataType type = DataTypeOf<T>();
      const size_t count = 5;
      for (ReduceOp op : OpsOf<T>()) {
        for (int root = 0; root < n; ++root) {
          SCOPED_TRACE(
              absl::StrCat(Name<T>(), " ", ReduceOpName(op), " root ", root));
          Buffer<T> send(h(), Inputs<T>(op, me, count));
          Buffer<T> recv(h(), Sentinel<T>(count));
          ASSERT_OK(
              comm->reduce(send.data(), recv.data(), count, type, op, root));
          // Only the root's buffer is written.
          EXPECT_TRUE(SameValues(recv.Read(), me == root
                                                  ? Reduced<T>(op, n, count)
                                                  : Sentinel<T>(count)));
          // Asynchronous, with no recv buffer where none is needed: the
          // root's is refused before anything starts.
          Buffer<T> again(h(), Sentinel<T>(count));
          auto w = comm->ireduce(send.data(), nullptr, count, type, op, root);
          if (me == root) {
            EXPECT_TRUE(absl::IsInvalidArgument(w.status())) << w.status();
            w = comm->ireduce(send.data(), again.data(), count, type, op, root);
          }
          ASSERT_TRUE(WaitedOk(w));
          if (me == root) {
            EXPECT_TRUE(SameValues(again.Read(), Reduced<T>(op, n, count)))
                << "async";
          }
        }
      }
    });
  });
}

TEST_P(Conformance, AllGatherEvenAndUneven) {
  OnRanks([&](std::shared_ptr<Communicator> comm) {
    const int me = comm->rank();
    const int n = comm->size();
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      const DataType type = DataTypeOf<T>();
      SCOPED_TRACE(Name<T>());
      const size_t count = 3;
      std::vector<T> want;
      for (int r = 0; r < n; ++r) {
        const std::vector<T> b = Values<T>(r, count);
        want.insert(want.end(), b.begin(), b.end());
      }
      Buffer<T> mine(h(), Values<T>(me, count));
      Buffer<T> all(h(), Sentinel<T>(count * n));
      ASSERT_OK(comm->all_gather(mine.cspan(), all.span()));
      EXPECT_TRUE(SameValues(all.Read(), want));
      Buffer<T> async(h(), Sentinel<T>(count * n));
      ASSERT_TRUE(
          TestedOk(comm->iall_gather(mine.data(), async.data(), count, type)));
      EXPECT_TRUE(SameValues(async.Read(), want)) << "async";

      // Rank r gives r % 3 elements: rank 0 (and 3, 6) nothing.
      std::vector<size_t> counts(n);
      std::vector<T> vwant;
      for (int r = 0; r < n; ++r) {
        counts[r] = static_cast<size_t>(r % 3);
        const std::vector<T> b = Values<T>(r, counts[r]);
        vwant.insert(vwant.end(), b.begin(), b.end());
      }
      Buffer<T> part(h(), Values<T>(me, counts[me]));
      Buffer<T> gathered(h(), Sentinel<T>(vwant.size()));
      ASSERT_OK(comm->all_gather_v(part.data(), gathered.data(), counts, type));
      EXPECT_TRUE(SameValues(gathered.Read(), vwant)) << "v";
      Buffer<T> vasync(h(), Sentinel<T>(vwant.size()));
      ASSERT_TRUE(TestedOk(
          comm->iall_gather_v(part.data(), vasync.data(), counts, type)));
      EXPECT_TRUE(SameValues(vasync.Read(), vwant)) << "async v";
      // Nobody gives anything: a no-op for everyone.
      const std::vector<size_t> none(n, 0);
      EXPECT_TRUE(comm->all_gather_v(nullptr, nullptr, none, type).ok());
    });
  });
}

TEST_P(Conformance, ReduceScatterEvenAndUneven) {
  OnRanks([&](std::shared_ptr<Communicator> comm) {
    const int me = comm->rank();
    const int n = comm->size();
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      const DataType type = DataTypeOf<T>();
      for (ReduceOp op : OpsOf<T>()) {
        SCOPED_TRACE(absl::StrCat(Name<T>(), " ", ReduceOpName(op)));
        const size_t count = 2;
        Buffer<T> send(h(), Inputs<T>(op, me, count * n));
        Buffer<T> recv(h(), Sentinel<T>(count));
        ASSERT_OK(comm->reduce_scatter(send.cspan(), recv.span(), op));
        const std::vector<T> want = Reduced<T>(op, n, count, me * count);
        EXPECT_TRUE(SameValues(recv.Read(), want));
        Buffer<T> async(h(), Sentinel<T>(count));
        ASSERT_TRUE(TestedOk(
            comm->ireduce_scatter(send.data(), async.data(), count, type, op)));
        EXPECT_TRUE(SameValues(async.Read(), want)) << "async";

        // Rank r owns (r + 1) % 3 elements: some own none.
        std::vector<size_t> counts(n);
        size_t first = 0;
        for (int r = 0; r < n; ++r) {
          counts[r] = static_cast<size_t>((r + 1) % 3);
          if (r < me) first += counts[r];
        }
        const size_t total =
            std::accumulate(counts.begin(), counts.end(), size_t{0});
        const std::vector<T> vwant = Reduced<T>(op, n, counts[me], first);
        Buffer<T> all(h(), Inputs<T>(op, me, total));
        Buffer<T> part(h(), Sentinel<T>(counts[me]));
        ASSERT_OK(
            comm->reduce_scatter_v(all.data(), part.data(), counts, type, op));
        EXPECT_TRUE(SameValues(part.Read(), vwant)) << "v";
        Buffer<T> vasync(h(), Sentinel<T>(counts[me]));
        ASSERT_TRUE(WaitedOk(comm->ireduce_scatter_v(all.data(), vasync.data(),
                                                     counts, type, op)));
        EXPECT_TRUE(SameValues(vasync.Read(), vwant)) << "async v";
      }
    });
  });
}

TEST_P(Conformance, GatherAndScatterAtEveryRoot) {
  OnRanks([&](std::shared_ptr<Communicator> comm) {
    const int me = comm->rank();
    const int n = comm->size();
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      const DataType type = DataTypeOf<T>();
      const size_t count = 3;
      for (int root = 0; root < n; ++root) {
        SCOPED_TRACE(absl::StrCat(Name<T>(), " root ", root));
        // Gather: rank r gives Values(r + root); the root gets them in rank
        // order; a rank that is not the root passes no recv buffer.
        std::vector<T> want;
        std::vector<T> blocks;  // scatter: block r goes to rank r
        for (int r = 0; r < n; ++r) {
          const std::vector<T> g = Values<T>(r + root, count);
          want.insert(want.end(), g.begin(), g.end());
          const std::vector<T> s = Values<T>(r, count, root);
          blocks.insert(blocks.end(), s.begin(), s.end());
        }
        Buffer<T> mine(h(), Values<T>(me + root, count));
        Buffer<T> all(h(), Sentinel<T>(me == root ? count * n : 0));
        ASSERT_OK(comm->gather(mine.data(), all.data(), count, type, root));
        if (me == root) {
          EXPECT_TRUE(SameValues(all.Read(), want));
        }
        Buffer<T> async(h(), Sentinel<T>(me == root ? count * n : 0));
        ASSERT_TRUE(WaitedOk(
            comm->igather(mine.data(), async.data(), count, type, root)));
        if (me == root) {
          EXPECT_TRUE(SameValues(async.Read(), want)) << "async";
        }

        Buffer<T> source(h(), me == root ? blocks : std::vector<T>());
        Buffer<T> got(h(), Sentinel<T>(count));
        ASSERT_OK(comm->scatter(source.data(), got.data(), count, type, root));
        EXPECT_TRUE(SameValues(got.Read(), Values<T>(me, count, root)));
        Buffer<T> got_async(h(), Sentinel<T>(count));
        ASSERT_TRUE(TestedOk(comm->iscatter(source.data(), got_async.data(),
                                            count, type, root)));
        EXPECT_TRUE(SameValues(got_async.Read(), Values<T>(me, count, root)))
            << "async";
      }
    });
  });
}

// What rank `from` sends rank `to` in the all-to-all cases.
template <typename T>
std::vector<T> Block(int from, int to, size_t count) {
  return Values<T>(from * 16 + to, count);
}

TEST_P(Conformance, AllToAllEvenAndUneven) {
  OnRanks([&](std::shared_ptr<Communicator> comm) {
    const int me = comm->rank();
    const int n = comm->size();
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      const DataType type = DataTypeOf<T>();
      SCOPED_TRACE(Name<T>());
      const size_t count = 2;
      std::vector<T> send, want;
      for (int p = 0; p < n; ++p) {
        const std::vector<T> out = Block<T>(me, p, count);
        send.insert(send.end(), out.begin(), out.end());
        const std::vector<T> in = Block<T>(p, me, count);
        want.insert(want.end(), in.begin(), in.end());
      }
      Buffer<T> out(h(), send);
      Buffer<T> in(h(), Sentinel<T>(send.size()));
      ASSERT_OK(comm->all_to_all(out.cspan(), in.span()));
      EXPECT_TRUE(SameValues(in.Read(), want));
      Buffer<T> async(h(), Sentinel<T>(send.size()));
      ASSERT_TRUE(
          TestedOk(comm->iall_to_all(out.data(), async.data(), count, type)));
      EXPECT_TRUE(SameValues(async.Read(), want)) << "async";

      // Rank a sends rank b (a + 2b) % 3 elements: zero for some pairs.
      auto pair_count = [](int a, int b) {
        return static_cast<size_t>((a + 2 * b) % 3);
      };
      std::vector<size_t> send_counts(n), recv_counts(n);
      std::vector<T> vsend, vwant;
      for (int p = 0; p < n; ++p) {
        send_counts[p] = pair_count(me, p);
        recv_counts[p] = pair_count(p, me);
        const std::vector<T> o = Block<T>(me, p, send_counts[p]);
        vsend.insert(vsend.end(), o.begin(), o.end());
        const std::vector<T> i = Block<T>(p, me, recv_counts[p]);
        vwant.insert(vwant.end(), i.begin(), i.end());
      }
      Buffer<T> vout(h(), vsend);
      Buffer<T> vin(h(), Sentinel<T>(vwant.size()));
      ASSERT_OK(comm->all_to_all_v(vout.cspan(), send_counts, vin.span(),
                                   recv_counts));
      EXPECT_TRUE(SameValues(vin.Read(), vwant)) << "v";
      Buffer<T> vasync(h(), Sentinel<T>(vwant.size()));
      ASSERT_TRUE(WaitedOk(comm->iall_to_all_v(
          vout.data(), send_counts, vasync.data(), recv_counts, type)));
      EXPECT_TRUE(SameValues(vasync.Read(), vwant)) << "async v";
    });
  });
}

// -- Point to point -----------------------------------------------------------

TEST_P(Conformance, PointToPointEveryType) {
  OnRanks([&](std::shared_ptr<Communicator> comm) {
    const int me = comm->rank();
    const int n = comm->size();
    const int next = (me + 1) % n;
    const int prev = (me + n - 1) % n;
    const absl::Span<const int> globals = comm->ranks();
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      const DataType type = DataTypeOf<T>();
      SCOPED_TRACE(Name<T>());
      const std::vector<T> want = Values<T>(prev, 4);
      Buffer<T> out(h(), Values<T>(me, 4));
      // A combined shift works on any size, oneself included (n == 1).
      Buffer<T> in(h(), Sentinel<T>(4));
      ASSERT_OK(comm->send_recv(out.cspan(), next, in.span(), prev));
      EXPECT_TRUE(SameValues(in.Read(), want)) << "send_recv";

      // irecv posted before the matching isend (alone: after the send to
      // oneself it matches), waited in the opposite order: by group rank,
      // then by global rank.
      for (bool global : {false, true}) {
        SCOPED_TRACE(global ? "GlobalRank" : "group rank");
        Buffer<T> got(h(), Sentinel<T>(4));
        auto post_recv = [&] {
          return global ? comm->irecv(got.data(), 4, type,
                                      GlobalRank(globals[prev]))
                        : comm->irecv(got.span(), prev);
        };
        auto post_send = [&] {
          return global ? comm->isend(out.data(), 4, type,
                                      GlobalRank(globals[next]))
                        : comm->isend(out.cspan(), next);
        };
        Communicator::WorkOr r = absl::UnknownError("not posted");
        if (n > 1) r = post_recv();
        auto w = post_send();
        if (n == 1) r = post_recv();
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_TRUE(w.ok()) << w.status();
        ASSERT_TRUE(WaitedOk(w));
        ASSERT_TRUE(WaitedOk(r));
        EXPECT_TRUE(SameValues(got.Read(), want));
      }
      if (n < 2) return;
      // Blocking sends and receives: even ranks send first, odd ranks
      // receive first; one way by global rank, the other by group rank.
      Buffer<T> got(h(), Sentinel<T>(4));
      if (me % 2 == 0) {
        ASSERT_OK(comm->send(out.cspan(), GlobalRank(globals[next])));
        ASSERT_OK(comm->recv(got.span(), GlobalRank(globals[prev])));
      } else {
        ASSERT_OK(comm->recv(got.span(), prev));
        ASSERT_OK(comm->send(out.cspan(), next));
      }
      EXPECT_TRUE(SameValues(got.Read(), want)) << "blocking";
    });
  });
}

// An isend left running while the same rank blocks in a receive.
TEST_P(Conformance, IsendThenBlockingRecvRing) {
  if (!h().SendRunsAheadOfRecv()) {
    GTEST_SKIP() << h().backend() << " runs a communicator's operations in "
                 << "issue order and a send ends only once its receive is "
                 << "posted: an isend ahead of a blocking recv in a ring "
                 << "waits forever (post the irecv first)";
  }
  OnRanks([&](std::shared_ptr<Communicator> comm) {
    const int me = comm->rank();
    const int n = comm->size();
    const int next = (me + 1) % n;
    const int prev = (me + n - 1) % n;
    const absl::Span<const int> globals = comm->ranks();
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      SCOPED_TRACE(Name<T>());
      Buffer<T> out(h(), Values<T>(me, 4));
      for (bool global : {false, true}) {
        SCOPED_TRACE(global ? "GlobalRank" : "group rank");
        Buffer<T> got(h(), Sentinel<T>(4));
        auto w = global ? comm->isend(out.data(), 4, DataTypeOf<T>(),
                                      GlobalRank(globals[next]))
                        : comm->isend(out.cspan(), next);
        ASSERT_TRUE(w.ok()) << w.status();
        ASSERT_OK(global ? comm->recv(got.span(), GlobalRank(globals[prev]))
                         : comm->recv(got.span(), prev));
        ASSERT_TRUE(WaitedOk(w));
        EXPECT_TRUE(SameValues(got.Read(), Values<T>(prev, 4)));
      }
    });
  });
}

TEST_P(Conformance, BatchWithEveryPeerAndOneself) {
  OnRanks([&](std::shared_ptr<Communicator> comm) {
    const int me = comm->rank();
    const int n = comm->size();
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      SCOPED_TRACE(Name<T>());
      // Rank a sends rank b (a + b) % 3 elements (none for some), then one
      // more message; the receives are listed before the sends.
      auto count = [](int a, int b) {
        return static_cast<size_t>((a + b) % 3);
      };
      std::vector<Buffer<T>> in, in2, out, out2;
      for (int p = 0; p < n; ++p) {
        in.emplace_back(h(), Sentinel<T>(count(p, me)));
        in2.emplace_back(h(), Sentinel<T>(1));
        out.emplace_back(h(), Block<T>(me, p, count(me, p)));
        out2.emplace_back(h(), Block<T>(me + 8, p, 1));
      }
      std::vector<P2POp> ops;
      for (int p = 0; p < n; ++p) {
        ops.push_back(P2POp::Recv(in[p].span(), p));
        ops.push_back(P2POp::Recv(in2[p].span(), p));
      }
      for (int p = 0; p < n; ++p) {
        ops.push_back(P2POp::Send(out[p].cspan(), p));
        ops.push_back(P2POp::Send(out2[p].cspan(), p));
      }
      ASSERT_OK(comm->batch_send_recv(ops));
      for (int p = 0; p < n; ++p) {
        EXPECT_TRUE(SameValues(in[p].Read(), Block<T>(p, me, count(p, me))))
            << "from " << p;
        EXPECT_TRUE(SameValues(in2[p].Read(), Block<T>(p + 8, me, 1)))
            << "second from " << p;
      }
    });
    // The asynchronous form: a ring shift.
    const int next = (me + 1) % n;
    const int prev = (me + n - 1) % n;
    Buffer<int64_t> out(h(), Values<int64_t>(me, 3));
    Buffer<int64_t> in(h(), Sentinel<int64_t>(3));
    const std::vector<P2POp> ring = {P2POp::Recv(in.span(), prev),
                                     P2POp::Send(out.cspan(), next)};
    ASSERT_TRUE(WaitedOk(comm->batch_isend_irecv(ring)));
    EXPECT_TRUE(SameValues(in.Read(), Values<int64_t>(prev, 3)));
  });
}

// -- Asynchronous operations in flight together
// --------------------------------

TEST_P(Conformance, AsyncOperationsOverlapAndFinishInAnyOrder) {
  OnRanks([&](std::shared_ptr<Communicator> comm) {
    const int me = comm->rank();
    const int n = comm->size();
    // Several buckets in flight, a blocking all_gather behind them, then
    // one of each collective: every rank issues the same order.
    constexpr int kBuckets = 4;
    std::vector<Buffer<BFloat16>> buckets;
    std::vector<std::shared_ptr<Work>> works;
    auto add = [&](Communicator::WorkOr w) {
      ASSERT_TRUE(w.ok()) << w.status();
      works.push_back(*std::move(w));
    };
    for (int b = 0; b < kBuckets; ++b) {
      buckets.emplace_back(h(), Values<BFloat16>(me + b, 33));
      add(comm->iall_reduce(buckets.back().span(), ReduceOp::kSum));
    }
    Buffer<int64_t> id(h(), std::vector<int64_t>{comm->global_rank()});
    Buffer<int64_t> ids(h(), Sentinel<int64_t>(n));
    ASSERT_OK(comm->all_gather(id.cspan(), ids.span()));
    std::vector<int64_t> globals(comm->ranks().begin(), comm->ranks().end());
    EXPECT_TRUE(SameValues(ids.Read(), globals));

    Buffer<float> reduced(h(), Values<float>(me, 6));
    Buffer<int32_t> mine(h(), Values<int32_t>(me, 2));
    Buffer<int32_t> all(h(), Sentinel<int32_t>(2 * n));
    Buffer<double> rs_send(h(), Inputs<double>(ReduceOp::kMax, me, 3 * n));
    Buffer<double> rs_recv(h(), Sentinel<double>(3));
    std::vector<int64_t> a2a(n);
    for (int p = 0; p < n; ++p) a2a[p] = me * 100 + p;
    Buffer<int64_t> a2a_send(h(), a2a);
    Buffer<int64_t> a2a_recv(h(), Sentinel<int64_t>(n));
    Buffer<BFloat16> one(h(), {BFloat16(static_cast<float>(me))});
    Buffer<BFloat16> gathered(h(), Sentinel<BFloat16>(me == 0 ? n : 0));
    add(comm->iall_reduce(reduced.span(), ReduceOp::kSum));
    add(comm->iall_gather(mine.data(), all.data(), 2, DataType::kInt32));
    add(comm->ireduce_scatter(rs_send.data(), rs_recv.data(), 3,
                              DataType::kFloat64, ReduceOp::kMax));
    add(comm->iall_to_all(a2a_send.data(), a2a_recv.data(), 1,
                          DataType::kInt64));
    add(comm->igather(one.data(), gathered.data(), 1, DataType::kBFloat16, 0));
    for (auto it = works.rbegin(); it != works.rend(); ++it) {
      ASSERT_TRUE(TestUntilDone(**it)) << (*it)->name();
      EXPECT_TRUE((*it)->status().ok()) << (*it)->status();
    }
    for (int b = 0; b < kBuckets; ++b) {
      std::vector<BFloat16> want;
      for (size_t i = 0; i < 33; ++i) {
        double sum = 0;
        for (int r = 0; r < n; ++r) sum += Value<BFloat16>(r + b, i);
        want.push_back(From<BFloat16>(sum));
      }
      EXPECT_TRUE(SameValues(buckets[b].Read(), want)) << "bucket " << b;
    }
    EXPECT_TRUE(
        SameValues(reduced.Read(), Reduced<float>(ReduceOp::kSum, n, 6)));
    std::vector<int32_t> all_want;
    std::vector<int64_t> a2a_want;
    std::vector<BFloat16> gathered_want;
    for (int r = 0; r < n; ++r) {
      all_want.push_back(From<int32_t>(Value<int32_t>(r, 0)));
      all_want.push_back(From<int32_t>(Value<int32_t>(r, 1)));
      a2a_want.push_back(r * 100 + me);
      gathered_want.push_back(BFloat16(static_cast<float>(r)));
    }
    EXPECT_TRUE(SameValues(all.Read(), all_want));
    EXPECT_TRUE(SameValues(a2a_recv.Read(), a2a_want));
    if (me == 0) {
      EXPECT_TRUE(SameValues(gathered.Read(), gathered_want));
    }
    EXPECT_TRUE(SameValues(rs_recv.Read(),
                           Reduced<double>(ReduceOp::kMax, n, 3, me * 3)));
  });
}

// -- Misuse: the base class's checks reach every backend
// -------------------------

TEST_P(Conformance, BadArgumentsNameTheMistake) {
  OnRanks([&](std::shared_ptr<Communicator> comm) {
    const int n = comm->size();
    Buffer<int32_t> one(h(), Sentinel<int32_t>(1));
    Buffer<int32_t> wrong(h(), Sentinel<int32_t>(n + 1));
    Buffer<int32_t> buffer(h(), Sentinel<int32_t>(4));
    auto expect = [](const absl::Status& s, absl::StatusCode code,
                     const std::string& text) {
      EXPECT_EQ(s.code(), code) << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr(text)) << s;
    };
    const auto kInvalid = absl::StatusCode::kInvalidArgument;
    expect(comm->all_gather(one.cspan(), wrong.span()), kInvalid, "all_gather");
    expect(comm->reduce_scatter(wrong.cspan(), one.span(), ReduceOp::kSum),
           kInvalid, "reduce_scatter");
    expect(comm->broadcast(one.span(), n), kInvalid,
           absl::StrCat("root ", n, " is outside the group of ", n, " ranks"));
    expect(comm->send(one.cspan(), -1), kInvalid, "-1 is outside the group");
    expect(comm->recv(one.span(), n), kInvalid, "is outside the group");
    expect(
        comm->all_reduce(nullptr, nullptr, 3, DataType::kInt32, ReduceOp::kSum),
        kInvalid, "buffer is null for 3 elements");
    expect(comm->all_reduce(buffer.data(), buffer.data() + 1, 3,
                            DataType::kInt32, ReduceOp::kSum),
           kInvalid, "overlap");
    expect(comm->all_reduce(buffer.data(), buffer.data(), 4, DataType::kInt32,
                            ReduceOp::kAvg),
           kInvalid, "avg needs a floating-point type; got int32");
    const std::vector<size_t> counts(n + 1, 0);
    expect(comm->all_gather_v(buffer.data(), buffer.data(), counts,
                              DataType::kInt32),
           kInvalid, "expected one per rank of the group");
    // A global rank that is not a member.
    expect(comm->send(one.cspan(), GlobalRank(-9)), absl::StatusCode::kNotFound,
           "-9");
    auto irecv = comm->irecv(one.data(), 1, DataType::kInt32, GlobalRank(-3));
    expect(irecv.status(), absl::StatusCode::kNotFound, "-3");
    EXPECT_TRUE(comm->barrier().ok());  // the group is still usable
  });
}

// -- Abort and deadlines
// ------------------------------------------------------------

// A private communicator for a case that aborts one (the world stays
// usable): the same members, in the same order.
std::shared_ptr<Communicator> Private(Communicator& world) {
  auto split = world.split(0, world.rank());
  EXPECT_TRUE(split.ok()) << split.status();
  return split.ok() ? *split : nullptr;
}

// The abort and deadline cases: rank 0 of a private communicator blocks in
// a receive from the rank before it (itself when alone) that nobody sends,
// while the other ranks wait for it in a barrier of the world, so that no
// peer leaves the private communicator under it. Then every rank settles
// the abandoned receive and frees the private communicator; the world is
// untouched.
void Settle(CommHarness& h, Communicator& world,
            std::shared_ptr<Communicator> comm) {
  const absl::Status s = world.barrier();
  EXPECT_TRUE(s.ok()) << "the world after an abort of a split: " << s;
  h.SettleAbandonedRecv(*comm);
  comm.reset();
}

#define SKIP_IF_SELF_RECV_DOES_NOT_BLOCK()                                    \
  do {                                                                        \
    if (n() == 1 && !h().SelfRecvBlocks()) {                                  \
      GTEST_SKIP() << "needs a receive that blocks: alone, " << h().backend() \
                   << " refuses a receive from oneself with nothing sent";    \
    }                                                                         \
  } while (0)

TEST_P(Conformance, AbortFromAnotherThreadReleasesABlockedRecv) {
  SKIP_IF_SELF_RECV_DOES_NOT_BLOCK();
  OnRanks([&](std::shared_ptr<Communicator> world) {
    // Declared before the communicator, so that it outlives it.
    Buffer<int32_t> landing(h(), Sentinel<int32_t>(4));
    std::shared_ptr<Communicator> comm = Private(*world);
    ASSERT_THAT(comm, NotNull());
    if (comm->rank() != 0) return Settle(h(), *world, std::move(comm));
    const int prev = comm->size() - 1;
    std::thread aborter([comm] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      comm->abort("aborted by a second thread");
    });
    // Nobody sends: the receive blocks until the abort.
    const absl::Time start = absl::Now();
    const absl::Status s = comm->recv(landing.span(), prev);
    const absl::Duration took = absl::Now() - start;
    aborter.join();
    EXPECT_TRUE(absl::IsAborted(s)) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("aborted by a second thread"));
    EXPECT_GE(took, absl::Milliseconds(150));
    EXPECT_LT(took, absl::Seconds(5));
    EXPECT_TRUE(comm->aborted());
    // Later operations are refused without running.
    const absl::Status later = comm->barrier();
    EXPECT_TRUE(absl::IsAborted(later)) << later;
    const absl::Time drop = absl::Now();
    Settle(h(), *world, std::move(comm));
    EXPECT_LT(absl::Now() - drop, absl::Seconds(5)) << "freeing it";
  });
}

TEST_P(Conformance, WorkWaitedAfterAbortIsAborted) {
  SKIP_IF_SELF_RECV_DOES_NOT_BLOCK();
  OnRanks([&](std::shared_ptr<Communicator> world) {
    Buffer<int32_t> landing(h(), Sentinel<int32_t>(4));
    std::shared_ptr<Communicator> comm = Private(*world);
    ASSERT_THAT(comm, NotNull());
    if (comm->rank() != 0) return Settle(h(), *world, std::move(comm));
    const int prev = comm->size() - 1;
    auto w = comm->irecv(landing.span(), prev);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_FALSE((*w)->test());
    comm->abort("the test gave up");
    const absl::Time start = absl::Now();
    const absl::Status s = (*w)->wait(absl::Now() + kLimit);
    EXPECT_TRUE(absl::IsAborted(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("the test gave up"));
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
    const absl::Status later = comm->barrier();
    EXPECT_TRUE(absl::IsAborted(later)) << later;
    EXPECT_THAT(std::string(later.message()), HasSubstr("the test gave up"));
    w->reset();
    Settle(h(), *world, std::move(comm));
  });
}

TEST_P(Conformance, DeadlineIsDeadlineExceededThenAborted) {
  SKIP_IF_SELF_RECV_DOES_NOT_BLOCK();
  OnRanks([&](std::shared_ptr<Communicator> world) {
    Buffer<int32_t> landing(h(), Sentinel<int32_t>(4));
    std::shared_ptr<Communicator> comm = Private(*world);
    ASSERT_THAT(comm, NotNull());
    if (comm->rank() != 0) return Settle(h(), *world, std::move(comm));
    const int prev = comm->size() - 1;
    comm->set_timeout(absl::Milliseconds(200));
    EXPECT_EQ(comm->timeout(), absl::Milliseconds(200));
    const absl::Time start = absl::Now();
    const absl::Status s = comm->recv(landing.span(), prev);
    const absl::Duration took = absl::Now() - start;
    EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
    EXPECT_GE(took, absl::Milliseconds(150));
    EXPECT_LT(took, absl::Seconds(10));
    EXPECT_TRUE(comm->aborted());
    // Every later operation: Aborted, naming the deadline.
    const absl::Status later = comm->barrier();
    EXPECT_TRUE(absl::IsAborted(later)) << later;
    EXPECT_THAT(std::string(later.message()), HasSubstr("did not finish"));
    Settle(h(), *world, std::move(comm));
  });
}

// -- Splits
// ---------------------------------------------------------------------------

TEST_P(Conformance, SplitOrdersByKeyThenRank) {
  OnRanks([&](std::shared_ptr<Communicator> comm) {
    const int me = comm->rank();
    const int n = comm->size();
    const std::vector<int> globals = h().GlobalRanks(n);
    // Two groups by parity, each ordered by descending rank (the key).
    auto half = comm->split(me % 2, -me);
    ASSERT_TRUE(half.ok()) << half.status();
    ASSERT_THAT(*half, NotNull());
    std::vector<int> expected;
    for (int r = n - 1; r >= 0; --r) {
      if (r % 2 == me % 2) expected.push_back(globals[r]);
    }
    EXPECT_THAT((*half)->ranks(), ElementsAreArray(expected));
    EXPECT_EQ((*half)->global_rank(), globals[me]);
    EXPECT_EQ((*half)->backend(), h().backend());
    // The new group works, in that order.
    Buffer<int32_t> mine(h(), std::vector<int32_t>{globals[me]});
    Buffer<int32_t> gathered(h(), Sentinel<int32_t>(expected.size()));
    ASSERT_OK((*half)->all_gather(mine.cspan(), gathered.span()));
    EXPECT_TRUE(SameValues(gathered.Read(), expected));

    // Equal keys: rank order. Two groups, low and high ranks.
    auto ties = comm->split(me < n / 2 ? 0 : 1, 7);
    ASSERT_TRUE(ties.ok()) << ties.status();
    ASSERT_THAT(*ties, NotNull());
    std::vector<int> same_side;
    for (int r = 0; r < n; ++r) {
      if ((r < n / 2) == (me < n / 2)) same_side.push_back(globals[r]);
    }
    EXPECT_THAT((*ties)->ranks(), ElementsAreArray(same_side));

    // A split of a split still reports global ranks.
    auto single = (*half)->split(me, 0);
    ASSERT_TRUE(single.ok()) << single.status();
    ASSERT_THAT(*single, NotNull());
    EXPECT_THAT((*single)->ranks(), ElementsAreArray({globals[me]}));
    EXPECT_TRUE((*single)->barrier().ok());

    // A negative color takes part and gets no group.
    auto some = comm->split(me == 0 ? -1 : 0, me);
    ASSERT_TRUE(some.ok()) << some.status();
    if (me == 0) {
      EXPECT_THAT(*some, IsNull());
    } else {
      ASSERT_THAT(*some, NotNull());
      EXPECT_EQ((*some)->size(), n - 1);
      EXPECT_EQ((*some)->rank(), me - 1);
      EXPECT_EQ((*some)->ranks()[0], globals[1]);
      Buffer<int32_t> x(h(), std::vector<int32_t>{1});
      ASSERT_OK((*some)->all_reduce(x.span(), ReduceOp::kSum));
      EXPECT_TRUE(SameValues(x.Read(), std::vector<int32_t>{n - 1}));
    }
    // Everyone negative: nobody gets a group.
    auto none = comm->split(-1, 0);
    ASSERT_TRUE(none.ok()) << none.status();
    EXPECT_THAT(*none, IsNull());

    // split_many answers what the splits one by one answer, in order.
    const std::vector<SplitRequest> requests = {
        {me % 2, -me, "PARITY"}, {me == 0 ? -1 : 0, me, "REST"}, {0, 0, ""}};
    auto many = comm->split_many(requests);
    ASSERT_TRUE(many.ok()) << many.status();
    ASSERT_EQ(many->size(), 3u);
    ASSERT_THAT((*many)[0], NotNull());
    EXPECT_THAT((*many)[0]->ranks(), ElementsAreArray(expected));
    if (me == 0) {
      EXPECT_THAT((*many)[1], IsNull());
    } else {
      ASSERT_THAT((*many)[1], NotNull());
      EXPECT_EQ((*many)[1]->rank(), me - 1);
    }
    ASSERT_THAT((*many)[2], NotNull());
    EXPECT_THAT((*many)[2]->ranks(), ElementsAreArray(globals));
    EXPECT_TRUE((*many)[2]->barrier().ok());

    // The parent is still usable after splitting.
    EXPECT_TRUE(comm->barrier().ok());
  });
}

// A 2 x (n / 2) grid: rows {0 .. n/2 - 1}, {n/2 .. n - 1}; columns {c, c +
// n/2}.
TEST_P(Conformance, SplitRowsColumnsAndNested) {
  if (n() != 0 && (n() < 4 || n() % 2 != 0)) {
    GTEST_SKIP() << "a 2 x (n/2) grid needs an even number of ranks, >= 4";
  }
  OnRanks([&](std::shared_ptr<Communicator> comm) {
    const int me = comm->rank();
    const int n = comm->size();
    if (n < 4 || n % 2 != 0) {  // the job's world: the same on every rank
      GTEST_SKIP() << "a 2 x (n/2) grid needs an even number of ranks, >= 4";
    }
    const std::vector<int> globals = h().GlobalRanks(n);
    const int width = n / 2;
    const int row_index = me / width;
    const int col_index = me % width;
    auto row = comm->split(row_index, col_index);
    ASSERT_TRUE(row.ok()) << row.status();
    auto col = comm->split(col_index, row_index);
    ASSERT_TRUE(col.ok()) << col.status();
    ASSERT_THAT(*row, NotNull());
    ASSERT_THAT(*col, NotNull());

    EXPECT_EQ((*row)->size(), width);
    EXPECT_EQ((*row)->rank(), col_index);
    std::vector<int> row_ranks;
    for (int c = 0; c < width; ++c) {
      row_ranks.push_back(globals[row_index * width + c]);
    }
    EXPECT_THAT((*row)->ranks(), ElementsAreArray(row_ranks));
    EXPECT_EQ((*col)->size(), 2);
    EXPECT_EQ((*col)->rank(), row_index);
    EXPECT_THAT(
        (*col)->ranks(),
        ElementsAreArray({globals[col_index], globals[col_index + width]}));

    // Sums of the world ranks over a row and over a column.
    Buffer<int64_t> x(h(), std::vector<int64_t>{me});
    ASSERT_OK((*row)->all_reduce(x.span(), ReduceOp::kSum));
    int64_t row_sum = 0;
    for (int c = 0; c < width; ++c) row_sum += row_index * width + c;
    EXPECT_TRUE(SameValues(x.Read(), std::vector<int64_t>{row_sum}));
    Buffer<int64_t> y(h(), std::vector<int64_t>{me});
    ASSERT_OK((*col)->all_reduce(y.span(), ReduceOp::kSum));
    EXPECT_TRUE(
        SameValues(y.Read(), std::vector<int64_t>{2 * col_index + width}));

    // Nested: each row in halves, the second half reversed by key.
    const int half = col_index < width / 2 ? 0 : 1;
    auto part = (*row)->split(half, half == 1 ? -col_index : col_index);
    ASSERT_TRUE(part.ok()) << part.status();
    ASSERT_THAT(*part, NotNull());
    std::vector<int> part_ranks;
    for (int c = 0; c < width; ++c) {
      if ((c < width / 2 ? 0 : 1) == half) {
        part_ranks.push_back(globals[row_index * width + c]);
      }
    }
    if (half == 1) std::reverse(part_ranks.begin(), part_ranks.end());
    EXPECT_THAT((*part)->ranks(), ElementsAreArray(part_ranks));
    EXPECT_EQ((*part)->global_rank(), globals[me]);
    Buffer<int32_t> z(h(), std::vector<int32_t>{globals[me]});
    Buffer<int32_t> both(h(), Sentinel<int32_t>(part_ranks.size()));
    ASSERT_OK((*part)->all_gather(z.cspan(), both.span()));
    EXPECT_TRUE(SameValues(both.Read(), part_ranks));
    // Groups made by different splits do not get in each other's way.
    EXPECT_TRUE((*row)->barrier().ok());
    EXPECT_TRUE((*col)->barrier().ok());
    EXPECT_TRUE(comm->barrier().ok());
  });
}

// -- Ownership
// ----------------------------------------------------------------------

TEST_P(Conformance, DestroyingFreesEveryCommunicator) {
  const int64_t before = LiveCommunicatorCount();
  OnRanks([&](std::shared_ptr<Communicator> comm) {
    for (int i = 0; i < 5; ++i) {
      auto child = comm->split(comm->rank() % 2, 0);
      ASSERT_TRUE(child.ok()) << child.status();
      ASSERT_THAT(*child, NotNull());
    }
    // A split outlives its parent, and a Work its communicator's holders.
    const int n = comm->size();
    auto kept = comm->split(0, comm->rank());
    ASSERT_TRUE(kept.ok()) << kept.status();
    std::shared_ptr<Communicator> child = *std::move(kept);
    comm.reset();
    Buffer<int32_t> x(h(), std::vector<int32_t>{1});
    auto w = child->iall_reduce(x.span(), ReduceOp::kSum);
    ASSERT_TRUE(w.ok()) << w.status();
    child.reset();
    ASSERT_TRUE(WaitedOk(w));
    EXPECT_TRUE(SameValues(x.Read(), std::vector<int32_t>{n}));
  });
  EXPECT_EQ(LiveCommunicatorCount(), before);
}

}  // namespace
}  // namespace vemesh::testing
