// The Gloo backend's own behaviour, run as 1, 2, 3 and 8 ranks: one thread
// per rank in this process, all rendezvousing through one MemoryStore. What
// every backend must do (every operation for every element type, splits,
// abort and deadlines) is the conformance suite's
// (tests/comm/conformance/, conformance_gloo_test); here: the Gloo context
// and prefix, exchanges with oneself, Gloo's count checks, and failures (a
// rank that never comes, a peer that leaves, a silent peer) that must end
// in an error within a bound, never a hang.

#include "vemesh/comm/gloo/gloo_communicator.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gloo/context.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/comm/internal/host_reduce.h"
#include "vemesh/rendezvous/memory_store.h"

namespace vemesh {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
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

// Sets VEMESH_GLOO_SHM while it lives (before any rank's thread starts):
// "0" keeps a group on TCP, "1" lets one host's group share memory.
class ScopedShm {
 public:
  explicit ScopedShm(const char* value) {
    if (const char* old = std::getenv("VEMESH_GLOO_SHM")) old_ = old;
    setenv("VEMESH_GLOO_SHM", value, 1);
  }
  ~ScopedShm() {
    if (old_.has_value()) {
      setenv("VEMESH_GLOO_SHM", old_->c_str(), 1);
    } else {
      unsetenv("VEMESH_GLOO_SHM");
    }
  }

