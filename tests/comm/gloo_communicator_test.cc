// The Gloo backend, run as 1, 2, 3 and 8 ranks: one thread per rank in this
// process, all rendezvousing through one MemoryStore. Every operation is
// run for every element type; each result is checked against values each
// rank computes on its own from the ranks' known inputs. Failures (a rank
// that never comes, a peer that leaves, an abort from another thread) must
// end in an error within a bound, never a hang.

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
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "expected_values.h"
#include "gloo/common/error.h"
#include "gloo/context.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/comm/gloo/internal/gloo_store.h"
#include "vemesh/rendezvous/memory_store.h"

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
  f(BFloat16{});
  f(Float16{});
  f(int8_t{});
  f(uint8_t{});
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
                         ::testing::Values(1, 2, 3, 8),
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
    EXPECT_EQ(comm->gloo_timeout(), kTimeout);
    NativeHandle handle = comm->native_handle();
    EXPECT_EQ(handle.backend, "gloo");
    ASSERT_THAT(handle.handle, NotNull());
    auto* context = static_cast<gloo::Context*>(handle.handle);
    EXPECT_EQ(context->rank, me);
    EXPECT_EQ(context->size, n);
    EXPECT_TRUE(comm->barrier().ok());
  });
}

TEST_P(GlooCommunicatorTest, BroadcastEveryTypeFromEveryRoot) {
  OnRanks(n(), [&](std::shared_ptr<GlooCommunicator> comm) {
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      for (int root = 0; root < comm->size(); ++root) {
        std::vector<T> data(5, From<T>(99));
        if (comm->rank() == root) data = Values<T>(root, 5);
        ASSERT_TRUE(comm->broadcast(absl::MakeSpan(data), root).ok());
        const std::vector<T> want = Values<T>(root, 5);
        for (size_t i = 0; i < data.size(); ++i) {
          EXPECT_VALUE(data[i], want[i]) << Name<T>() << " root " << root;
        }
      }
    });
  });
}

TEST_P(GlooCommunicatorTest, AllReduceEveryOpEveryTypeInAndOutOfPlace) {
  OnRanks(n(), [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    const int n = comm->size();
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      for (ReduceOp op : OpsOf<T>()) {
        const size_t count = 7;
        std::vector<T> data = Inputs<T>(op, me, count);
        std::vector<T> out(count, From<T>(0));
        ASSERT_TRUE(comm->all_reduce(data.data(), out.data(), count,
                                     DataTypeOf<T>(), op)
                        .ok());
        // The input of an out-of-place reduction is left alone.
        const std::vector<T> mine = Inputs<T>(op, me, count);
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(To(data[i]), To(mine[i]));
        }
        ASSERT_TRUE(comm->all_reduce(absl::MakeSpan(data), op).ok());
        for (size_t i = 0; i < count; ++i) {
          const double want = Expected<T>(op, n, i);
          EXPECT_VALUE(out[i], want)
              << Name<T>() << " " << ReduceOpName(op) << " i " << i;
          EXPECT_VALUE(data[i], want)
              << Name<T>() << " " << ReduceOpName(op) << " in place, i " << i;
        }
      }
    });
  });
}

TEST_P(GlooCommunicatorTest, ReduceToEveryRoot) {
  OnRanks(n(), [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    const int n = comm->size();
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      for (ReduceOp op : OpsOf<T>()) {
        for (int root = 0; root < n; ++root) {
          const size_t count = 5;
          const std::vector<T> send = Inputs<T>(op, me, count);
          std::vector<T> recv(count, From<T>(42));
          ASSERT_TRUE(comm->reduce(send.data(),
                                   me == root ? recv.data() : nullptr, count,
                                   DataTypeOf<T>(), op, root)
                          .ok());
          if (me != root) continue;
          for (size_t i = 0; i < count; ++i) {
            EXPECT_VALUE(recv[i], Expected<T>(op, n, i))
                << Name<T>() << " " << ReduceOpName(op) << " root " << root;
          }
        }
      }
    });
  });
}

