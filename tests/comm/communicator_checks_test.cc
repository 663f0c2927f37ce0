// The checks and the Work of the Communicator base class, with no backend:
// a recording communicator stands in, so every misuse is proven once here
// for every backend (each backend's own test proves its operations).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/comm/communicator.h"

namespace vemesh {
namespace {

using ::testing::HasSubstr;

// A Work that finishes when the test says so.
class ManualWork final : public Work {
 public:
  ManualWork(std::shared_ptr<Communicator> owner, std::string name,
             std::shared_ptr<std::atomic<bool>> done)
      : Work(std::move(owner), std::move(name)), done_(std::move(done)) {}

 protected:
  std::optional<absl::Status> Poll() override {
    if (done_->load()) return absl::OkStatus();
    return std::nullopt;
  }

 private:
  std::shared_ptr<std::atomic<bool>> done_;
};

// Rank `rank` of a group of `size` whose global ranks are 10, 20, 30, ...
// It records the last operation it was asked to start; its operations
// finish when `finish` is set.
class Recording final : public Communicator {
 public:
  Recording(int rank, int size, size_t max_count = 1u << 20)
      : rank_(rank), max_count_(max_count) {
    for (int i = 0; i < size; ++i) ranks_.push_back(10 * (i + 1));
  }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  absl::Span<const int> ranks() const override { return ranks_; }
  absl::string_view backend() const override { return "recording"; }
  absl::StatusOr<std::shared_ptr<Communicator>> split(int, int) override {
    return absl::UnimplementedError("no split");
  }
  NativeHandle native_handle() const override { return {"recording", nullptr}; }

  std::optional<Operation> last;
  int started = 0;
  int aborts = 0;
  std::shared_ptr<std::atomic<bool>> finish =
      std::make_shared<std::atomic<bool>>(true);

 protected:
  WorkOr Start(const Operation& op) override {
    last = op;
    ++started;
    return std::make_shared<ManualWork>(Self(), op.Describe(), finish);
  }
  size_t MaxCount() const override { return max_count_; }
  void OnAbort() override { ++aborts; }