 private:
  std::optional<std::string> old_;
};

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

TEST_P(GlooCommunicatorTest, ExchangeWithOneself) {
  OnRanks(n(), [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    std::vector<int64_t> out = {me, 2 * me, 3 * me};
    std::vector<int64_t> in(3, -1);
    ASSERT_TRUE(
        comm->send_recv(absl::MakeConstSpan(out), me, absl::MakeSpan(in), me)
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

// Tiny all_reduces take Gloo's bcube (log-depth) algorithm, larger ones the
// ring (gloo_internal::kLogDepthAllReduceBytes). Both must give every rank
// the same, exact result, also with fewer elements than ranks (empty chunks)
// and group sizes that are no power of two (6 = 2 x 3, 5 prime).
// Over TCP (Gloo's bcube and ring) and over one host's shared memory
// (counts up to 8192 int64 ride in the agreement round).
TEST(GlooAllReduce, TinyAndLargeAllReducesAreExactOnEveryGroupSize) {
  for (const char* shm : {"0", "1"}) {
    ScopedShm transport(shm);
    for (int n : {2, 3, 5, 6, 8}) {
      SCOPED_TRACE(absl::StrCat("VEMESH_GLOO_SHM=", shm, " n=", n));
      OnRanks(n, [&](std::shared_ptr<GlooCommunicator> comm) {
        const int me = comm->rank();
        for (size_t count : {size_t{1}, size_t{2}, size_t{3}, size_t{9},
                             size_t{512}, size_t{513}}) {
          std::vector<int64_t> sum(count), max(count), in(count);
          for (size_t i = 0; i < count; ++i) {
            sum[i] = max[i] = me * 1000 + static_cast<int64_t>(i);
            in[i] = me + 1;
          }
          std::vector<int64_t> out(count, -1);
          ASSERT_TRUE(
              comm->all_reduce(absl::MakeSpan(sum), ReduceOp::kSum).ok());
          const absl::Status maxed =
              comm->all_reduce(absl::MakeSpan(max), ReduceOp::kMax);
          ASSERT_TRUE(maxed.ok()) << maxed;
          // Input and output apart.
          ASSERT_TRUE(comm->all_reduce(in.data(), out.data(), count,
                                       DataType::kInt64, ReduceOp::kSum)
                          .ok());
          for (size_t i = 0; i < count; ++i) {
            const int64_t j = static_cast<int64_t>(i);
            ASSERT_EQ(sum[i], 1000 * n * (n - 1) / 2 + n * j)
                << "n=" << n << " count=" << count << " i=" << i;
            ASSERT_EQ(max[i], 1000 * (n - 1) + j) << "n=" << n;
            ASSERT_EQ(out[i], n * (n + 1) / 2) << "n=" << n;
          }
        }
        // all_gather and reduce_scatter, each side of the limit (64 KiB
        // in all).
        for (size_t count : {size_t{5}, size_t{8192} / n, size_t{8193}}) {
          std::vector<int64_t> all(count * n, -1), mine(count);
          for (size_t i = 0; i < count; ++i) mine[i] = me * 10 + i;
          const absl::Status gathered = comm->all_gather(
              mine.data(), all.data(), count, DataType::kInt64);
          ASSERT_TRUE(gathered.ok()) << gathered;
          for (int r = 0; r < n; ++r) {
            ASSERT_EQ(all[r * count + count - 1],
                      r * 10 + static_cast<int64_t>(count) - 1)
                << "n=" << n << " count=" << count;
          }
          std::vector<int64_t> block(count, -1);
          ASSERT_TRUE(comm->reduce_scatter(all.data(), block.data(), count,
                                           DataType::kInt64, ReduceOp::kSum)
                          .ok());
          // Every rank passed the same gathered vector: n times it.
          ASSERT_EQ(block[count - 1],
                    n * (me * 10 + static_cast<int64_t>(count) - 1))
              << "n=" << n << " count=" << count;
        }
        // A broadcast on each side of the shared-memory limit (64 KiB).
        for (size_t count : {size_t{7}, size_t{16384}, size_t{16385}}) {
          const int root = n - 1;
          std::vector<float> data(count, me == root ? 2.5f : -1.0f);
          ASSERT_TRUE(comm->broadcast(absl::MakeSpan(data), root).ok());
          ASSERT_EQ(data[0], 2.5f) << "n=" << n << " count=" << count;
          ASSERT_EQ(data[count - 1], 2.5f) << "n=" << n << " count=" << count;
        }
      });
    }
  }
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

// Issue 29: ranks whose all_reduce or broadcast counts differed crashed
// the receiver (SIGABRT on Gloo's I/O thread), and a broadcast into a larger
// buffer returned OK with 600 of 1000 elements never written. Now every
// rank gets InvalidArgument naming both, and the group stays usable.
// Rank 1 passes something else than every other rank.
void MismatchesAreInvalidArgumentOnEveryRank(int n) {
  std::atomic<int> invalid{0};
  OnRanks(n, [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank() == 1 ? 1 : 0;  // rank 1, or like rank 0
    auto expect_invalid = [&](absl::Status s, absl::string_view what) {
      EXPECT_TRUE(absl::IsInvalidArgument(s)) << "rank " << me << ": " << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr(what)) << "rank " << me;
      if (absl::IsInvalidArgument(s)) ++invalid;
    };
    // all_reduce: 1000 elements against 400.
    std::vector<float> data(me == 0 ? 1000 : 400, 1.0f);
    expect_invalid(comm->all_reduce(absl::MakeSpan(data), ReduceOp::kSum),
                   "rank 1 has all_reduce of 400 float32 (op sum), rank 0 "
                   "has all_reduce of 1000 float32 (op sum)");
    // Larger than a shared-memory slot (chunked rounds on one host)
    // against one that fits, and two large ones of other lengths (other
    // round counts): refused in the first round, nothing written.
    std::vector<float> big(me == 0 ? 40000 : 400, 2.0f);
    expect_invalid(comm->all_reduce(absl::MakeSpan(big), ReduceOp::kSum),
                   "rank 1 has all_reduce of 400 float32 (op sum), rank 0 "
                   "has all_reduce of 40000 float32 (op sum)");
    std::vector<float> longer(me == 0 ? 40000 : 50000, 2.0f);
    expect_invalid(comm->all_reduce(absl::MakeSpan(longer), ReduceOp::kSum),
                   "rank 1 has all_reduce of 50000 float32");
    for (const std::vector<float>* v : {&big, &longer}) {
      EXPECT_TRUE(
          std::all_of(v->begin(), v->end(), [](float x) { return x == 2.0f; }))
          << "rank " << me << ": a refused all_reduce wrote its output";
    }
    // broadcast from a root of 400 into a buffer of 1000.
    std::vector<int32_t> block(me == 0 ? 400 : 1000, me == 0 ? 7 : -1);
    expect_invalid(comm->broadcast(absl::MakeSpan(block), 0),
                   "broadcast of 1000 int32 (root 0)");
    // The same bytes, another type.
    std::vector<int32_t> ints(8, 1);
    std::vector<float> floats(8, 1.0f);
    expect_invalid(
        me == 0 ? comm->all_reduce(absl::MakeSpan(ints), ReduceOp::kSum)
                : comm->all_reduce(absl::MakeSpan(floats), ReduceOp::kSum),
        "rank 1 has all_reduce of 8 float32");
    // Another reduce op, another root, another collective.
    expect_invalid(comm->all_reduce(absl::MakeSpan(floats),
                                    me == 0 ? ReduceOp::kSum : ReduceOp::kMax),
                   "op max");
    expect_invalid(comm->broadcast(absl::MakeSpan(floats), me), "root 1");
    expect_invalid(
        me == 0 ? comm->barrier()
                : comm->all_reduce(absl::MakeSpan(floats), ReduceOp::kSum),
        "rank 0 has barrier");
    // all_to_all_v: rank 0 sends 3 to rank 1, which expects 2.
    if (n != 2) return;
    std::vector<float> send(4, 1.0f), recv(me == 0 ? 3 : 4);
    const std::vector<size_t> sends =
        me == 0 ? std::vector<size_t>{1, 3} : std::vector<size_t>{2, 2};
    const std::vector<size_t> recvs =
        me == 0 ? std::vector<size_t>{1, 2} : std::vector<size_t>{2, 2};
    expect_invalid(comm->all_to_all_v(absl::MakeConstSpan(send), sends,
                                      absl::MakeSpan(recv), recvs),
                   "rank 0 sends 3 elements to rank 1, which expects 2");
    // Nothing broke: a matching all_reduce works.
    std::vector<float> ones(1000, 1.0f);
    ASSERT_TRUE(comm->all_reduce(absl::MakeSpan(ones), ReduceOp::kSum).ok());
    EXPECT_EQ(ones[999], static_cast<float>(n));
  });
  EXPECT_EQ(invalid.load(), n == 2 ? 2 * 9 : n * 8);
}

TEST(GlooMismatch, CountTypeOpAndRootMismatchesAreInvalidArgumentOnEveryRank) {
  MismatchesAreInvalidArgumentOnEveryRank(2);
}

// The same verdicts whatever carries the check: TCP (log-depth rounds of
// the smallest and largest summary, 3 at 5 ranks) or shared memory (one
// round), with the odd rank neither first nor last.
TEST(GlooMismatch, SameVerdictsOverTcpAndSharedMemory) {
  for (const char* shm : {"0", "1"}) {
    ScopedShm transport(shm);
    SCOPED_TRACE(absl::StrCat("VEMESH_GLOO_SHM=", shm));
    MismatchesAreInvalidArgumentOnEveryRank(5);
  }
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

// A receive from oneself is matched with the sends to oneself issued before
// it: alone, an irecv ahead of the isend could only hang, so it is refused
// at once. (The suite posts the send to oneself first.)
TEST(GlooAsync, EarlyIrecvFromOneselfIsRefused) {
  OnRanks(1, [&](std::shared_ptr<GlooCommunicator> comm) {
    std::vector<float> in(2);
    auto early = comm->irecv(absl::MakeSpan(in), 0);
    EXPECT_TRUE(absl::IsFailedPrecondition(early.status())) << early.status();
    EXPECT_TRUE(comm->barrier().ok());
  });
}

// -- Failures end in bounded time -------------------------------------------

bool IsTimeoutOrLost(const absl::Status& s) {
  return absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s);
}

TEST(GlooFailure, RankThatNeverComesTimesOutCreate) {
  // Either rank alone waits for the other's addresses and gives up at the
  // timeout, naming the rank that never came.
  for (int rank : {0, 1}) {
    auto store = std::make_shared<MemoryStore>();
    const absl::Time start = absl::Now();
    auto comm = GlooCommunicator::Create(store, "lonely", rank, 2,
                                         GlobalRanks(2), absl::Seconds(1));
    const absl::Duration took = absl::Now() - start;
    ASSERT_FALSE(comm.ok()) << "rank " << rank;
    EXPECT_TRUE(absl::IsDeadlineExceeded(comm.status())) << comm.status();
    EXPECT_THAT(
        std::string(comm.status().message()),
        HasSubstr(absl::StrCat("peer rank(s) ", 1 - rank, " (global rank ",
                               GlobalRanks(2)[1 - rank], ")")));
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
    auto comm =
        GlooCommunicator::Create(store, "silent", 1, 2, GlobalRanks(2), kShort);
    ASSERT_TRUE(comm.ok()) << comm.status();
    // Holds its end open without taking part, until rank 0 gave up.
    const absl::Time limit = absl::Now() + absl::Seconds(15);
    while (!done.load() && absl::Now() < limit) {
      absl::SleepFor(absl::Milliseconds(10));
    }
  });
  auto comm =
      GlooCommunicator::Create(store, "silent", 0, 2, GlobalRanks(2), kShort);
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
    EXPECT_TRUE(IsTimeoutOrLost(results[r]))
        << "rank " << r << ": " << results[r];
    EXPECT_LT(took[r], absl::Seconds(10)) << "rank " << r;
  }
}

// Once a group shares memory its waits no longer read the TCP pairs: a
// rank that destroys or aborts its communicator marks its slot, and the
// others' waits end at their next look (about a millisecond), not at the
// group's 30 s timeout. (A rank whose process dies is seen by its pid:
// tests/python/mp_shm_rank_death.py.)
TEST(GlooShm, PeerLeavingEndsTheOthersWaitsAtOnce) {
  ScopedShm transport("1");
  for (bool abort : {false, true}) {
    constexpr int n = 4;
    std::vector<absl::Status> results(n);
    std::vector<absl::Duration> took(n);
    OnRanks(n, [&](std::shared_ptr<GlooCommunicator> comm) {
      const int me = comm->rank();
      std::vector<float> data(16, 1.0f);
      ASSERT_TRUE(comm->all_reduce(absl::MakeSpan(data), ReduceOp::kSum).ok());
      if (me == 0) {
        absl::SleepFor(absl::Milliseconds(300));  // the others are waiting
        if (abort) {
          comm->abort("rank 0 stops");
        } else {
          comm.reset();
        }
        return;
      }
      const absl::Time start = absl::Now();
      results[me] = comm->all_reduce(absl::MakeSpan(data), ReduceOp::kSum);
      took[me] = absl::Now() - start;
    });
    for (int r = 1; r < n; ++r) {
      EXPECT_TRUE(absl::IsUnavailable(results[r]))
          << "abort=" << abort << " rank " << r << ": " << results[r];
      EXPECT_THAT(std::string(results[r].message()),
                  HasSubstr("rank 0 left the group"));
      EXPECT_LT(took[r], absl::Seconds(10)) << "rank " << r;
    }
  }
}

// Ranks that wait in a shared-memory round for a late rank sleep (after
// a spin of about 2 ms) instead of spinning for as long as it is late:
// the late rank gets the CPU it needs. Before, 7 ranks spun for the whole
// 600 ms (launch.readme.elastic: mpirun pins a DP group's members to one
// core, and a joiner whose mates spun missed its epoch's rounds for 3 s).
// The process's CPU time over the wait is the user-visible measure.
TEST(GlooShm, RanksWaitingForALateRankSleep) {
  ScopedShm transport("1");
  constexpr int n = 8;
  constexpr absl::Duration kLate = absl::Milliseconds(600);
  absl::Duration cpu_while_late;
  std::vector<absl::Status> results(n);
  OnRanks(n, [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    std::vector<float> data(16, 1.0f);
    ASSERT_TRUE(comm->all_reduce(absl::MakeSpan(data), ReduceOp::kSum).ok());
    if (me == 0) {
      timespec before, after;
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &before);
      absl::SleepFor(kLate);  // the others wait in the next round
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &after);
      cpu_while_late = absl::DurationFromTimespec(after) -
                       absl::DurationFromTimespec(before);
    }
    std::fill(data.begin(), data.end(), static_cast<float>(me));
    results[me] = comm->all_reduce(absl::MakeSpan(data), ReduceOp::kSum);
    EXPECT_EQ(data[0], n * (n - 1) / 2) << "rank " << me;
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(results[r].ok()) << results[r];
  // Spinning, 7 waiters burn every core there is for the whole 600 ms;
  // asleep they use a few milliseconds (a pid probe every 5 ms each).
  EXPECT_LT(cpu_while_late, kLate / 2)
      << "the waiting ranks used " << cpu_while_late << " of CPU";
}

// -- Point to point through shared memory (issue 46, item 3) ---------------

// The values rank `from` sends as its message `i` of `count` elements.
std::vector<int32_t> Message(int from, int i, size_t count) {
  std::vector<int32_t> m(count);
  for (size_t k = 0; k < count; ++k) m[k] = from * 1000003 + i * 1009 + int(k);
  return m;
}

// Each rank sends to the next and receives from the previous, in batches
// (a Gloo worker waits for its TCP sends): a message before the segment is
// set up (TCP), then messages of every size (empty, wrapping around the
// ring, larger than the ring: TCP), then more than a pair's descriptors
// ahead of the receiver (the pair closes to TCP), then more. The same
// values arrive over TCP and over shared memory.
TEST(GlooShmP2P, MessagesArriveAlikeOverTcpAndSharedMemory) {
  for (const char* transport : {"0", "1"}) {
    ScopedShm shm(transport);
    constexpr int n = 4;
    OnRanks(n, [&](std::shared_ptr<GlooCommunicator> comm) {
      const int me = comm->rank();
      const int next = (me + 1) % n, prev = (me + n - 1) % n;
      int sent_so_far = 0;
      // One batch: a message of each of `counts` to the next rank, and as
      // many from the previous one, checked.
      auto exchange = [&](const std::vector<size_t>& counts) {
        std::vector<std::vector<int32_t>> out, in;
        std::vector<P2POp> ops;
        for (size_t j = 0; j < counts.size(); ++j) {
          out.push_back(Message(me, sent_so_far + int(j), counts[j]));
          in.emplace_back(counts[j], -1);
        }
        for (auto& m : out) ops.push_back(P2POp::Send(m, next));
        for (auto& m : in) ops.push_back(P2POp::Recv(m, prev));
        absl::Status s = comm->batch_send_recv(ops);
        ASSERT_TRUE(s.ok()) << "transport " << transport << ": " << s;
        for (size_t j = 0; j < counts.size(); ++j) {
          EXPECT_EQ(in[j], Message(prev, sent_so_far + int(j), counts[j]))
              << "transport " << transport << " message " << sent_so_far + j;
        }
        sent_so_far += int(counts.size());
      };
      exchange({5});  // before the group's first collective: TCP
      ASSERT_TRUE(comm->barrier().ok());
      for (int round = 0; round < 6; ++round) {  // wraps around the ring
        exchange({0, 1, 4000, 7, 16000, 40000, 3, 2});
      }
      std::vector<size_t> ahead(300);  // far ahead of the receiver
      for (size_t k = 0; k < ahead.size(); ++k) ahead[k] = k % 3;
      exchange(ahead);
      exchange({100, 20000});  // the pair closed to TCP
      EXPECT_TRUE(comm->barrier().ok());
    });
  }
}

// A receive of the wrong length over shared memory: InvalidArgument naming
// both counts on the receiver, the stream in step for the next message,
// the sender's send fine (as over TCP), the group usable.
TEST(GlooShmP2P, LengthMismatchIsInvalidArgumentAndTheStreamStaysInStep) {
  ScopedShm shm("1");
  OnRanks(2, [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    ASSERT_TRUE(comm->barrier().ok());  // the segment is set up
    std::vector<int32_t> three = {1, 2, 3}, four = {4, 5, 6, 7};
    std::vector<int32_t> big(30000, 8);  // by TCP: larger than the ring
    if (me == 0) {
      EXPECT_TRUE(comm->send(absl::MakeConstSpan(three), 1).ok());
      EXPECT_TRUE(comm->send(absl::MakeConstSpan(big), 1).ok());
      EXPECT_TRUE(comm->send(absl::MakeConstSpan(four), 1).ok());
    } else {
      std::vector<int32_t> got(4);
      absl::Status s = comm->recv(absl::MakeSpan(got), 0);
      EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
      EXPECT_EQ(s.message(), "recv expected 4 elements from rank 0 but got 3");
      std::vector<int32_t> small(2);
      s = comm->recv(absl::MakeSpan(small), 0);
      EXPECT_EQ(s.message(),
                "recv expected 2 elements from rank 0 but got 30000");
      s = comm->recv(absl::MakeSpan(got), 0);
      EXPECT_TRUE(s.ok()) << s;
      EXPECT_EQ(got, four);
    }
    EXPECT_TRUE(comm->barrier().ok());
  });
}

// A rank that leaves (destroys or aborts its communicator) while its peer
// waits in a receive over shared memory: the receive fails naming it well
// before the group's 30 s timeout. (A process that dies: its pid,
// tests/python/mp_shm_rank_death.py p2p.)
TEST(GlooShmP2P, PeerLeavingEndsAReceiveAtOnce) {
  ScopedShm shm("1");
  for (bool abort : {false, true}) {
    absl::Status result;
    absl::Status sent;
    absl::Duration took;
    OnRanks(2, [&](std::shared_ptr<GlooCommunicator> comm) {
      ASSERT_TRUE(comm->barrier().ok());
      if (comm->rank() == 0) {
        absl::SleepFor(absl::Milliseconds(300));  // rank 1 is waiting
        if (abort) {
          comm->abort("rank 0 stops");
        } else {
          comm.reset();
        }
        return;
      }
      std::vector<float> data(16);
      const absl::Time start = absl::Now();
      result = comm->recv(absl::MakeSpan(data), 0);
      took = absl::Now() - start;
      // A send to the rank that left fails too (as on its closed TCP
      // connection), though its ring has room.
      sent = comm->send(absl::MakeConstSpan(data), 0);
    });
    EXPECT_TRUE(absl::IsUnavailable(result))
        << "abort=" << abort << ": " << result;
    EXPECT_THAT(std::string(result.message()),
                HasSubstr("rank 0 left the group"));
    EXPECT_LT(took, absl::Seconds(10));
    EXPECT_TRUE(absl::IsUnavailable(sent)) << "abort=" << abort << ": " << sent;
    EXPECT_THAT(std::string(sent.message()),
                ::testing::AllOf(HasSubstr("(shared memory)"),
                                 HasSubstr("rank 0 left the group")));
  }
}

TEST(GlooFailure, PeerLeavesMidCollectiveOfTwo) { PeerLeavesMidCollective(2); }
TEST(GlooFailure, PeerLeavesMidCollectiveOfFour) { PeerLeavesMidCollective(4); }

TEST(GlooAsync, WorkWaitedAfterAbortIsAborted) {
  OnRanks(
      2,
      [&](std::shared_ptr<GlooCommunicator> comm) {
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
        // Within the group's timeout (3 s) and a margin, never the wait's
        // 20 s: an abort that comes before the worker enters Gloo's wait
        // ends it at once, but one that comes after ends it only at the
        // Gloo timeout (OnAbort's comment; under TSan the worker is often
        // already waiting).
        EXPECT_LT(absl::Now() - start, absl::Seconds(3) + absl::Seconds(2));
        // Later operations are refused without running.
        EXPECT_TRUE(absl::IsAborted(comm->barrier()));
      },
      absl::Seconds(3));
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

// -- Large operations through the segment, in chunks ------------------------

// An input that every rank can rebuild for any rank: finite floats of
// either sign between 0.5 and 2 (no overflow in a product of 8), any bits
// for integers (sums and products wrap alike on every path).
std::vector<char> LargeInput(DataType type, size_t count, int rank,
                             uint32_t seed) {
  std::mt19937 random(seed * 131 + static_cast<uint32_t>(rank));
  std::vector<char> out(count * SizeOf(type));
  for (size_t i = 0; i < count; ++i) {
    const uint32_t bits = random();
    const float f = (bits & 1 ? -1.0f : 1.0f) *
                    (0.5f + 1.5f * static_cast<float>(bits >> 8) / (1 << 24));
    char* at = out.data() + i * SizeOf(type);
    switch (type) {
      case DataType::kFloat32:
        std::memcpy(at, &f, 4);
        break;
      case DataType::kFloat64: {
        const double d = f + static_cast<double>(bits % 1000) * 1e-10;
        std::memcpy(at, &d, 8);
        break;
      }
      case DataType::kBFloat16: {  // sign, exponent of 0.5..2, mantissa
        const uint16_t h = static_cast<uint16_t>((bits & 1) << 15 |
                                                 (126 + (bits >> 1) % 2) << 7 |
                                                 (bits >> 4) % 128);
        std::memcpy(at, &h, 2);
        break;
      }
      case DataType::kFloat16: {
        const uint16_t h = static_cast<uint16_t>((bits & 1) << 15 |
                                                 (14 + (bits >> 1) % 2) << 10 |
                                                 (bits >> 4) % 1024);
        std::memcpy(at, &h, 2);
        break;
      }
      default: {
        const uint64_t wide = uint64_t{bits} << 32 | random();
        std::memcpy(at, &wide, SizeOf(type));
      }
    }
  }
  return out;
}

double ElementAsDouble(DataType type, const char* data, size_t i) {
  const char* at = data + i * SizeOf(type);
  switch (type) {
    case DataType::kFloat32: {
      float f;
      std::memcpy(&f, at, 4);
      return f;
    }
    case DataType::kFloat64: {
      double d;
      std::memcpy(&d, at, 8);
      return d;
    }
    case DataType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, at, 2);
      const uint32_t bits = uint32_t{h} << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case DataType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, at, 2);
      const int e = (h >> 10) & 31;
      const double m = e == 0 ? (h & 1023) / 1024.0 : 1 + (h & 1023) / 1024.0;
      return (h >> 15 ? -1 : 1) * std::ldexp(m, e == 0 ? -14 : e - 15);
    }
    default:
      return 0;  // integers are compared bit for bit
  }
}

struct LargeCase {
  DataType type;
  ReduceOp op;
  size_t count;
  uint32_t seed;
  std::vector<char> expected;  // the one-process result
};

// Every dtype and op the TCP path supports (avg: floating point), at 64 KiB + 1
// element and at an odd count of several chunks; float32 sum also at 3 MiB +
// 5 elements.
std::vector<LargeCase> LargeCases(int n) {
  std::vector<LargeCase> cases;
  uint32_t seed = 0;
  for (DataType type :
       {DataType::kFloat32, DataType::kFloat64, DataType::kInt32,
        DataType::kInt64, DataType::kBFloat16, DataType::kFloat16,
        DataType::kInt8, DataType::kUInt8}) {
    const size_t width = SizeOf(type);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin,
                        ReduceOp::kMax, ReduceOp::kAvg}) {
      if (op == ReduceOp::kAvg && !IsFloatingPoint(type)) continue;
      for (size_t count : {65536 / width + 1, 150001 / width | 1}) {
        cases.push_back({type, op, count, ++seed, {}});
      }
    }
    if (type == DataType::kFloat32) {
      cases.push_back(
          {type, ReduceOp::kSum, (size_t{3} << 20) / width + 5, ++seed, {}});
    }
  }
  // The one-process computation: rank 0's input combined with rank 1's,
  // then rank 2's, ... (the order the segment's owner of each element
  // uses), an avg's sum then divided.
  for (LargeCase& c : cases) {
    c.expected = LargeInput(c.type, c.count, 0, c.seed);
    const HostCombineFn combine = HostCombiner(c.type, c.op);
    for (int r = 1; r < n; ++r) {
      const std::vector<char> in = LargeInput(c.type, c.count, r, c.seed);
      combine(c.expected.data(), c.expected.data(), in.data(), c.count);
    }
    if (c.op == ReduceOp::kAvg)
      HostDivide(c.expected.data(), c.count, c.type, n);
  }
  return cases;
}