TEST_P(GlooCommunicatorTest, AllGatherAndUnevenAllGatherV) {
  OnRanks(n(), [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    const int n = comm->size();
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      const size_t count = 3;
      const std::vector<T> mine = Values<T>(me, count);
      std::vector<T> all(count * n);
      ASSERT_TRUE(
          comm->all_gather(absl::MakeConstSpan(mine), absl::MakeSpan(all))
              .ok());
      for (int r = 0; r < n; ++r) {
        const std::vector<T> want = Values<T>(r, count);
        for (size_t i = 0; i < count; ++i) {
          EXPECT_VALUE(all[r * count + i], want[i]) << Name<T>() << " " << r;
        }
      }
      // Rank r gives r % 3 elements: rank 0 (and 3, 6) nothing.
      std::vector<size_t> counts(n);
      for (int r = 0; r < n; ++r) counts[r] = r % 3;
      const size_t total = std::accumulate(counts.begin(), counts.end(),
                                           size_t{0});
      const std::vector<T> part = Values<T>(me, counts[me]);
      std::vector<T> gathered(total, From<T>(99));
      ASSERT_TRUE(comm->all_gather_v(part.data(), gathered.data(), counts,
                                     DataTypeOf<T>())
                      .ok());
      size_t at = 0;
      for (int r = 0; r < n; ++r) {
        const std::vector<T> want = Values<T>(r, counts[r]);
        for (size_t i = 0; i < counts[r]; ++i, ++at) {
          EXPECT_VALUE(gathered[at], want[i]) << Name<T>() << " " << r;
        }
      }
      // Nobody gives anything: a no-op for everyone.
      std::vector<size_t> none(n, 0);
      EXPECT_TRUE(
          comm->all_gather_v(nullptr, nullptr, none, DataTypeOf<T>()).ok());
    });
  });
}

TEST_P(GlooCommunicatorTest, ReduceScatterAndUnevenReduceScatterV) {
  OnRanks(n(), [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    const int n = comm->size();
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      for (ReduceOp op : OpsOf<T>()) {
        const size_t count = 2;
        const std::vector<T> send = Inputs<T>(op, me, count * n);
        std::vector<T> recv(count);
        ASSERT_TRUE(comm->reduce_scatter(absl::MakeConstSpan(send),
                                         absl::MakeSpan(recv), op)
                        .ok());
        for (size_t j = 0; j < count; ++j) {
          EXPECT_VALUE(recv[j], Expected<T>(op, n, me * count + j))
              << Name<T>() << " " << ReduceOpName(op) << " j " << j;
        }
        // Rank r owns (r + 1) % 3 elements: some own none.
        std::vector<size_t> counts(n);
        size_t first = 0;
        for (int r = 0; r < n; ++r) {
          counts[r] = (r + 1) % 3;
          if (r < me) first += counts[r];
        }
        const size_t total = std::accumulate(counts.begin(), counts.end(),
                                             size_t{0});
        const std::vector<T> all = Inputs<T>(op, me, total);
        std::vector<T> part(counts[me], From<T>(99));
        ASSERT_TRUE(comm->reduce_scatter_v(all.data(), part.data(), counts,
                                           DataTypeOf<T>(), op)
                        .ok());
        for (size_t j = 0; j < counts[me]; ++j) {
          EXPECT_VALUE(part[j], Expected<T>(op, n, first + j))
              << Name<T>() << " " << ReduceOpName(op) << " v, j " << j;
        }
      }
    });
  });
}

TEST_P(GlooCommunicatorTest, GatherAndScatterAtEveryRoot) {
  OnRanks(n(), [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    const int n = comm->size();
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      const size_t count = 3;
      for (int root = 0; root < n; ++root) {
        const std::vector<T> mine = Values<T>(me + root, count);
        std::vector<T> all(count * n, From<T>(99));
        ASSERT_TRUE(comm->gather(mine.data(),
                                 me == root ? all.data() : nullptr, count,
                                 DataTypeOf<T>(), root)
                        .ok());
        if (me == root) {
          for (int r = 0; r < n; ++r) {
            const std::vector<T> want = Values<T>(r + root, count);
            for (size_t i = 0; i < count; ++i) {
              EXPECT_VALUE(all[r * count + i], want[i])
                  << Name<T>() << " gather at " << root << " from " << r;
            }
          }
        }
        // Block r of the root's buffer goes to rank r.
        std::vector<T> blocks;
        if (me == root) {
          for (int r = 0; r < n; ++r) {
            const std::vector<T> block = Values<T>(r, count, root);
            blocks.insert(blocks.end(), block.begin(), block.end());
          }
        }
        std::vector<T> got(count, From<T>(99));
        ASSERT_TRUE(comm->scatter(me == root ? blocks.data() : nullptr,
                                  got.data(), count, DataTypeOf<T>(), root)
                        .ok());
        const std::vector<T> want = Values<T>(me, count, root);
        for (size_t i = 0; i < count; ++i) {
          EXPECT_VALUE(got[i], want[i])
              << Name<T>() << " scatter from " << root;
        }
      }
    });
  });
}