 private:
  int rank_;
  size_t max_count_;
  std::vector<int> ranks_;
};

std::shared_ptr<Recording> Group(int rank = 1, int size = 4) {
  return std::make_shared<Recording>(rank, size);
}

void ExpectInvalid(const absl::Status& s, const std::string& text) {
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(text));
}

TEST(CommunicatorChecks, NullBufferIsRefusedByName) {
  auto c = Group();
  float x[4];
  ExpectInvalid(
      c->all_reduce(nullptr, x, 4, DataType::kFloat32, ReduceOp::kSum),
      "all_reduce: the send buffer is null for 4 elements");
  ExpectInvalid(c->broadcast(nullptr, 3, DataType::kInt8, 0),
                "broadcast: the data buffer is null for 3 elements");
  ExpectInvalid(c->send(nullptr, 2, DataType::kFloat16, 0),
                "send: the send buffer is null for 2 elements");
  EXPECT_EQ(c->started, 0) << "nothing reaches the backend";
  // A null buffer of zero elements is fine.
  EXPECT_TRUE(
      c->all_reduce(nullptr, nullptr, 0, DataType::kFloat32, ReduceOp::kSum)
          .ok());
}

// Integer element types map by width and signedness, whatever their
// spelling: a buffer of `long long` reaches the backend as int64.
static_assert(DataTypeOf<long long>() == DataType::kInt64);
static_assert(DataTypeOf<long>() == DataType::kInt64);
static_assert(DataTypeOf<int>() == DataType::kInt32);
static_assert(DataTypeOf<signed char>() == DataType::kInt8);
static_assert(DataTypeOf<unsigned char>() == DataType::kUInt8);
static_assert(DataTypeOf<const long long>() == DataType::kInt64);
static_assert(DataTypeOf<const float>() == DataType::kFloat32);

TEST(CommunicatorChecks, IntegerTypesOfEveryNameAreCarried) {
  auto c = Group();
  std::vector<long long> wide(5, 1);
  ASSERT_TRUE(c->all_reduce(absl::MakeSpan(wide), ReduceOp::kSum).ok());
  ASSERT_TRUE(c->last.has_value());
  EXPECT_EQ(c->last->type, DataType::kInt64);
  EXPECT_EQ(c->last->count, 5u);
  std::vector<int> narrow(3, 1);
  ASSERT_TRUE(c->all_reduce(absl::MakeSpan(narrow), ReduceOp::kMax).ok());
  EXPECT_EQ(c->last->type, DataType::kInt32);
}

TEST(CommunicatorChecks, RootAndPeerOutsideTheGroup) {
  auto c = Group();
  float x[4] = {};
  ExpectInvalid(c->broadcast(x, 4, DataType::kFloat32, 4),
                "broadcast: root 4 is outside the group of 4 ranks (0..3)");
  ExpectInvalid(c->reduce(x, x, 4, DataType::kFloat32, ReduceOp::kSum, -1),
                "reduce: root -1 is outside the group of 4 ranks");
  ExpectInvalid(c->send(x, 4, DataType::kFloat32, 7),
                "send: dest 7 is outside the group of 4 ranks");
  ExpectInvalid(c->recv(x, 4, DataType::kFloat32, -2),
                "recv: source -2 is outside the group");
  ExpectInvalid(c->send_recv(x, 1, 0, x + 1, 1, 9, DataType::kFloat32),
                "send_recv: source 9 is outside the group");
  EXPECT_EQ(c->started, 0);
}

TEST(CommunicatorChecks, OverlappingBuffers) {
  auto c = Group();
  std::vector<float> x(64);
  // In place (the same pointer) is allowed for all_reduce...
  EXPECT_TRUE(
      c->all_reduce(x.data(), x.data(), 8, DataType::kFloat32, ReduceOp::kSum)
          .ok());
  // ...but a shifted overlap is not.
  ExpectInvalid(c->all_reduce(x.data(), x.data() + 4, 8, DataType::kFloat32,
                              ReduceOp::kSum),
                "overlap without being the same buffer");
  ExpectInvalid(c->all_gather(x.data(), x.data(), 4, DataType::kFloat32),
                "all_gather: the send and recv buffers overlap");
  ExpectInvalid(c->all_to_all(x.data(), x.data() + 8, 4, DataType::kFloat32),
                "all_to_all: the send and recv buffers overlap");
  std::vector<P2POp> batch = {
      P2POp::Recv(x.data(), 8, DataType::kFloat32, 0),
      P2POp::Send(x.data() + 4, 8, DataType::kFloat32, 2)};
  ExpectInvalid(
      c->batch_send_recv(batch),
      "the recv buffer of transfer 0 overlaps the buffer of transfer 1");
}

TEST(CommunicatorChecks, AverageNeedsAFloatingPointType) {
  auto c = Group();
  int32_t x[2] = {};
  ExpectInvalid(
      c->all_reduce(absl::MakeSpan(x), ReduceOp::kAvg),
      "all_reduce: ReduceOp avg needs a floating-point type; got int32");
  BFloat16 h[2];
  EXPECT_TRUE(c->all_reduce(absl::MakeSpan(h), ReduceOp::kAvg).ok());
  EXPECT_EQ(c->last->type, DataType::kBFloat16);
  EXPECT_EQ(c->last->op, ReduceOp::kAvg);
}

TEST(CommunicatorChecks, UnknownEnumsAreRefused) {
  auto c = Group();
  float x[2] = {};
  ExpectInvalid(
      c->all_reduce(x, x, 2, static_cast<DataType>(99), ReduceOp::kSum),
      "unknown data type 99");
  ExpectInvalid(
      c->all_reduce(x, x, 2, DataType::kFloat32, static_cast<ReduceOp>(42)),
      "unknown reduce op 42");
}

TEST(CommunicatorChecks, CountsAboveTheBackendLimit) {
  auto c = std::make_shared<Recording>(0, 4, /*max_count=*/100);
  std::vector<float> x(1000);
  ExpectInvalid(c->all_reduce(x.data(), x.data(), 101, DataType::kFloat32,
                              ReduceOp::kSum),
                "the send buffer of 101 elements is above the recording "
                "backend's limit of 100");
  // size() * count past the limit, refused before the product is formed.
  ExpectInvalid(c->all_gather(x.data(), x.data() + 500, 26, DataType::kFloat32),
                "the recv buffer of 4 x 26 elements is above");
  const size_t huge = static_cast<size_t>(-1) / 2;
  ExpectInvalid(
      c->all_to_all(x.data(), x.data() + 500, huge, DataType::kFloat32),
      "is above the recording backend's limit");
}

TEST(CommunicatorChecks, UnevenCountLists) {
  auto c = Group(/*rank=*/1);
  std::vector<float> send(10), recv(10);
  const std::vector<size_t> three = {1, 2, 3};
  ExpectInvalid(
      c->all_gather_v(send.data(), recv.data(), three, DataType::kFloat32),
      "all_gather_v: recv_counts has 3 entries: expected one per rank "
      "of the group (4)");
  const std::vector<size_t> counts = {1, 0, 3, 2};
  ASSERT_TRUE(
      c->all_gather_v(send.data(), recv.data(), counts, DataType::kFloat32)
          .ok());
  EXPECT_EQ(c->last->kind, OpKind::kAllGatherV);
  EXPECT_EQ(c->last->count, 0u) << "rank 1 sends recv_counts[1]";
  EXPECT_EQ(c->last->recv_counts, counts);
  ExpectInvalid(c->all_to_all_v(send.data(), three, recv.data(), counts,
                                DataType::kFloat32),
                "all_to_all_v: send_counts has 3 entries");
  // The typed form checks the span lengths against the sums.
  ExpectInvalid(c->all_to_all_v(absl::MakeConstSpan(send), counts,
                                absl::MakeSpan(recv).subspan(0, 5), counts),
                "all_to_all_v: the send buffer has 10 elements: expected the "
                "sum of its counts, 6");
  ExpectInvalid(c->all_to_all(absl::MakeConstSpan(send), absl::MakeSpan(recv)),
                "all_to_all: send has 10 and recv 10 elements: expected the "
                "same length, a multiple of the group size 4");
}

TEST(CommunicatorChecks, RootOnlyBuffersAreCheckedAtTheRootOnly) {
  auto c = Group(/*rank=*/2);
  float x[4] = {};
  // Not the root: the gather's recv buffer may be null.
  EXPECT_TRUE(c->gather(x, nullptr, 4, DataType::kFloat32, 0).ok());
  EXPECT_TRUE(c->scatter(nullptr, x, 1, DataType::kFloat32, 3).ok());
  ExpectInvalid(c->gather(x, nullptr, 1, DataType::kFloat32, 2),
                "gather: the recv buffer is null for 4 elements");
}

TEST(CommunicatorChecks, GlobalRanksTranslate) {
  auto c = Group(/*rank=*/0, /*size=*/3);  // global ranks 10, 20, 30
  EXPECT_EQ(*c->group_rank(30), 2);
  EXPECT_EQ(*c->group_rank(10), 0);
  absl::StatusOr<int> missing = c->group_rank(25);
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("global rank 25 is not a member of this group of 3 "
                        "ranks (global ranks 10, 20, 30)"));
  float x[2] = {};
  ASSERT_TRUE(c->send(x, 2, DataType::kFloat32, GlobalRank(20)).ok());
  ASSERT_EQ(c->last->p2p.size(), 1u);
  EXPECT_EQ(c->last->p2p[0].peer, 1);
  EXPECT_EQ(c->last->p2p[0].kind, P2POp::Kind::kSend);
  absl::Status s = c->recv(x, 2, DataType::kFloat32, GlobalRank(40));
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("recv: global rank 40"));
  auto w = c->irecv(absl::MakeSpan(x), 0);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->name(), "irecv of 2 float32 from rank 0");
}

