// The communicator conformance suite: every case is written once
// (conformance_test.cc) against the public Communicator API and runs on
// every backend, as Gloo's tests are written once for every transport. A
// backend joins by giving a CommHarness (how to make a world of n ranks and
// the memory its operations take) and instantiating the suite:
//
//   class GlooHarness : public ThreadRanksHarness { ... };
//   INSTANTIATE_TEST_SUITE_P(Gloo, Conformance,
//                            ConformanceParams(std::make_shared<GlooHarness>()),
//                            ConformanceName);
//
// Each case then runs once per group size the harness lists: Gloo and the
// fake NCCL make their ranks threads of one process, MPI runs each case on
// the job's world (one ctest entry per mpiexec -np). A case a backend cannot
// run says why with GTEST_SKIP; it never passes silently.

#ifndef TESTS_COMM_CONFORMANCE_CONFORMANCE_H_
#define TESTS_COMM_CONFORMANCE_CONFORMANCE_H_

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "vemesh/comm/communicator.h"

namespace vemesh::testing {

// What one rank runs, with its own communicator of the world (which the
// harness no longer holds: dropping it frees it).
using RankBody = std::function<void(std::shared_ptr<Communicator>)>;

class CommHarness {
 public:
  virtual ~CommHarness() = default;

  // What the communicators' backend() answers: "mpi", "gloo", "nccl".
  virtual std::string backend() const = 0;
  // The group sizes the cases run on; 0 stands for the job's world, whose
  // size the launcher decides (MPI).
  virtual std::vector<int> Sizes() const = 0;
  // Around every case: install a fake, check that it was left clean.
  virtual void SetUp() {}
  virtual void TearDown() {}
  // Runs `body` on every rank of a fresh world of `n` ranks and returns
  // when all are done.
  virtual void OnRanks(int n, const RankBody& body) = 0;
  // The global ranks of the members of a world of `n`, by group rank.
  virtual std::vector<int> GlobalRanks(int n) const = 0;

  // Memory the operations take: host memory by default; device memory for
  // NCCL. Thread-safe.
  virtual void* Alloc(size_t bytes) { return std::malloc(bytes); }
  virtual void Free(void* p) { std::free(p); }
  virtual void CopyIn(void* to, const void* from, size_t bytes) {
    std::memcpy(to, from, bytes);
  }
  virtual void CopyOut(void* to, const void* from, size_t bytes) {
    std::memcpy(to, from, bytes);
  }

  // Whether a receive from oneself that nothing was sent for blocks (until
  // a deadline or abort), as a receive from any other rank does. Gloo
  // refuses it at once (FailedPrecondition) instead.
  virtual bool SelfRecvBlocks() const { return true; }
  // Whether an isend may run ahead of a blocking recv issued after it on
  // the same communicator (a ring of isend-then-recv). Gloo runs a
  // communicator's operations in issue order, and a send ends only once its
  // receive is posted.
  virtual bool SendRunsAheadOfRecv() const { return true; }
  // Collective over `comm`, after its rank 0 abandoned (by abort or
  // deadline) one receive of 4 int32 from its last rank, which nobody
  // sent: lets the backend forget it. MPI cannot cancel a posted receive,
  // so its harness sends the message with plain MPI.
  virtual void SettleAbandonedRecv(Communicator& comm) {}
};

// A buffer of `T` in the harness's memory, filled from the host and read
// back to it.
template <typename T>
class Buffer {
 public:
  Buffer(CommHarness& h, const std::vector<T>& values)
      : h_(&h), size_(values.size()) {
    if (size_ == 0) return;  // a null buffer of no elements
    data_ = static_cast<T*>(h.Alloc(size_ * sizeof(T)));
    h.CopyIn(data_, values.data(), size_ * sizeof(T));
  }
  Buffer(CommHarness& h, size_t n, T fill)
      : Buffer(h, std::vector<T>(n, fill)) {}
  Buffer(Buffer&& other) noexcept
      : h_(other.h_),
        data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (data_ != nullptr) h_->Free(data_);
  }

  T* data() const { return data_; }
  size_t size() const { return size_; }
  absl::Span<T> span() const { return absl::MakeSpan(data_, size_); }
  absl::Span<const T> cspan() const {
    return absl::MakeConstSpan(data_, size_);
  }
  std::vector<T> Read() const {
    std::vector<T> out(size_);
    if (size_ > 0) h_->CopyOut(out.data(), data_, size_ * sizeof(T));
    return out;
  }

 private:
  CommHarness* h_;
  T* data_ = nullptr;
  size_t size_ = 0;
};

// One instantiation of the suite: a backend and a group size.
struct ConformanceParam {
  std::shared_ptr<CommHarness> harness;
  int n = 0;
};

// Every size the harness lists.
inline std::vector<ConformanceParam> ConformanceParamsOf(
    std::shared_ptr<CommHarness> harness) {
  std::vector<ConformanceParam> out;
  for (int n : harness->Sizes()) out.push_back({harness, n});
  return out;
}
#define ConformanceParams(harness) \
  ::testing::ValuesIn(::vemesh::testing::ConformanceParamsOf(harness))

// "n4", or "world" for the job's world.
inline std::string ConformanceName(
    const ::testing::TestParamInfo<ConformanceParam>& info) {
  return info.param.n == 0 ? std::string("world")
                           : absl::StrCat("n", info.param.n);
}

class Conformance : public ::testing::TestWithParam<ConformanceParam> {
 protected:
  void SetUp() override { h().SetUp(); }
  void TearDown() override { h().TearDown(); }

  CommHarness& h() const { return *GetParam().harness; }
  // The size asked for (0: the job's world).
  int n() const { return GetParam().n; }
  void OnRanks(const RankBody& body) { h().OnRanks(n(), body); }
};

}  // namespace vemesh::testing

#endif  // TESTS_COMM_CONFORMANCE_CONFORMANCE_H_