// What rank `from` sends rank `to` in the all-to-all tests.
template <typename T>
std::vector<T> Block(int from, int to, size_t count) {
  return Values<T>(from * 16 + to, count);
}

TEST_P(GlooCommunicatorTest, AllToAllAndUnevenAllToAllV) {
  OnRanks(n(), [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    const int n = comm->size();
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      const size_t count = 2;
      std::vector<T> send;
      for (int to = 0; to < n; ++to) {
        const std::vector<T> b = Block<T>(me, to, count);
        send.insert(send.end(), b.begin(), b.end());
      }
      std::vector<T> recv(send.size(), From<T>(99));
      ASSERT_TRUE(
          comm->all_to_all(absl::MakeConstSpan(send), absl::MakeSpan(recv))
              .ok());
      for (int from = 0; from < n; ++from) {
        const std::vector<T> want = Block<T>(from, me, count);
        for (size_t i = 0; i < count; ++i) {
          EXPECT_VALUE(recv[from * count + i], want[i])
              << Name<T>() << " from " << from;
        }
      }
      // Rank a sends rank b (a + b) % 3 elements: zero for some pairs, and
      // rank 0 sends nothing to itself.
      auto pair_count = [](int a, int b) -> size_t { return (a + b) % 3; };
      std::vector<size_t> send_counts(n), recv_counts(n);
      std::vector<T> vsend;
      for (int to = 0; to < n; ++to) {
        send_counts[to] = pair_count(me, to);
        recv_counts[to] = pair_count(to, me);
        const std::vector<T> b = Block<T>(me, to, send_counts[to]);
        vsend.insert(vsend.end(), b.begin(), b.end());
      }
      std::vector<T> vrecv(
          std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0}),
          From<T>(99));
      ASSERT_TRUE(comm->all_to_all_v(absl::MakeConstSpan(vsend),
                                     absl::MakeConstSpan(send_counts),
                                     absl::MakeSpan(vrecv),
                                     absl::MakeConstSpan(recv_counts))
                      .ok());
      size_t at = 0;
      for (int from = 0; from < n; ++from) {
        const std::vector<T> want = Block<T>(from, me, recv_counts[from]);
        for (size_t i = 0; i < want.size(); ++i, ++at) {
          EXPECT_VALUE(vrecv[at], want[i]) << Name<T>() << " v from " << from;
        }
      }
    });
  });
}

TEST_P(GlooCommunicatorTest, SendRecvRingEveryType) {
  OnRanks(n(), [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    const int n = comm->size();
    const int next = (me + 1) % n;
    const int prev = (me + n - 1) % n;
    ForEachType([&](auto zero) {
      using T = decltype(zero);
      const std::vector<T> out = Values<T>(me, 4);
      const std::vector<T> want = Values<T>(prev, 4);
      std::vector<T> in(4, From<T>(99));
      // A combined shift works on any size, oneself included (n == 1).
      ASSERT_TRUE(comm->send_recv(absl::MakeConstSpan(out), next,
                                  absl::MakeSpan(in), prev)
                      .ok());
      for (size_t i = 0; i < in.size(); ++i) {
        EXPECT_VALUE(in[i], want[i]) << Name<T>();
      }
      if (n < 2) return;
      // Separate send and recv, by global rank: even ranks send first, odd
      // ranks receive first.
      std::fill(in.begin(), in.end(), From<T>(99));
      if (me % 2 == 0) {
        ASSERT_TRUE(
            comm->send(absl::MakeConstSpan(out), GlobalRank(Global(next)))
                .ok());
        ASSERT_TRUE(comm->recv(absl::MakeSpan(in), GlobalRank(Global(prev)))
                        .ok());
      } else {
        ASSERT_TRUE(comm->recv(absl::MakeSpan(in), prev).ok());
        ASSERT_TRUE(comm->send(absl::MakeConstSpan(out), next).ok());
      }
      for (size_t i = 0; i < in.size(); ++i) {
        EXPECT_VALUE(in[i], want[i]) << Name<T>();
      }
    });
  });
}