TEST(CommunicatorWork, StatusBeforeAndAfterCompletion) {
  auto c = Group();
  c->finish->store(false);
  float x[2] = {};
  auto w = c->iall_reduce(absl::MakeSpan(x), ReduceOp::kMax);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_FALSE((*w)->test());
  EXPECT_FALSE((*w)->is_completed());
  EXPECT_TRUE(absl::IsFailedPrecondition((*w)->status()));
  EXPECT_THAT(std::string((*w)->status().message()),
              HasSubstr("still running"));
  c->finish->store(true);
  EXPECT_TRUE((*w)->test());
  EXPECT_TRUE((*w)->status().ok());
  EXPECT_TRUE((*w)->wait().ok()) << "a finished work waits at once";
}

TEST(CommunicatorWork, DeadlineAbortsTheCommunicator) {
  auto c = Group();
  c->finish->store(false);
  c->set_timeout(absl::Milliseconds(50));
  float x[2] = {};
  const absl::Time start = absl::Now();
  absl::Status s = c->all_reduce(absl::MakeSpan(x), ReduceOp::kSum);
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("all_reduce of 2 float32 on a recording communicator "
                        "did not finish within"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(c->aborted());
  EXPECT_EQ(c->aborts, 1);
  // Every later operation: Aborted, naming the first reason.
  absl::Status later = c->barrier();
  EXPECT_TRUE(absl::IsAborted(later)) << later;
  EXPECT_THAT(std::string(later.message()), HasSubstr("did not finish within"));
  EXPECT_EQ(c->started, 1) << "an aborted communicator starts nothing";
}

TEST(CommunicatorWork, AbortFromAnotherThreadReleasesAWait) {
  auto c = Group();
  c->finish->store(false);
  float x[2] = {};
  auto w = c->irecv(absl::MakeSpan(x), 3);
  ASSERT_TRUE(w.ok());
  absl::Notification waiting;
  std::thread aborter([&] {
    waiting.WaitForNotification();
    absl::SleepFor(absl::Milliseconds(20));
    c->abort("the test stopped it");
  });
  waiting.Notify();
  const absl::Time start = absl::Now();
  absl::Status s = (*w)->wait(absl::Now() + absl::Seconds(60));
  aborter.join();
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("the test stopped it"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  // A second abort keeps the first reason and calls the backend once.
  c->abort("again");
  EXPECT_EQ(c->aborts, 1);
  EXPECT_THAT(std::string(c->AbortedError("x").message()),
              HasSubstr("the test stopped it"));
}

TEST(CommunicatorWork, AWorkKeepsItsCommunicatorAlive) {
  const int64_t before = LiveCommunicatorCount();
  std::shared_ptr<Work> work;
  {
    auto c = Group();
    work = *c->ibarrier();
  }
  EXPECT_EQ(LiveCommunicatorCount(), before + 1);
  EXPECT_TRUE(work->wait().ok());
  work.reset();
  EXPECT_EQ(LiveCommunicatorCount(), before);
}

// binary16 rounding computed another way: the value's spacing on the fp16
// grid (2^(e-10), subnormals 2^-24), rounded to nearest even by nearbyint.
double Float16Reference(float f) {
  const double magnitude = std::fabs(double{f});
  if (magnitude >= 65520.0) return std::copysign(INFINITY, f);
  const int e = std::max(magnitude == 0 ? -14 : std::ilogb(magnitude), -14);
  const double spacing = std::ldexp(1.0, e - 10);
  return std::copysign(std::nearbyint(magnitude / spacing) * spacing, f);
}

TEST(HalfPrecision, Float16RoundsToNearestEven) {
  // Every binary16 value converts to float and back unchanged...
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float f = Float16BitsToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Float16BitsToFloat(FloatToFloat16Bits(f))));
      continue;
    }
    ASSERT_EQ(FloatToFloat16Bits(f), bits) << f;
    if (std::isfinite(f)) {
      ASSERT_EQ(double{f}, Float16Reference(f));
    }
  }
  EXPECT_EQ(Float16BitsToFloat(0x3c00), 1.0f);
  EXPECT_EQ(Float16BitsToFloat(0x0001), 0x1p-24f) << "smallest subnormal";
  EXPECT_EQ(Float16BitsToFloat(0x7bff), 65504.0f) << "largest finite";
  // ...and floats round to the nearest, ties to even.
  uint32_t x = 12345;
  for (int i = 0; i < 200000; ++i) {
    x = x * 1664525u + 1013904223u;
    float f;
    std::memcpy(&f, &x, sizeof(f));
    if (!std::isfinite(f)) continue;
    // Spread the exponents over fp16's range as well as float's.
    int exponent = 0;
    if (i % 2 == 0) {
      f = std::ldexp(std::frexp(f, &exponent), static_cast<int>(x % 44) - 26);
    }
    ASSERT_EQ(double{Float16BitsToFloat(FloatToFloat16Bits(f))},
              Float16Reference(f))
        << f;
  }
}