// An all_reduce larger than a slot runs through the segment in chunks,
// each element reduced by one rank in rank order: every rank gets the
// same bits, those of the one-process computation in rank order. Over TCP
// (Gloo's ring) integers, min and max are the same exactly, sums and
// products within floating-point reassociation.
TEST(GlooShmChunked, LargeAllReducesAreBitIdenticalOnEveryRankAndMatchTcp) {
  for (int n : {3, 8}) {
    const std::vector<LargeCase> cases = LargeCases(n);
    for (const char* shm : {"1", "0"}) {
      ScopedShm transport(shm);
      OnRanks(n, [&](std::shared_ptr<GlooCommunicator> comm) {
        const int me = comm->rank();
        for (size_t i = 0; i < cases.size(); ++i) {
          const LargeCase& c = cases[i];
          SCOPED_TRACE(absl::StrCat("VEMESH_GLOO_SHM=", shm, " n=", n, " ",
                                    DataTypeName(c.type), " ",
                                    ReduceOpName(c.op), " count=", c.count));
          std::vector<char> data = LargeInput(c.type, c.count, me, c.seed);
          std::vector<char> out(data.size());
          // In place for the sums, input and output apart for the rest.
          const bool in_place = c.op == ReduceOp::kSum;
          const absl::Status s =
              in_place ? comm->all_reduce(data.data(), data.data(), c.count,
                                          c.type, c.op)
                       : comm->all_reduce(data.data(), out.data(), c.count,
                                          c.type, c.op);
          ASSERT_TRUE(s.ok()) << s;
          const std::vector<char>& got = in_place ? data : out;
          const bool exact = shm[0] == '1' || !IsFloatingPoint(c.type) ||
                             c.op == ReduceOp::kMin || c.op == ReduceOp::kMax;
          if (exact) {
            ASSERT_TRUE(got == c.expected) << "rank " << me;
            continue;
          }
          const double tol = c.type == DataType::kFloat64   ? 1e-12
                             : c.type == DataType::kFloat32 ? 1e-5
                             : c.type == DataType::kFloat16 ? 4e-3
                                                            : 4e-2;
          for (size_t j = 0; j < c.count; ++j) {
            const double a = ElementAsDouble(c.type, got.data(), j);
            const double b = ElementAsDouble(c.type, c.expected.data(), j);
            ASSERT_LE(std::abs(a - b), tol * (2 * n + std::abs(b)))
                << "rank " << me << " element " << j;
          }
        }
      });
    }
  }
}