TEST_P(GlooCommunicatorTest, BatchWithEveryPeerAndOneself) {
  OnRanks(n(), [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    const int n = comm->size();
    // Rank a sends rank b (a + b) % 3 int64 (empty ones too), receives are
    // listed before the sends, two messages go to every peer.
    std::vector<std::vector<int64_t>> out(n), in(n), out2(n), in2(n);
    std::vector<P2POp> ops;
    for (int peer = 0; peer < n; ++peer) {
      in[peer].assign((peer + me) % 3, -1);
      in2[peer].assign(1, -1);
      ops.push_back(P2POp::Recv(absl::MakeSpan(in[peer]), peer));
      ops.push_back(P2POp::Recv(absl::MakeSpan(in2[peer]), peer));
    }
    for (int peer = 0; peer < n; ++peer) {
      for (int i = 0; i < (me + peer) % 3; ++i) {
        out[peer].push_back(me * 1000 + peer * 10 + i);
      }
      out2[peer] = {-(me * 1000 + peer)};
      ops.push_back(P2POp::Send(absl::MakeConstSpan(out[peer]), peer));
      ops.push_back(P2POp::Send(absl::MakeConstSpan(out2[peer]), peer));
    }
    ASSERT_TRUE(comm->batch_send_recv(ops).ok());
    for (int peer = 0; peer < n; ++peer) {
      for (int i = 0; i < (me + peer) % 3; ++i) {
        EXPECT_EQ(in[peer][i], peer * 1000 + me * 10 + i) << "from " << peer;
      }
      EXPECT_EQ(in2[peer][0], -(peer * 1000 + me)) << "from " << peer;
    }
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

TEST_P(GlooCommunicatorTest, CountsAboveIntMaxAreRefusedBeforeAnythingRuns) {
  OnRanks(n(), [&](std::shared_ptr<GlooCommunicator> comm) {
    std::vector<int32_t> buffer(4);
    const size_t huge = size_t{INT_MAX} + 1;
    absl::Status s = comm->all_reduce(buffer.data(), buffer.data(), huge,
                                      DataType::kInt32, ReduceOp::kSum);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat(INT_MAX)));
    s = comm->send(buffer.data(), huge, DataType::kInt32, 0);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_TRUE(comm->barrier().ok());  // the group is still usable
  });
}

// -- Asynchronous forms -----------------------------------------------------

// Polls `work` until it finished, at most `limit`.
bool TestUntilDone(Work& work, absl::Duration limit = kTimeout) {
  const absl::Time end = absl::Now() + limit;
  while (absl::Now() < end) {
    if (work.test()) return true;
    absl::SleepFor(absl::Microseconds(200));
  }
  return false;
}

TEST_P(GlooCommunicatorTest, AsyncOperationsRunInIssueOrder) {
  OnRanks(n(), [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    const int n = comm->size();
    // Several buckets in flight, then a blocking all_gather behind them:
    // every rank issues the same order, so they pair up.
    constexpr int kBuckets = 4;
    std::vector<std::vector<BFloat16>> buckets(kBuckets);
    std::vector<std::shared_ptr<Work>> works;
    for (int b = 0; b < kBuckets; ++b) {
      buckets[b] = Values<BFloat16>(me + b, 33);
      auto w = comm->iall_reduce(absl::MakeSpan(buckets[b]), ReduceOp::kSum);
      ASSERT_TRUE(w.ok()) << w.status();
      works.push_back(*std::move(w));
    }
    std::vector<int64_t> ids(n);
    const int64_t mine = Global(me);
    ASSERT_TRUE(
        comm->all_gather(absl::MakeConstSpan(&mine, 1), absl::MakeSpan(ids))
            .ok());
    EXPECT_THAT(ids, ElementsAreArray(GlobalRanks(n)));
    for (int b = 0; b < kBuckets; ++b) {
      ASSERT_TRUE(TestUntilDone(*works[b])) << "bucket " << b;
      EXPECT_TRUE(works[b]->status().ok()) << works[b]->status();
      for (size_t i = 0; i < buckets[b].size(); ++i) {
        double want = 0;
        for (int r = 0; r < n; ++r) want += Value<BFloat16>(r + b, i);
        EXPECT_EQ(To(buckets[b][i]), want) << "bucket " << b;
      }
    }
    // A receive from oneself is matched with the sends to oneself issued
    // before it: alone, an irecv ahead of the isend is refused at once.
    if (n == 1) {
      std::vector<float> in(2);
      auto early = comm->irecv(absl::MakeSpan(in), 0);
      EXPECT_TRUE(absl::IsFailedPrecondition(early.status())) << early.status();
      return;
    }
    // An async point-to-point ring, waited in the opposite order.
    const int next = (me + 1) % n;
    const int prev = (me + n - 1) % n;
    std::vector<float> out = {static_cast<float>(me), 0.5f};
    std::vector<float> in(2, -1);
    auto r = comm->irecv(absl::MakeSpan(in), prev);
    ASSERT_TRUE(r.ok()) << r.status();
    auto s = comm->isend(absl::MakeConstSpan(out), next);
    ASSERT_TRUE(s.ok()) << s.status();
    // The recv is queued first; the sends were posted when issued, so the
    // recv of every rank completes.
    EXPECT_TRUE((*s)->wait(absl::Now() + kTimeout).ok());
    EXPECT_TRUE((*r)->wait(absl::Now() + kTimeout).ok());
    EXPECT_THAT(in, ElementsAreArray({static_cast<float>(prev), 0.5f}));
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

TEST(GlooAsync, WorkWaitedAfterAbortIsAborted) {
  OnRanks(2, [&](std::shared_ptr<GlooCommunicator> comm) {
    if (comm->rank() == 1) {
      // Takes part in nothing: rank 0's collective cannot finish.
      absl::SleepFor(absl::Milliseconds(300));
      return;
    }
    std::vector<float> data(16, 1.0f);
    auto w = comm->iall_reduce(absl::MakeSpan(data), ReduceOp::kSum);
    ASSERT_TRUE(w.ok()) << w.status();
    comm->abort("the test stops it");
    const absl::Time start = absl::Now();
    absl::Status s = (*w)->wait(absl::Now() + absl::Seconds(20));
    EXPECT_TRUE(absl::IsAborted(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("the test stops it"));
    EXPECT_LT(absl::Now() - start, absl::Seconds(1));
    // Later operations are refused without running.
    EXPECT_TRUE(absl::IsAborted(comm->barrier()));
  }, absl::Seconds(3));
}

// A receive whose sender never sends: abort() from another thread releases
// the waiting caller at once, and the worker too (its wait is interrupted),
// so dropping the communicator does not wait for the Gloo timeout either.
TEST(GlooAsync, AbortFromAnotherThreadReleasesABlockedRecv) {
  constexpr absl::Duration kLong = absl::Seconds(20);
  OnRanks(2, [&](std::shared_ptr<GlooCommunicator> comm) {
    if (comm->rank() == 1) {
      // Stays connected and silent while rank 0 waits.
      absl::SleepFor(absl::Seconds(1));
      return;
    }
    std::vector<int32_t> in(4, -1);
    std::thread aborter([comm] {
      absl::SleepFor(absl::Milliseconds(200));
      comm->abort("stopped from another thread");
    });
    const absl::Time start = absl::Now();
    absl::Status s = comm->recv(absl::MakeSpan(in), 1);
    const absl::Duration took = absl::Now() - start;
    aborter.join();
    EXPECT_TRUE(absl::IsAborted(s)) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("stopped from another thread"));
    EXPECT_LT(took, absl::Seconds(5));
    EXPECT_GE(took, absl::Milliseconds(150));
    const absl::Time drop = absl::Now();
    comm.reset();  // joins the worker
    EXPECT_LT(absl::Now() - drop, absl::Seconds(5));
  }, kLong);
}

// A peer that destroys its communicator: the survivor's receive from it and
// its collective fail as Unavailable, long before the timeout, and the
// communicator stays broken with that code.
TEST(GlooFailure, PeerThatLeavesIsUnavailable) {
  OnRanks(2, [&](std::shared_ptr<GlooCommunicator> comm) {
    if (comm->rank() == 1) {
      absl::SleepFor(absl::Milliseconds(200));  // rank 0 is waiting
      comm.reset();
      return;
    }
    std::vector<int32_t> in(4, -1);
    const absl::Time start = absl::Now();
    absl::Status s = comm->recv(absl::MakeSpan(in), 1);
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
    absl::Status later = comm->barrier();
    EXPECT_TRUE(absl::IsUnavailable(later)) << later;
    EXPECT_THAT(std::string(later.message()), HasSubstr("broken"));
  });
}

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