TEST(HalfPrecision, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f)), 1.0f);
  EXPECT_EQ(static_cast<float>(BFloat16(-3.5f)), -3.5f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even one (1).
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f + 0x1p-8f)), 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6.
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f + 0x1p-8f + 0x1p-20f)),
            1.0f + 0x1p-7f);
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(std::nanf("")))));
  EXPECT_TRUE(std::isinf(static_cast<float>(BFloat16(3.4e38f))))
      << "the largest floats round up past bf16's largest finite value";
  // Against an exact reference: the nearer of the two neighbours.
  uint32_t x = 777;
  for (int i = 0; i < 200000; ++i) {
    x = x * 1664525u + 1013904223u;
    float f;
    std::memcpy(&f, &x, sizeof(f));
    if (!std::isfinite(f) || std::fabs(f) > 3e38f) continue;
    const uint16_t lo = static_cast<uint16_t>(x >> 16);
    const uint16_t hi = static_cast<uint16_t>(lo + 1);
    const double dl = std::fabs(double{BFloat16BitsToFloat(lo)} - f);
    const double dh = std::fabs(double{BFloat16BitsToFloat(hi)} - f);
    const uint16_t expected = dl < dh   ? lo
                              : dh < dl ? hi
                                        : ((lo & 1) ? hi : lo);
    ASSERT_EQ(FloatToBFloat16Bits(f), expected) << f;
  }
}

}  // namespace
}  // namespace vemesh