// broadcast, all_gather and reduce_scatter larger than a slot, in chunks,
// at odd counts; a reduce_scatter's block is combined in rank order on
// both transports: the bits of the one-process computation.
TEST(GlooShmChunked, LargeBroadcastsAllGathersAndReduceScatters) {
  for (const char* shm : {"1", "0"}) {
    ScopedShm transport(shm);
    for (int n : {2, 5}) {
      SCOPED_TRACE(absl::StrCat("VEMESH_GLOO_SHM=", shm, " n=", n));
      OnRanks(n, [&](std::shared_ptr<GlooCommunicator> comm) {
        const int me = comm->rank();
        for (size_t count : {size_t{65537}, (size_t{3} << 20) + 1}) {
          const int root = n - 1;
          std::vector<char> data =
              me == root ? LargeInput(DataType::kInt8, count, root, 7)
                         : std::vector<char>(count, 0);
          ASSERT_TRUE(
              comm->broadcast(data.data(), count, DataType::kInt8, root).ok());
          ASSERT_TRUE(data == LargeInput(DataType::kInt8, count, root, 7))
              << "count=" << count << " rank " << me;
        }
        const size_t count = 9001;  // float64: 72 KiB a rank
        const size_t block = count * 8;
        std::vector<char> all(block * n);
        const std::vector<char> mine =
            LargeInput(DataType::kFloat64, count, me, 9);
        ASSERT_TRUE(
            comm->all_gather(mine.data(), all.data(), count, DataType::kFloat64)
                .ok());
        for (int r = 0; r < n; ++r) {
          const std::vector<char> theirs =
              LargeInput(DataType::kFloat64, count, r, 9);
          ASSERT_EQ(std::memcmp(all.data() + r * block, theirs.data(), block),
                    0)
              << "block " << r;
        }
        for (DataType type : {DataType::kFloat32, DataType::kFloat16}) {
          const ReduceOp op =
              type == DataType::kFloat16 ? ReduceOp::kAvg : ReduceOp::kSum;
          const size_t width = SizeOf(type);
          const size_t count = 20001;  // a rank's block
          const std::vector<char> in =
              LargeInput(type, count * n, me, 11 + width);
          std::vector<char> got(count * width);
          ASSERT_TRUE(
              comm->reduce_scatter(in.data(), got.data(), count, type, op)
                  .ok());
          std::vector<char> expected(count * width);
          const HostCombineFn combine = HostCombiner(type, op);
          for (int r = 0; r < n; ++r) {
            const std::vector<char> theirs =
                LargeInput(type, count * n, r, 11 + width);
            const char* mine = theirs.data() + me * count * width;
            if (r == 0) {
              std::memcpy(expected.data(), mine, count * width);
            } else {
              combine(expected.data(), expected.data(), mine, count);
            }
          }
          if (op == ReduceOp::kAvg) HostDivide(expected.data(), count, type, n);
          ASSERT_TRUE(got == expected) << DataTypeName(type) << " rank " << me;
        }
      });
    }
  }
}

// A rank that leaves while the others are inside a large all_reduce ends
// their waits at once, as in a one-round operation (a rank whose process
// dies mid-operation: tests/python/mp_shm_rank_death.py large).
TEST(GlooShmChunked, PeerLeavingEndsALargeAllReduceAtOnce) {
  ScopedShm transport("1");
  constexpr int n = 3;
  std::vector<absl::Status> results(n);
  std::vector<absl::Duration> took(n);
  OnRanks(n, [&](std::shared_ptr<GlooCommunicator> comm) {
    const int me = comm->rank();
    // 128 MiB: over two thousand rounds, far more than the 10 ms below.
    std::vector<float> data(32 << 20, 1.0f);
    ASSERT_TRUE(comm->barrier().ok());
    const absl::Time start = absl::Now();
    if (me == 0) {
      // Aborted from the calling thread while the worker is inside the
      // rounds (no TCP to close under it).
      auto w = comm->iall_reduce(absl::MakeSpan(data), ReduceOp::kSum);
      ASSERT_TRUE(w.ok()) << w.status();
      absl::SleepFor(absl::Milliseconds(10));
      comm->abort("rank 0 stops");
      results[me] = (*w)->wait(absl::Now() + absl::Seconds(30));
    } else {
      results[me] = comm->all_reduce(absl::MakeSpan(data), ReduceOp::kSum);
    }
    took[me] = absl::Now() - start;
  });
  EXPECT_TRUE(absl::IsAborted(results[0])) << results[0];
  EXPECT_LT(took[0], absl::Seconds(10));
  for (int r = 1; r < n; ++r) {
    EXPECT_TRUE(absl::IsUnavailable(results[r]))
        << "rank " << r << ": " << results[r];
    EXPECT_THAT(std::string(results[r].message()),
                HasSubstr("rank 0 left the group"));
    EXPECT_LT(took[r], absl::Seconds(10)) << "rank " << r;
  }
}

}  // namespace
}  // namespace vemesh
